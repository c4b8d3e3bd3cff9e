"""Flex-start and queued provisioning (placement/capacity.py): what the pods carry per mode,
the ProvisioningRequest of the direct path, how a request's conditions read, where the
slices' pools come from, and what the Kueue Workload asks for."""

from __future__ import annotations

import pytest

from tpu_operator import catalog, contract
from tpu_operator.api.policy import Placement
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.builders.workload import build_workload
from tpu_operator.placement.capacity import (
    KUEUE_MAX_RUN_DURATION,
    CapacityMode,
    request_name,
    request_objects,
    request_state,
)
from tpu_operator.placement.pools import PoolView, allocate, requests_for

pytestmark = pytest.mark.unit

SHAPE = catalog.from_short_type("v6e-16")
OWNER = Owner(contract.API_VERSION, contract.SLICE_KIND, "train-0", "uid-1")
TEMPLATE = {
    "metadata": {"annotations": {"note": "x"}},
    "spec": {"containers": [{"name": "worker", "image": "example.com/train:1"}]},
}


def pod(capacity: CapacityMode, slice_pool: str | None = "train-0-abc") -> dict:
    wiring = PodWiring(
        job_name="train",
        service="train",
        slice_name="train-0",
        shape=SHAPE,
        num_slices=1,
        slice_index=0,
        worker_index=0,
        attempt=1,
    )
    return worker_pod(
        namespace="ml",
        wiring=wiring,
        template=TEMPLATE,
        owner=OWNER,
        placement=NodePlacement(slice_pool=slice_pool, capacity=capacity),
    )


def test_an_ordinary_pod_carries_nothing_of_either_mode():
    built = pod(CapacityMode())
    keys = set(built["spec"]["nodeSelector"]) | {t["key"] for t in built["spec"]["tolerations"]}
    assert not keys & {
        contract.NODE_LABEL_FLEX_START,
        contract.NODE_LABEL_QUEUED,
        contract.NODE_LABEL_MAX_RUN_DURATION,
    }
    assert built["metadata"]["annotations"] == {"note": "x"}


def test_flex_start_pods_select_flex_start_vms_of_their_run_duration():
    built = pod(CapacityMode("FlexStart", 86400))
    selector = built["spec"]["nodeSelector"]
    assert selector[contract.NODE_LABEL_FLEX_START] == "true"
    assert selector[contract.NODE_LABEL_MAX_RUN_DURATION] == "86400"
    assert contract.NODE_LABEL_QUEUED not in selector
    assert {
        "key": contract.NODE_LABEL_FLEX_START,
        "operator": "Exists",
        "effect": "NoSchedule",
    } in built["spec"]["tolerations"]
    # Still their own pool (workload separation) and the TPU taint.
    assert selector[contract.NODE_LABEL_SLICE_POOL] == "train-0-abc"
    assert contract.TPU_TAINT_KEY in {t["key"] for t in built["spec"]["tolerations"]}
    assert contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST not in built["metadata"]["annotations"]


def test_flex_start_without_a_run_duration_leaves_it_to_gke():
    selector = pod(CapacityMode("FlexStart"))["spec"]["nodeSelector"]
    assert contract.NODE_LABEL_MAX_RUN_DURATION not in selector


def test_queued_pods_select_queued_nodes_and_consume_their_request():
    built = pod(CapacityMode("QueuedProvisioning", 3600, "train-0-a1-r0"))
    assert built["spec"]["nodeSelector"][contract.NODE_LABEL_QUEUED] == "true"
    assert contract.NODE_LABEL_MAX_RUN_DURATION not in built["spec"]["nodeSelector"]
    assert {
        "key": contract.NODE_LABEL_QUEUED,
        "operator": "Exists",
        "effect": "NoSchedule",
    } in built["spec"]["tolerations"]
    assert built["metadata"]["annotations"] == {
        "note": "x",
        contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST: "train-0-a1-r0",
        contract.ANNOTATION_PROVISIONING_CLASS: "queued-provisioning.gke.io",
    }


def test_queued_pods_under_kueue_carry_no_annotation_of_their_own():
    # Kueue's admission check adds the annotations (podSetUpdates, in the template).
    built = pod(CapacityMode("QueuedProvisioning"))
    assert contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST not in built["metadata"]["annotations"]


def test_the_request_of_a_slice_asks_for_all_its_hosts_at_once():
    name = request_name("train-0", 3, 2)
    assert name == "train-0-a3-r2"
    built = pod(CapacityMode("QueuedProvisioning", 7200, name))
    template, request = request_objects(
        name=name,
        namespace="ml",
        pod=built,
        count=SHAPE.hosts,
        max_run_duration_seconds=7200,
        owner=OWNER.reference(),
    )
    assert request["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert request["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io",
        "podSets": [{"count": 4, "podTemplateRef": {"name": name}}],
        "parameters": {"maxRunDurationSeconds": "7200"},
    }
    assert template["kind"] == "PodTemplate" and template["metadata"]["name"] == name
    spec = template["template"]["spec"]
    assert spec["nodeSelector"] == built["spec"]["nodeSelector"]
    assert spec["tolerations"] == built["spec"]["tolerations"]
    assert spec["containers"][0]["resources"]["limits"][contract.TPU_RESOURCE] == "4"
    for obj in (template, request):
        assert obj["metadata"]["ownerReferences"] == [OWNER.reference()]


def test_a_request_without_run_duration_has_no_parameters():
    _, request = request_objects(
        name="r", namespace="ml", pod=pod(CapacityMode("QueuedProvisioning")), count=4,
        max_run_duration_seconds=None, owner=OWNER.reference(),
    )  # fmt: skip
    assert "parameters" not in request["spec"]


def condition(kind: str, status: str = "True", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": kind, "message": message}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], "Pending"),
        ([condition("Accepted")], "Accepted"),
        ([condition("Accepted"), condition("Provisioned")], "Provisioned"),
        ([condition("Accepted"), condition("Provisioned", "False")], "Accepted"),
        ([condition("Provisioned", "False"), condition("Failed")], "Failed"),
        ([condition("Provisioned"), condition("BookingExpired")], "BookingExpired"),
        ([condition("Provisioned"), condition("CapacityRevoked")], "Revoked"),
    ],
)
def test_a_request_reads_as_its_strongest_condition(conditions, expected):
    assert request_state({"status": {"conditions": conditions}})[0] == expected


def test_a_request_not_seen_is_pending_and_a_failure_keeps_its_message():
    assert request_state(None) == ("Pending", "")
    request = {"status": {"conditions": [condition("Failed", message="no capacity in zone")]}}
    assert request_state(request) == ("Failed", "no capacity in zone")


@pytest.mark.parametrize(
    ("placement", "kueue", "provision"),
    [
        ({"capacity": "FlexStart"}, False, True),
        ({"capacity": "FlexStart"}, True, True),
        ({"capacity": "QueuedProvisioning"}, False, True),
        # Kueue admits once the request is provisioned: the pools exist by then.
        ({"capacity": "QueuedProvisioning"}, True, False),
        ({"capacity": "QueuedProvisioning", "provisioning": "ExistingPools"}, False, False),
        ({}, False, None),
    ],
)
def test_capacity_comes_as_new_pools_unless_said_otherwise(placement, kueue, provision):
    (request,) = requests_for(
        SHAPE, Placement.model_validate(placement), 1, ["c"], admitted_capacity=kueue
    )
    assert request.provision is provision


def test_the_kueue_workload_asks_for_queued_nodes_and_passes_the_run_duration():
    job = {"metadata": {"name": "train", "namespace": "ml", "uid": "u", "labels": {}}}
    placement = {"capacity": "QueuedProvisioning", "maxRunDurationSeconds": 3600}
    workload = build_workload(job, TEMPLATE, SHAPE, 2, placement=placement)
    template = workload["spec"]["podSets"][0]["template"]["spec"]
    assert template["nodeSelector"][contract.NODE_LABEL_QUEUED] == "true"
    assert contract.NODE_LABEL_QUEUED in {t["key"] for t in template["tolerations"]}
    assert workload["metadata"]["annotations"] == {KUEUE_MAX_RUN_DURATION: "3600"}
    plain = build_workload(job, TEMPLATE, SHAPE, 2)
    assert "annotations" not in plain["metadata"]
    assert (
        contract.NODE_LABEL_QUEUED
        not in plain["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"]
    )


def test_a_capacity_slice_never_takes_a_free_pool_that_exists():
    free = {
        "v6e": PoolView(
            name="v6e",
            accelerator="tpu-v6e-slice",
            topology="4x4",
            nodes=4,
            ready=4,
            chips_per_vm=4,
        )
    }
    flex = requests_for(SHAPE, Placement(capacity="FlexStart"), 1, ["c"])
    assert allocate(flex, free, {}).pools == ["auto:c"]
    ordinary = requests_for(SHAPE, Placement(provisioning="Auto"), 1, ["c"])
    assert allocate(ordinary, free, {}).pools == ["v6e"]
    # Under Kueue the admitted (provisioned) pools are the ones to take: pools of queued
    # VMs, never the ordinary one.
    admitted = requests_for(
        SHAPE, Placement(capacity="QueuedProvisioning"), 1, ["c"], admitted_capacity=True
    )
    refused = allocate(admitted, free, {})
    assert refused.pools is None and "v6e is of on-demand, Spot or reserved VMs" in refused.message
    queued = PoolView(
        name="q",
        accelerator="tpu-v6e-slice",
        topology="4x4",
        nodes=4,
        ready=4,
        chips_per_vm=4,
        labels={contract.NODE_LABEL_QUEUED: "true", contract.NODE_LABEL_FLEX_START: "true"},
    )
    assert allocate(admitted, {**free, "q": queued}, {}).pools == ["q"]
    # Nor does a job that asks for no capacity mode take a pool of flex-start VMs.
    assert allocate(ordinary, {"q": queued}, {}).pools == ["auto:c"]
