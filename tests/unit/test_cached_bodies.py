"""What the operator keeps of each TPUJob and TPUSlice it caches (``reconcile/cached.snapshot``):
the body it reconciles from, without the parts that only make it larger."""

from __future__ import annotations

import json

import pytest

from tpu_operator.reconcile import cached as controllers
from tpu_operator.state.views import shared_copy

pytestmark = pytest.mark.unit


def applied_job() -> dict:
    spec = {"slice": {"type": "v5litepod-16"}, "template": {"spec": {"containers": []}}}
    manifest = {"apiVersion": "tpu-operator.dev/v1alpha1", "kind": "TPUJob", "spec": spec}
    return {
        **manifest,
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "u1",
            "annotations": {
                controllers.LAST_APPLIED: json.dumps(manifest),
                "team": "research",
            },
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Running"}]},
    }


def test_a_cached_body_drops_managed_fields_and_kubectls_copy_and_keeps_the_rest():
    raw = applied_job()
    cached = controllers.snapshot(raw)
    assert "managedFields" not in cached["metadata"]
    assert cached["metadata"]["annotations"] == {"team": "research"}
    assert cached["spec"] == raw["spec"]
    assert cached["status"] == raw["status"]
    assert cached["metadata"]["uid"] == "u1"


def test_a_cached_body_is_a_copy():
    raw = applied_job()
    cached = controllers.snapshot(raw)
    cached["status"]["conditions"].append({"type": "Stalled"})
    cached["metadata"]["annotations"]["team"] = "other"
    assert raw["status"]["conditions"] == [{"type": "Running"}]
    assert raw["metadata"]["annotations"]["team"] == "research"
    assert controllers.LAST_APPLIED in raw["metadata"]["annotations"]


def test_cached_bodies_decoded_apart_share_their_strings():
    # Each body comes from its own decode, as two watch events do: equal text, two objects.
    first, second = (json.loads(json.dumps(applied_job())) for _ in range(2))
    assert first["status"]["phase"] is not second["status"]["phase"]
    a, b = (controllers.snapshot(raw) for raw in (first, second))
    assert a == b
    assert a["status"]["phase"] is b["status"]["phase"]
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    condition_a, condition_b = a["status"]["conditions"][0], b["status"]["conditions"][0]
    assert next(iter(condition_a)) is next(iter(condition_b)), "keys are shared too"
    assert condition_a["type"] is condition_b["type"]


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**80, "f": 1.5, "t": True, "none": None, "s": "x", "l": [1, "y", {"z": []}]},
        [],
        "text",
        7,
    ],
)
def test_a_shared_copy_is_equal_and_shares_no_container(value):
    copied = shared_copy(value)
    assert copied == value
    if isinstance(value, dict):
        assert copied is not value and copied["l"] is not value["l"]
        assert copied["l"][2] is not value["l"][2]
        assert copied["n"] == 2**80 and type(copied["n"]) is int
