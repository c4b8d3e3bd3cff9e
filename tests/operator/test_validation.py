"""`kubectl apply` rejects invalid TPUJobs and TPUSlices with a message naming the field.

Every case goes through the real apiserver (schema, defaulting, CEL) with kubectl's
default strict field validation; nothing is created.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytestmark = pytest.mark.integration

VALID: dict[str, Any] = {
    "apiVersion": "tpu-operator.dev/v1alpha1",
    "kind": "TPUJob",
    "metadata": {"name": "valid"},
    "spec": {
        "slice": {"type": "v5p-16"},
        "numSlices": 2,
        "template": {
            "spec": {"containers": [{"name": "worker", "image": "x", "command": ["true"]}]}
        },
    },
}


def edit(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``base`` with the dotted ``path`` set (``value`` DELETE removes it)."""
    manifest = copy.deepcopy(base or VALID)
    node = manifest
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    last = keys[-1]
    if value == "DELETE":
        del node[last]
    else:
        node[last] = value
    return manifest


def container(**fields: Any) -> list[dict[str, Any]]:
    return [{"name": "worker", "image": "x", **fields}]


CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "topology not valid for the accelerator",
        edit("spec.slice", {"accelerator": "tpu-v5p-slice", "topology": "4x4x3"}),
        ["spec.slice.topology", "4x4x3 is not valid for tpu-v5p-slice", "valid: 2x2x1, 2x2x2"],
    ),
    (
        "a 3-D topology on a 2-D generation",
        edit("spec.slice", {"accelerator": "tpu-v5-lite-podslice", "topology": "2x2x2"}),
        ["2x2x2 is not valid for tpu-v5-lite-podslice", "1x1, 2x2, 2x4, 4x4"],
    ),
    (
        "unknown short type",
        edit("spec.slice", {"type": "v5p-100"}),
        ["spec.slice.type", "v5p-100 is not a known TPU type", "v5p-128 (4x4x4)"],
    ),
    (
        "type and accelerator together",
        edit("spec.slice", {"type": "v5p-16", "accelerator": "tpu-v5p-slice", "topology": "2x2x2"}),
        ["set either type", "not both"],
    ),
    ("no shape at all", edit("spec.slice", {}), ["set either type"]),
    (
        "dynamic slicing on another generation",
        edit(
            "spec.slice",
            {"accelerator": "tpu-v5p-slice", "topology": "4x4x4", "dynamicSlicing": "SuperSlice"},
        ),
        ["spec.slice.dynamicSlicing", "needs accelerator: tpu7x"],
    ),
    (
        "dynamic slicing with a short type",
        edit("spec.slice", {"type": "tpu7x-128", "dynamicSlicing": "SuperSlice"}),
        ["spec.slice.dynamicSlicing", "needs accelerator: tpu7x with a topology"],
    ),
    (
        "a sub-slice larger than a cube's parts",
        edit(
            "spec.slice",
            {"accelerator": "tpu7x", "topology": "4x4x8", "dynamicSlicing": "SubSlice"},
        ),
        ["spec.slice.topology", "2x2x1, 2x2x2, 2x2x4, 2x4x4, not 4x4x8"],
    ),
    (
        "a super-slice smaller than a cube",
        edit(
            "spec.slice",
            {"accelerator": "tpu7x", "topology": "2x2x4", "dynamicSlicing": "SuperSlice"},
        ),
        ["spec.slice.topology", "whole 4x4x4 cubes", "not 2x2x4"],
    ),
    (
        "an unknown kind of dynamic slicing",
        edit(
            "spec.slice",
            {"accelerator": "tpu7x", "topology": "4x4x4", "dynamicSlicing": "Super"},
        ),
        ["spec.slice.dynamicSlicing", "Unsupported value", "SuperSlice", "SubSlice"],
    ),
    (
        "accelerator without topology",
        edit("spec.slice", {"accelerator": "tpu-v6e-slice"}),
        ["accelerator and topology go together"],
    ),
    (
        "unknown accelerator",
        edit("spec.slice", {"accelerator": "tpu-v9", "topology": "2x2"}),
        ["spec.slice.accelerator", "Unsupported value", "tpu-v5p-slice"],
    ),
    (
        "multislice on a single-host shape",
        edit("spec.slice", {"type": "v5litepod-4"}),
        ["spec.numSlices", "multislice jobs need multi-host slices", "v5litepod-4"],
    ),
    ("zero slices", edit("spec.numSlices", 0), ["spec.numSlices", "greater than or equal to 1"]),
    (
        "name too long for pod hostnames",
        edit("metadata.name", "a" * 60),
        ["metadata.name is too long", "63 characters"],
    ),
    (
        "name that is not a DNS label",
        edit("metadata.name", "9lives"),
        ["metadata.name", "must be a DNS label"],
    ),
    (
        "no container named worker",
        edit("spec.template.spec.containers", [{"name": "trainer", "image": "x"}]),
        ["spec.template.spec.containers", 'one container must be named "worker"'],
    ),
    (
        "per-pod identity env in the template",
        edit(
            "spec.template.spec.containers",
            container(env=[{"name": "TPU_WORKER_ID", "value": "0"}]),
        ),
        ["TPU_WORKER_ID", "set by the operator"],
    ),
    (
        "a restartPolicy other than Never",
        edit("spec.template.spec.restartPolicy", "OnFailure"),
        ["restartPolicy", "Never"],
    ),
    ("no containers", edit("spec.template.spec.containers", []), ["should have at least 1"]),
    (
        "negative maxRestarts",
        edit("spec.failurePolicy", {"maxRestarts": -1}),
        ["spec.failurePolicy.maxRestarts", "greater than or equal to 0"],
    ),
    (
        "non-positive activeDeadlineSeconds",
        edit("spec.activeDeadlineSeconds", 0),
        ["spec.activeDeadlineSeconds", "greater than or equal to 1"],
    ),
    (
        "negative ttlSecondsAfterFinished",
        edit("spec.ttlSecondsAfterFinished", -5),
        ["spec.ttlSecondsAfterFinished", "greater than or equal to 0"],
    ),
    (
        "exit code rule for code 0",
        edit("spec.failurePolicy", {"rules": [{"action": "FailJob", "values": [0]}]}),
        ["spec.failurePolicy.rules[0].values[0]", "greater than or equal to 1"],
    ),
    (
        "unknown exit code action",
        edit("spec.failurePolicy", {"rules": [{"action": "Ignore", "values": [3]}]}),
        ["spec.failurePolicy.rules[0].action", "Unsupported value", "RestartNotCounted"],
    ),
    (
        "chipsPerHost where the topology fits one machine type",
        edit("spec.slice", {"type": "v5p-16", "chipsPerHost": 8}),
        ["spec.slice.chipsPerHost", "only chooses the machine type"],
    ),
    (
        "metrics port reserved by libtpu",
        edit("spec.ports", {"metrics": 8476}),
        ["spec.ports.metrics", "reserved"],
    ),
    (
        "TPU_PROCESS_ADDRESSES in the template",
        edit(
            "spec.template.spec.containers",
            container(env=[{"name": "TPU_PROCESS_ADDRESSES", "value": "a:8471"}]),
        ),
        ["TPU_PROCESS_ADDRESSES", "set by the operator"],
    ),
    (
        "coordinator port of libtpu",
        edit("spec.ports", {"coordinator": 8471}),
        ["spec.ports.coordinator", "libtpu's (8431-8438, 8471, 8476)"],
    ),
    (
        "a template port named metrics on a libtpu port",
        edit(
            "spec.template.spec.containers",
            container(ports=[{"name": "metrics", "containerPort": 8431}]),
        ),
        ["containers[].ports", "a port named coordinator or metrics", "8431-8438"],
    ),
    (
        "two ports the same",
        edit("spec.ports", {"coordinator": 9431, "metrics": 9431}),
        ["three different ports"],
    ),
    (
        "node pool pins that do not match numSlices",
        edit("spec.placement", {"nodePools": ["only-one"]}),
        ["spec.placement.nodePools", "one node pool per slice"],
    ),
    (
        "spare pools that name none",
        edit("spec.placement", {"spares": {}}),
        ["spec.placement.spares", "name the spare node pools (nodePools), select them by label"],
    ),
    (
        "spare pools of a job that pins its pools",
        edit("spec.placement", {"nodePools": ["a", "b"], "spares": {"nodePools": ["c"]}}),
        ["spec.placement.spares", "a job that pins its node pools"],
    ),
    (
        "a spare selector with a key that is no label key",
        edit("spec.placement", {"spares": {"selector": {"matchLabels": {"not a key": "x"}}}}),
        ["spec.placement.spares.selector.matchLabels", "every key must be a label key"],
    ),
    (
        "a spare selector that selects nothing",
        edit("spec.placement", {"spares": {"selector": {"matchLabels": {}}}}),
        ["spec.placement.spares.selector.matchLabels", "should have at least 1 properties"],
    ),
    (
        "an elastic job that needs more slices than it has",
        edit("spec.elastic", {"minSlices": 3}),
        ["spec.elastic.minSlices", "1 to numSlices"],
    ),
    (
        "an elastic job that trains on no slice",
        edit("spec.elastic", {"minSlices": 0}),
        ["spec.elastic.minSlices", "greater than or equal to 1"],
    ),
    (
        "unknown success policy",
        edit("spec.successPolicy", "AnyWorker"),
        ["spec.successPolicy", "Unsupported value", "LeaderWorker"],
    ),
    (
        "a misspelled field",
        edit("spec.numSlice", 2),
        ['unknown field "spec.numSlice"'],
    ),
    (
        "resources that is not an object",
        edit("spec.template.spec.containers", container(resources="1")),
        ["spec.template.spec.containers[0].resources", "must be of type object"],
    ),
    (
        "resources.requests that is not an object",
        edit("spec.template.spec.containers", container(resources={"requests": "1"})),
        ["spec.template.spec.containers[0].resources.requests", "must be of type object"],
    ),
    (
        "a resource quantity that is not a quantity",
        edit("spec.template.spec.containers", container(resources={"limits": {"cpu": "two"}})),
        ["spec.template.spec.containers[0].resources.limits.cpu", "should match"],
    ),
    (
        "env that is not a list",
        edit("spec.template.spec.containers", container(env="FOO=1")),
        ["spec.template.spec.containers[0].env", "must be of type array"],
    ),
    (
        "a container port out of range",
        edit("spec.template.spec.containers", container(ports=[{"containerPort": 70000}])),
        ["spec.template.spec.containers[0].ports[0].containerPort", "less than or equal to 65535"],
    ),
    (
        "a template node selector value that is not a string",
        edit("spec.template.spec.nodeSelector", {"disktype": 5}),
        ["spec.template.spec.nodeSelector.disktype", "must be of type string"],
    ),
    (
        "template tolerations that are not a list",
        edit("spec.template.spec.tolerations", "all"),
        ["spec.template.spec.tolerations", "must be of type array"],
    ),
    (
        "a template affinity that is not an object",
        edit("spec.template.spec.affinity", {"nodeAffinity": "spot"}),
        ["spec.template.spec.affinity.nodeAffinity", "must be of type object"],
    ),
    (
        "hostNetwork that is not a boolean",
        edit("spec.template.spec.hostNetwork", "yes"),
        ["spec.template.spec.hostNetwork", "must be of type boolean"],
    ),
    (
        "an activeDeadlineSeconds too large to be a date",
        edit("spec.activeDeadlineSeconds", 10**12),
        ["spec.activeDeadlineSeconds", "less than or equal to 2147483647"],
    ),
    (
        "a ttlSecondsAfterFinished too large to be a date",
        edit("spec.ttlSecondsAfterFinished", 2**63 - 1),
        ["spec.ttlSecondsAfterFinished", "less than or equal to 2147483647"],
    ),
    (
        "a placement node selector key that is not a label key",
        edit("spec.placement", {"nodeSelector": {"bad key!": "x"}}),
        ["spec.placement.nodeSelector", "every key must be a label key"],
    ),
    (
        "a reservation that is not a label value",
        edit("spec.placement", {"reservation": "my reservation"}),
        ["spec.placement.reservation", "should match"],
    ),
    (
        "a maximum run duration without a capacity mode",
        edit("spec.placement", {"maxRunDurationSeconds": 3600}),
        ["spec.placement.maxRunDurationSeconds", "applies to flex-start VMs only"],
    ),
    (
        "a maximum run duration beyond seven days",
        edit("spec.placement", {"capacity": "FlexStart", "maxRunDurationSeconds": 604801}),
        ["spec.placement.maxRunDurationSeconds", "604800"],
    ),
    (
        "flex-start capacity on Spot VMs",
        edit("spec.placement", {"capacity": "FlexStart", "spot": True}),
        ["spec.placement.capacity", "flex-start VMs are not Spot VMs"],
    ),
    (
        "queued provisioning from a reservation",
        edit("spec.placement", {"capacity": "QueuedProvisioning", "reservation": "r"}),
        ["spec.placement.capacity", "do not come from a reservation"],
    ),
    (
        "an unknown capacity mode",
        edit("spec.placement", {"capacity": "Calendar"}),
        ["spec.placement.capacity", "FlexStart", "QueuedProvisioning"],
    ),
    (
        "a fallback step of flex-start capacity on Spot VMs",
        edit(
            "spec.placement",
            {"fallbacks": [{"afterSeconds": 60, "capacity": "FlexStart", "spot": True}]},
        ),
        ["spec.placement.fallbacks[0].capacity", "flex-start VMs are not Spot VMs"],
    ),
    (
        "a fallback step with a maximum run duration and no capacity mode",
        edit("spec.placement", {"fallbacks": [{"afterSeconds": 60, "maxRunDurationSeconds": 60}]}),
        ["spec.placement.fallbacks[0].maxRunDurationSeconds", "flex-start VMs only"],
    ),
    (
        "a standalone TPUSlice whose Service name is not a DNS label",
        {
            "apiVersion": "tpu-operator.dev/v1alpha1",
            "kind": "TPUSlice",
            "metadata": {"name": "lonely"},
            "spec": {"type": "v5p-16", "service": "Bad!", "template": VALID["spec"]["template"]},
        },
        ["spec.service", "should match"],
    ),
    (
        "a TPUSlice whose sliceIndex is not below numSlices",
        {
            "apiVersion": "tpu-operator.dev/v1alpha1",
            "kind": "TPUSlice",
            "metadata": {"name": "lonely"},
            "spec": {
                "type": "v5p-16",
                "sliceIndex": 3,
                "numSlices": 2,
                "template": VALID["spec"]["template"],
            },
        },
        ["spec.sliceIndex", "less than numSlices"],
    ),
    (
        "a standalone TPUSlice with an invalid topology",
        {
            "apiVersion": "tpu-operator.dev/v1alpha1",
            "kind": "TPUSlice",
            "metadata": {"name": "lonely"},
            "spec": {
                "accelerator": "tpu-v6e-slice",
                "topology": "3x3",
                "template": VALID["spec"]["template"],
            },
        },
        ["spec.topology", "3x3 is not valid for tpu-v6e-slice"],
    ),
]


def test_the_valid_base_is_accepted(cluster, crds, namespace):
    manifest = edit("metadata.namespace", namespace)
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest))
    assert "created (server dry run)" in result.stdout


@pytest.mark.parametrize(("case", "manifest", "expected"), CASES, ids=[c[0] for c in CASES])
def test_invalid_manifest_is_rejected(cluster, crds, namespace, case, manifest, expected):
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["namespace"] = namespace
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{case}: accepted, but should be rejected"
    for fragment in expected:
        assert fragment in result.stderr, f"{case}: {fragment!r} not in: {result.stderr}"
    listed = cluster.kubectl("get", "tpujobs,tpuslices", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == ""
