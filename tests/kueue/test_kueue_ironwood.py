"""Ironwood dynamic slicing through a real Kueue (docs/tasks/dynamic-slicing.md): three
simulated cubes in one reservation block, Kueue's objects as xpk makes them (a Topology
of block, partitions and hosts; a flavor of the accelerator; an AdmissionCheck of GKE's
slice controller, ``accelerator.gke.io/slice``), and the operator serving that check for
its own Workload: Kueue assigns hosts, the operator forms one GKE Slice per slice of the
partitions they are in (GKE's names and annotations), the localcluster slice controller
stand-in makes it Ready, the check turns Ready and the pods run on the Slice's nodes; a
cube turned UNHEALTHY sends the job back to Kueue, which places it on healthy cubes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.kueue import Kueue, ironwood_queues
from localcluster.testing import wait_until
from tests.operator.support import GKE_SLICES as SLICES
from tests.operator.support import JOBS, Api, job_manifest, simulated_cubes
from tpu_operator import contract
from tpu_operator.builders.workload import _domains
from tpu_operator.policies import slice_check

pytestmark = pytest.mark.kueue

WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
CUBE_ID = contract.partition_id_label("4x4x4")
CUBE_STATE = contract.partition_state_label("4x4x4")


@pytest.fixture(scope="module")
def cubes(cluster) -> Iterator[list[str]]:
    with simulated_cubes(cluster, "kcube") as names:
        yield names


@pytest.fixture
def ironwood_queue(cluster, kueue: Kueue, namespace: str) -> Iterator[str]:
    name = f"cq-{namespace}"[:63]
    kueue.apply(ironwood_queues(cluster_queue=name, namespaces=[namespace], chips=128))
    yield name
    cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")


def workload_of(tpu: Api, namespace: str, job: str) -> dict[str, Any] | None:
    for wl in tpu.raw.get(WORKLOADS.format(ns=namespace))["items"]:
        if any(r["name"] == job for r in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def check_of(workload: dict[str, Any] | None) -> dict[str, Any]:
    for entry in ((workload or {}).get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == "ss-kueue-operator":
            return entry
    return {}


def slices_of(tpu: Api, namespace: str, workload: str) -> list[dict[str, Any]]:
    return [
        s
        for s in tpu.raw.get(SLICES)["items"]
        if (s["metadata"].get("annotations") or {}).get(slice_check.OWNER_NAMESPACE) == namespace
        and s["metadata"]["annotations"].get(slice_check.OWNER_NAME) == workload
    ]


def assigned_hosts(workload: dict[str, Any]) -> set[str]:
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    topo = assignment["topologyAssignment"]
    level = topo["levels"].index("kubernetes.io/hostname")
    return {host for host, _ in _domains(topo, level)}


def running_pods(tpu: Api, namespace: str, job: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p
        for p in tpu.pods(namespace, f"{contract.LABEL_JOB_NAME}={job}")
        if p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == str(attempt)
        and p["spec"].get("nodeName")
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def node_labels(tpu: Api) -> dict[str, dict[str, str]]:
    return {
        n["metadata"]["name"]: n["metadata"].get("labels") or {}
        for n in tpu.raw.get("/api/v1/nodes")["items"]
    }


def check_running(tpu: Api, namespace: str, job: str, attempt: int) -> tuple[dict, dict]:
    """The attempt's 32 pods run on the hosts Kueue assigned, which are the nodes of the
    job's one GKE Slice (GKE's name and annotations, two cubes); the check is Ready with
    the pods' topology selector. Returns (Workload, Slice)."""
    workload = workload_of(tpu, namespace, job)
    assert workload is not None
    entry = check_of(workload)
    assert entry["state"] == "Ready", entry
    assert entry["podSetUpdates"] == [
        {"name": "workers", "nodeSelector": {contract.NODE_LABEL_TOPOLOGY: "4x4x8"}}
    ]
    name = workload["metadata"]["name"]
    (formed,) = slices_of(tpu, namespace, name)
    assert formed["metadata"]["name"] == slice_check.gke_slice_name(namespace, name, "workers", 0)
    assert formed["metadata"]["annotations"][slice_check.OWNER_POD_SET] == "workers"
    assert formed["spec"]["topology"] == "4x4x8" and len(formed["spec"]["partitionIds"]) == 2
    pods = running_pods(tpu, namespace, job, attempt)
    assert len(pods) == 32
    on = {p["spec"]["nodeName"] for p in pods}
    assert on == assigned_hosts(workload)
    labels = node_labels(tpu)
    assert {labels[n][CUBE_ID] for n in on} == set(formed["spec"]["partitionIds"])
    for pod in pods:
        selector = pod["spec"]["nodeSelector"]
        assert selector[contract.NODE_LABEL_TPU_SLICE] == formed["metadata"]["name"]
        assert selector[contract.NODE_LABEL_TOPOLOGY] == "4x4x8"
    return workload, formed


def test_a_super_slice_runs_through_kueue_s_slice_check_and_moves_off_an_unhealthy_cube(
    cluster, kueue, operator, tpu: Api, namespace: str, cubes: list[str], ironwood_queue: str
):
    shape = {"accelerator": "tpu7x", "topology": "4x4x8", "dynamicSlicing": "SuperSlice"}
    job = job_manifest("ss", namespace, shape, "sleep 3600", failurePolicy={"backoffSeconds": 0})
    job["metadata"]["labels"] = {contract.LABEL_KUEUE_QUEUE: "tpu"}
    tpu.apply(job)

    def status() -> dict[str, Any]:
        return tpu.status(namespace, "ss")

    def story() -> str:
        return f"{status().get('message')}; check {check_of(workload_of(tpu, namespace, 'ss'))}"

    first = wait_until(
        lambda: (s := status()).get("phase") == "Running" and s,
        timeout=180,
        message=lambda: f"ss to run: {story()}",
    )
    workload, formed = check_running(tpu, namespace, "ss", first["attempt"])
    spec = workload["spec"]["podSets"][0]
    assert spec["topologyRequest"] == {
        "required": contract.NODE_LABEL_TOPOLOGY_BLOCK,
        "podSetSliceRequiredTopology": CUBE_ID,
        "podSetSliceSize": 16,
    }
    template = spec["template"]
    assert template["metadata"]["annotations"][contract.ANNOTATION_SLICE_TOPOLOGY] == "4x4x8"
    assert contract.NODE_LABEL_TOPOLOGY not in template["spec"]["nodeSelector"]
    active = tpu.raw.get("/apis/kueue.x-k8s.io/v1beta2/admissionchecks/ss-kueue-operator")
    assert {(c["type"], c["status"]) for c in active["status"]["conditions"]} >= {
        ("Active", "True")
    }

    # One of its cubes turns UNHEALTHY: the check goes Retry, Kueue evicts the job and
    # places it again on the two healthy cubes; the operator forms the Slice anew there.
    bad = formed["spec"]["partitionIds"][0]
    cluster.kubectl(
        "label", "nodes", "-l", f"{CUBE_ID}={bad}", f"{CUBE_STATE}=UNHEALTHY", "--overwrite"
    )
    try:
        moved = wait_until(
            lambda: (
                (s := status()).get("phase") == "Running"
                and (s.get("queue") or {}).get("admissions", 0) >= 2
                and s
            ),
            timeout=240,
            message=lambda: f"ss to run on healthy cubes: {story()}",
        )
        workload, second = check_running(tpu, namespace, "ss", moved["attempt"])
        assert bad not in second["spec"]["partitionIds"]
        assert moved.get("restarts", 0) == 0, moved  # an eviction, not a failure of the job
    finally:
        cluster.kubectl(
            "label", "nodes", "-l", f"{CUBE_ID}={bad}", f"{CUBE_STATE}=HEALTHY", "--overwrite"
        )

    # The job deleted, its Slice goes (cluster-scoped: no owner reference collects it).
    tpu.raw.request("DELETE", f"{JOBS.format(ns=namespace)}/ss")
    wait_until(
        lambda: not slices_of(tpu, namespace, workload["metadata"]["name"]),
        timeout=60,
        message="the deleted job's Slice to be deleted",
    )


def test_two_sub_slices_get_a_slice_each_of_their_own_partition(
    cluster, kueue, operator, tpu: Api, namespace: str, cubes: list[str], ironwood_queue: str
):
    """A job of two 2x2x2 sub-slices: Kueue puts each slice's two hosts in one 2x2x2
    partition, the check forms one Slice per slice (GKE's chunking of the assignment's
    partitions, in order), and slice i's pods run on Slice i's nodes."""
    shape = {"accelerator": "tpu7x", "topology": "2x2x2", "dynamicSlicing": "SubSlice"}
    job = job_manifest("sub", namespace, shape, "sleep 3600", numSlices=2)
    job["metadata"]["labels"] = {contract.LABEL_KUEUE_QUEUE: "tpu"}
    tpu.apply(job)
    wait_until(
        lambda: tpu.status(namespace, "sub").get("phase") == "Running",
        timeout=120,
        message=lambda: f"sub to run: {tpu.status(namespace, 'sub').get('message')}",
    )
    workload = workload_of(tpu, namespace, "sub")
    assert workload is not None and check_of(workload)["state"] == "Ready"
    name = workload["metadata"]["name"]
    formed = {s["metadata"]["name"]: s for s in slices_of(tpu, namespace, name)}
    names = [slice_check.gke_slice_name(namespace, name, "workers", i) for i in range(2)]
    assert sorted(formed) == sorted(names)
    ids = [formed[n]["spec"]["partitionIds"] for n in names]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]
    labels = node_labels(tpu)
    pods = running_pods(tpu, namespace, "sub", 1)
    assert len(pods) == 4
    assert {p["spec"]["nodeName"] for p in pods} == assigned_hosts(workload)
    level = contract.partition_id_label("2x2x2")
    for pod in pods:
        index = int(pod["metadata"]["labels"][contract.LABEL_SLICE_INDEX])
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_TPU_SLICE] == names[index]
        assert [labels[pod["spec"]["nodeName"]][level]] == ids[index]
    tpu.raw.request("DELETE", f"{JOBS.format(ns=namespace)}/sub")
    wait_until(
        lambda: not slices_of(tpu, namespace, name),
        timeout=60,
        message="the deleted job's Slices to be deleted",
    )
