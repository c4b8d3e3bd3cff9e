"""Ironwood dynamic slicing on the local cluster: three simulated cubes (tpu7x 4x4x4, 16
VMs each, labelled with partition ids and states) and the slice controller stand-in
(localcluster/agent/slicecontroller.py) serving GKE's Slice CRD. A super-slice job runs on
the cubes its Slice names and moves to healthy cubes when one of them turns UNHEALTHY; a
sub-slice job runs in one 2x2x2 partition and its Slice goes with the job."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.testing import wait_until
from tests.operator.support import GKE_SLICES as SLICES
from tests.operator.support import JOBS, Api, job_manifest, simulated_cubes
from tpu_operator import contract
from tpu_operator.placement import dynamic

pytestmark = pytest.mark.integration

CUBE_ID = contract.partition_id_label("4x4x4")
CUBE_STATE = contract.partition_state_label("4x4x4")


@pytest.fixture(scope="module")
def cubes(cluster) -> Iterator[list[str]]:
    """Three simulated Ironwood cubes; the stand-in installs the Slice CRD for them."""
    with simulated_cubes(cluster, "cube") as names:
        yield names


def gke_slices(tpu: Api, namespace: str, tpuslice: str) -> list[dict[str, Any]]:
    selector = dynamic.owner_selector(namespace, tpuslice)
    return tpu.raw.get(f"{SLICES}?labelSelector={selector}")["items"]


def nodes(tpu: Api) -> dict[str, dict[str, str]]:
    return {
        n["metadata"]["name"]: n["metadata"].get("labels") or {}
        for n in tpu.raw.get("/api/v1/nodes")["items"]
    }


def ready_reason(body: dict[str, Any]) -> str | None:
    for condition in (body.get("status") or {}).get("conditions") or ():
        if condition["type"] == "Ready" and condition["status"] == "True":
            return str(condition["reason"])
    return None


def placed(tpu: Api, namespace: str, job: str, attempt: int) -> list[dict[str, Any]]:
    """The job's running pods of ``attempt``, every one on a node."""
    pods = tpu.pods(namespace, f"{contract.LABEL_JOB_NAME}={job}")
    return [
        p
        for p in pods
        if p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == str(attempt)
        and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    ]


def check_placement(tpu: Api, namespace: str, job: str, attempt: int, hosts: int, level: str):
    """The attempt's pods all run on the nodes of the one Ready Slice of its slice, and
    that Slice is made of the partitions those nodes belong to. Returns the Slice."""
    (formed,) = gke_slices(tpu, namespace, f"{job}-0")
    name = formed["metadata"]["name"]
    assert name == dynamic.slice_name(namespace, f"{job}-0", attempt)
    assert ready_reason(formed) == "ACTIVE"
    pods = placed(tpu, namespace, job, attempt)
    assert len(pods) == hosts
    labels = nodes(tpu)
    on = {p["spec"]["nodeName"] for p in pods}
    assert len(on) == hosts
    for pod in pods:
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_TPU_SLICE] == name
        assert (
            pod["metadata"]["annotations"][contract.ANNOTATION_SLICE_TOPOLOGY]
            == (formed["spec"]["topology"])
        )
    assert {labels[n][contract.partition_id_label(level)] for n in on} == set(
        formed["spec"]["partitionIds"]
    )
    assert {labels[n][contract.NODE_LABEL_TPU_SLICE] for n in on} == {name}
    return formed


def test_a_super_slice_runs_on_its_cubes_and_moves_off_an_unhealthy_one(
    cluster, running_operator, tpu: Api, namespace: str, cubes: list[str]
):
    shape = {"accelerator": "tpu7x", "topology": "4x4x8", "dynamicSlicing": "SuperSlice"}
    tpu.apply(
        job_manifest("ss", namespace, shape, "sleep 3600", failurePolicy={"backoffSeconds": 0})
    )
    wait_until(
        lambda: tpu.status(namespace, "ss").get("phase") == "Running",
        timeout=180,
        message=lambda: f"ss to run; its slice: {slice_message(tpu, namespace, 'ss')}",
    )
    first = check_placement(tpu, namespace, "ss", 1, 32, "4x4x4")
    assert first["spec"]["topology"] == "4x4x8" and len(first["spec"]["partitionIds"]) == 2

    # GKE marks one of the slice's cubes UNHEALTHY: its nodes are lost to the slice, the
    # gang restarts and the next attempt forms a Slice of the two healthy cubes.
    bad = first["spec"]["partitionIds"][0]
    cluster.kubectl(
        "label", "nodes", "-l", f"{CUBE_ID}={bad}", f"{CUBE_STATE}=UNHEALTHY", "--overwrite"
    )
    moved = wait_until(
        lambda: (
            (s := tpu.status(namespace, "ss")).get("attempt", 0) >= 2
            and s.get("phase") == "Running"
            and s
        ),
        timeout=180,
        message=lambda: f"ss to run again: {tpu.status(namespace, 'ss').get('message')}",
    )
    assert moved["lastFailure"]["reason"] == "NodeLost", moved["lastFailure"]
    second = wait_until(
        lambda: (
            len(found := gke_slices(tpu, namespace, "ss-0")) == 1
            and found[0]["metadata"]["name"] != first["metadata"]["name"]
            and found
        ),
        timeout=60,
        message="the first attempt's Slice to be deleted",
    )[0]
    assert bad not in second["spec"]["partitionIds"]
    assert set(second["spec"]["partitionIds"]) != set(first["spec"]["partitionIds"])
    check_placement(tpu, namespace, "ss", moved["attempt"], 32, "4x4x4")

    # The job deleted, its Slice goes (cluster-scoped: no owner reference collects it).
    cluster.kubectl(
        "label", "nodes", "-l", f"{CUBE_ID}={bad}", f"{CUBE_STATE}=HEALTHY", "--overwrite"
    )
    delete_job(tpu, namespace, "ss")


def delete_job(tpu: Api, namespace: str, name: str) -> None:
    tpu.raw.request("DELETE", f"{JOBS.format(ns=namespace)}/{name}")
    wait_until(
        lambda: not gke_slices(tpu, namespace, f"{name}-0"),
        timeout=60,
        message=f"the deleted job {name}'s Slice to be deleted",
    )


def slice_message(tpu: Api, namespace: str, job: str) -> str:
    found = [s for s in tpu.slices(namespace) if s["metadata"]["name"] == f"{job}-0"]
    return (found[0].get("status") or {}).get("message", "") if found else "no TPUSlice"


def test_a_sub_slice_runs_in_one_partition_and_its_slice_goes_with_the_job(
    cluster, running_operator, tpu: Api, namespace: str, cubes: list[str]
):
    shape = {"accelerator": "tpu7x", "topology": "2x2x2", "dynamicSlicing": "SubSlice"}
    tpu.apply(job_manifest("sub", namespace, shape, "sleep 3600"))
    wait_until(
        lambda: tpu.status(namespace, "sub").get("phase") == "Running",
        timeout=120,
        message=lambda: f"sub to run; its slice: {slice_message(tpu, namespace, 'sub')}",
    )
    formed = check_placement(tpu, namespace, "sub", 1, 2, "2x2x2")
    assert formed["spec"]["topology"] == "2x2x2" and len(formed["spec"]["partitionIds"]) == 1

    delete_job(tpu, namespace, "sub")
    name = formed["metadata"]["name"]
    wait_until(
        lambda: name not in {v.get(contract.NODE_LABEL_TPU_SLICE) for v in nodes(tpu).values()},
        timeout=30,
        message="the stand-in to unlabel the Slice's nodes",
    )
