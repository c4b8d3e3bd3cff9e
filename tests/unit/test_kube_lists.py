"""Metadata-only list pages decoded into the fields the operator keeps
(``runtime/kube.listed_metadata``): the same fields a full decode would give, managed
fields and everything else left out."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from tpu_operator.runtime.kube import LISTED_FIELDS, listed_metadata

pytestmark = pytest.mark.unit

OWNER = {
    "apiVersion": "tpu-operator.dev/v1alpha1",
    "kind": "TPUJob",
    "name": "big",
    "uid": "u-job",
    "controller": True,
    "blockOwnerDeletion": True,
}
MANAGED = [
    {
        "manager": "tpu-operator",
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {".": {}, "f:phase": {}, "f:shape": {"f:hosts": {}}}},
        "subresource": "status",
    }
]
SLICE = {
    "name": "big-0",
    "namespace": "ml",
    "uid": "u-0",
    "resourceVersion": "41",
    "generation": 3,
    "creationTimestamp": "2026-11-25T18:07:10Z",
    "labels": {"tpu-operator.dev/job-name": "big"},
    "annotations": {"note": "x" * 100},
    "ownerReferences": [OWNER],
    "managedFields": MANAGED,
}


def page(metas: list[dict[str, Any] | None], token: str | None = None) -> bytes:
    items = [
        {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
        | ({"metadata": m} if m is not None else {})
        for m in metas
    ]
    meta: dict[str, Any] = {"resourceVersion": "99"}
    if token is not None:
        meta["continue"] = token
    return json.dumps(
        {
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": items,
        }
    ).encode()


def picked(raw: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The fields kept, read from the whole decoded page (what the typed decode must
    equal)."""
    whole = json.loads(raw)
    items = [
        {k: v for k, v in (item.get("metadata") or {}).items() if k in LISTED_FIELDS}
        for item in whole.get("items") or []
    ]
    return items, (whole.get("metadata") or {}).get("continue") or None


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(page([]), id="empty"),
        pytest.param(page([SLICE]), id="a slice: managed fields and annotations left out"),
        pytest.param(page([{"name": "svc", "uid": "u-1"}], token="abc"), id="next page"),
        pytest.param(page([SLICE, {"name": "n", "uid": "u"}], token=""), id="last page"),
        pytest.param(page([None]), id="an item without metadata"),
        pytest.param(b'{"items": null}', id="no items, no list metadata"),
    ],
)
def test_a_page_keeps_the_listed_fields_and_the_next_token(raw: bytes) -> None:
    assert listed_metadata(raw) == picked(raw)


def test_a_slice_keeps_its_identity_labels_and_owner() -> None:
    (item,), token = listed_metadata(page([SLICE], token="next"))
    assert item == {
        "name": "big-0",
        "namespace": "ml",
        "uid": "u-0",
        "labels": {"tpu-operator.dev/job-name": "big"},
        "ownerReferences": [OWNER],
    }
    assert token == "next"


def test_a_page_that_is_not_json_raises_a_value_error() -> None:
    with pytest.raises(ValueError):
        listed_metadata(b"<html>proxy error</html>")
    with pytest.raises(msgspec.ValidationError):
        listed_metadata(b'{"items": [{"metadata": {"labels": ["not", "a", "map"]}}]}')
