"""What the operator keeps of each TPUJob and TPUSlice it caches (``controllers._snapshot``):
the body it reconciles from, without the parts that only make it larger."""

from __future__ import annotations

import json

import kopf
import pytest

from tpu_operator import controllers

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
    cached = controllers._snapshot(kopf.Body(raw))
    assert "managedFields" not in cached["metadata"]
    assert cached["metadata"]["annotations"] == {"team": "research"}
    assert cached["spec"] == raw["spec"]
    assert cached["status"] == raw["status"]
    assert cached["metadata"]["uid"] == "u1"


def test_a_cached_body_is_a_copy():
    raw = applied_job()
    cached = controllers._snapshot(kopf.Body(raw))
    cached["status"]["conditions"].append({"type": "Stalled"})
    cached["metadata"]["annotations"]["team"] = "other"
    assert raw["status"]["conditions"] == [{"type": "Running"}]
    assert raw["metadata"]["annotations"]["team"] == "research"
    assert controllers.LAST_APPLIED in raw["metadata"]["annotations"]
