"""The operator as a Kueue integration, against a real Kueue (docs/tasks/kueue.md).

Each test gets its own namespace, a ClusterQueue that admits only that namespace (quota
in google.com/tpu chips per ResourceFlavor, one flavor per simulated TPU accelerator and
topology, topology-aware on the node-pool level) and a LocalQueue ``tpu``.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.testing import wait_until
from tests.operator.support import job_manifest
from tpu_operator import contract
from tpu_operator.builders.workload import LABEL_PRIORITY_CLASS, node_pools_of

pytestmark = pytest.mark.kueue

POOL = contract.NODE_LABEL_NODEPOOL
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
PENDING = (
    "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues/{queue}/pendingworkloads"
)


def queued_job(name: str, namespace: str, shape: dict[str, Any], command: str, **spec: Any):
    manifest = job_manifest(name, namespace, shape, command, **spec)
    manifest["metadata"]["labels"] = {contract.LABEL_KUEUE_QUEUE: "tpu"}
    return manifest


def workloads(tpu, namespace: str) -> list[dict[str, Any]]:
    return tpu.raw.get(WORKLOADS.format(ns=namespace))["items"]


def workload_of(tpu, namespace: str, job: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for wl in workloads(tpu, namespace):
            if any(r["name"] == job for r in wl["metadata"].get("ownerReferences") or []):
                return wl
        return None

    return wait_until(found, timeout=30, message=f"the Workload of {job}")


def created_at(obj: dict[str, Any]) -> float:
    """An object's creationTimestamp (whole seconds), as a POSIX time."""
    stamp = obj["metadata"]["creationTimestamp"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def wait_queue_state(tpu, namespace: str, name: str, state: str, timeout: float = 60):
    def reached() -> dict[str, Any] | None:
        status = tpu.status(namespace, name)
        return status if (status.get("queue") or {}).get("state") == state else None

    return wait_until(
        reached,
        timeout=timeout,
        message=lambda: f"{name} queue state {state}: {tpu.status(namespace, name).get('queue')}",
    )


def test_second_job_stays_queued_until_the_first_finishes(tpu, namespace, queue, operator):
    cq = queue(chips=4)  # one v5litepod-4 slice (4 chips) at a time
    tpu.apply(queued_job("first", namespace, {"type": "v5litepod-4"}, "sleep 8; exit 0"))
    tpu.wait_phase(namespace, "first", "Running", timeout=90)
    tpu.apply(queued_job("second", namespace, {"type": "v5litepod-4"}, "sleep 1; exit 0"))
    status = wait_until(
        lambda: (
            (s := tpu.status(namespace, "second")).get("queue", {}).get("reason")
            and condition(s, "Queued").get("status") == "True"
            and s
        ),
        timeout=30,
        message="the second job queued with Kueue's reason",
    )
    assert status["phase"] == "Queued"
    assert "insufficient" in status["queue"]["message"] or status["queue"]["reason"]
    assert not tpu.pods(namespace, f"{contract.LABEL_JOB_NAME}=second")
    # Quota counts chips: the first job's admission uses 4 google.com/tpu.
    first = workload_of(tpu, namespace, "first")
    (assignment,) = first["status"]["admission"]["podSetAssignments"]
    assert assignment["resourceUsage"]["google.com/tpu"] == "4"
    assert first["status"]["admission"]["clusterQueue"] == cq
    tpu.wait_phase(namespace, "first", "Succeeded", timeout=60)
    tpu.wait_phase(namespace, "second", ("Running", "Succeeded"), timeout=60)
    finished = workload_of(tpu, namespace, "first")
    assert condition(finished["status"], "Finished").get("status") == "True"
    tpu.wait_events(namespace, "second", "Queued", "Admitted")


def test_queued_jobs_show_their_position_from_kueue_s_visibility_api(
    tpu, namespace, queue, operator
):
    # One v5litepod-4 slice (4 chips) at a time. StrictFIFO: under BestEffortFIFO, Kueue
    # sets a workload it found inadmissible aside, and the one behind it may be tried
    # (and counted) first, so the order the positions say depends on timing.
    queue(chips=4, queueing_strategy="StrictFIFO")
    tpu.apply(queued_job("first", namespace, {"type": "v5litepod-4"}, "sleep 300"))
    tpu.wait_phase(namespace, "first", "Running", timeout=90)
    tpu.apply(queued_job("second", namespace, {"type": "v5litepod-4"}, "sleep 300"))
    wait_queue_state(tpu, namespace, "second", "Queued")
    # Kueue orders equal priorities by creationTimestamp, which has one-second resolution,
    # and Workloads created in the same second by UID (in no particular order): the
    # third's Workload is made in a later second than the second's (the local cluster's
    # apiserver runs on this machine's clock).
    second_created = created_at(workload_of(tpu, namespace, "second"))
    time.sleep(max(0.0, second_created + 1 - time.time()))
    tpu.apply(queued_job("third", namespace, {"type": "v5litepod-4"}, "sleep 300"))
    third_created = created_at(workload_of(tpu, namespace, "third"))
    assert third_created > second_created, "the Workloads were created in the same second"

    def position(name: str, wanted: int) -> dict[str, Any] | None:
        status = tpu.status(namespace, name)
        found = (status.get("queue") or {}).get("positionInLocalQueue")
        return status if found == wanted else None

    second = wait_until(
        lambda: position("second", 0),
        timeout=60,
        message=lambda: f"second at position 0: {tpu.status(namespace, 'second').get('queue')}",
    )
    third = wait_until(
        lambda: position("third", 1),
        timeout=60,
        message=lambda: f"third at position 1: {tpu.status(namespace, 'third').get('queue')}",
    )
    assert second["queue"]["positionInClusterQueue"] == 0
    assert third["queue"]["positionInClusterQueue"] == 1
    assert "queued in tpu at position 1 (ClusterQueue position 1; 0 is next)" in third["message"]
    # the positions shown are the ones Kueue's visibility API gives
    pending = tpu.raw.get(PENDING.format(ns=namespace, queue="tpu"))["items"]
    assert [
        (p["metadata"]["name"], p["positionInLocalQueue"], p["positionInClusterQueue"])
        for p in pending
    ] == [(second["queue"]["workload"], 0, 0), (third["queue"]["workload"], 1, 1)]
    # the first job ends: the second is admitted, the third moves up
    tpu.patch_job(namespace, "first", {"spec": {"suspend": True}})
    tpu.wait_phase(namespace, "second", "Running", timeout=90)
    wait_until(
        lambda: position("third", 0),
        timeout=60,
        message=lambda: f"third at position 0: {tpu.status(namespace, 'third').get('queue')}",
    )


@pytest.fixture
def priorities(cluster, namespace):
    names = {"low": f"low-{namespace}"[:60], "high": f"high-{namespace}"[:60]}
    for key, value in (("low", 10), ("high", 1000)):
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": names[key]},
            "value": value,
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    yield names
    for name in names.values():
        cluster.kubectl("delete", "workloadpriorityclass", name, "--ignore-not-found")


def test_higher_priority_job_preempts_and_the_lower_one_resumes(
    tpu, namespace, queue, operator, priorities
):
    queue(chips=4)
    low = queued_job("low", namespace, {"type": "v5litepod-4"}, "sleep 600")
    low["metadata"]["labels"][LABEL_PRIORITY_CLASS] = priorities["low"]
    tpu.apply(low)
    tpu.wait_phase(namespace, "low", "Running", timeout=90)
    high = queued_job("high", namespace, {"type": "v5litepod-4"}, "sleep 3; exit 0")
    high["metadata"]["labels"][LABEL_PRIORITY_CLASS] = priorities["high"]
    tpu.apply(high)
    evicted = wait_until(
        lambda: (
            (s := tpu.status(namespace, "low")).get("phase") == "Queued"
            and condition(s, "Evicted").get("status") == "True"
            and s
        ),
        timeout=60,
        message=lambda: f"low evicted: {tpu.status(namespace, 'low').get('message')}",
    )
    assert condition(evicted, "Evicted")["reason"] == "Preempted"
    tpu.wait_phase(namespace, "high", ("Running", "Succeeded"), timeout=90)
    # The high job runs only once every pod of the low one is gone (terminating ones
    # included: their chips are free only then, and only then is the quota given back).
    assert not tpu.pods(namespace, f"{contract.LABEL_JOB_NAME}=low")
    released = workload_of(tpu, namespace, "low")["status"]
    assert condition(released, "Requeued").get("reason") == "Preempted"
    tpu.wait_phase(namespace, "high", "Succeeded", timeout=60)
    resumed = tpu.wait_phase(namespace, "low", "Running", timeout=90)
    assert resumed["attempt"] == 2
    assert resumed["restarts"] == 0  # a new attempt, not a counted restart
    assert resumed["queue"]["admissions"] == 2
    tpu.wait_events(namespace, "low", "WorkloadEvicted", "Admitted")


def test_multislice_job_is_admitted_with_each_slice_in_its_own_node_pool(
    tpu, namespace, queue, operator
):
    queue()
    tpu.apply(queued_job("multi", namespace, {"type": "v5p-16"}, "sleep 600", numSlices=2))
    running = tpu.wait_phase(namespace, "multi", "Running", timeout=120)
    assert sorted(running["nodePools"]) == ["v5p-a", "v5p-b"]
    wl = workload_of(tpu, namespace, "multi")
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 4
    assert pod_set["topologyRequest"]["podSetSliceSize"] == 2
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment["resourceUsage"]["google.com/tpu"] == "16"
    # The slices' pools are the ones Kueue's topology assignment chose.
    nodes = tpu.raw.get("/api/v1/nodes")["items"]
    pool_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(POOL) for n in nodes}
    assert node_pools_of(assignment, hosts=2, slices=2, pool_of=pool_of) == running["nodePools"]
    for pod in tpu.pods(namespace):
        index = int(pod["metadata"]["labels"][contract.LABEL_SLICE_INDEX])
        assert (
            pod["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] == running["nodePools"][index]
        )


def test_job_without_queue_label_is_untouched_by_kueue(tpu, namespace, queue, operator):
    queue(chips=4)
    tpu.apply(job_manifest("plain", namespace, {"type": "v5litepod-4"}, "sleep 1; exit 0"))
    status = tpu.wait_phase(namespace, "plain", ("Running", "Succeeded"), timeout=90)
    assert "queue" not in status
    assert not workloads(tpu, namespace)


def test_operator_killed_between_admission_and_pod_creation_converges(
    cluster, tpu, namespace, queue, operator
):
    cq = queue(chips=4)

    def hold(policy: str) -> None:
        patch = json.dumps({"spec": {"stopPolicy": policy}})
        cluster.kubectl("patch", "clusterqueue", cq, "--type=merge", "-p", patch)

    hold("Hold")  # Kueue admits nothing until released
    tpu.apply(queued_job("late", namespace, {"type": "v5litepod-4"}, "sleep 2; exit 0"))
    workload_of(tpu, namespace, "late")
    tpu.wait_phase(namespace, "late", "Queued", timeout=30)
    operator.kill()
    hold("None")
    admitted = wait_until(
        lambda: (
            condition(workload_of(tpu, namespace, "late")["status"], "Admitted").get("status")
            == "True"
        ),
        timeout=60,
        message="Kueue admitting the job while the operator is down",
    )
    assert admitted and not tpu.pods(namespace)  # admitted, no pod yet
    operator.start()
    status = tpu.wait_phase(namespace, "late", "Succeeded", timeout=120)
    assert status["attempt"] == 1 and status["queue"]["admissions"] == 1
    assert len(workloads(tpu, namespace)) == 1


def test_every_example_is_accepted_by_the_apiserver_and_kueue(cluster, kueue, operator):
    """Every manifest under examples/, applied server-side without being stored: the CRDs'
    schemas and CEL rules and Kueue's webhooks judge each document (here both the
    operator's and Kueue's CRDs are installed)."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    paths = sorted(examples.rglob("*.yaml"))
    names = {str(path.relative_to(examples)) for path in paths}
    assert {"local-demo.yaml", "kueue/queues.yaml", "own-code/tpujob.yaml"} <= names
    assert {"checkpoints-pvc.yaml", "checkpoints-gcsfuse.yaml", "v6e-jax.yaml"} <= names
    for path in paths:
        count = sum(1 for d in yaml.safe_load_all(path.read_text()) if d)
        result = cluster.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        assert result.stdout.count("(server dry run)") == count, f"{path.name}: {result.stdout}"


def test_suspended_job_gives_its_quota_back_and_resumes_through_kueue(
    tpu, namespace, queue, operator
):
    queue(chips=4)
    tpu.apply(queued_job("paused", namespace, {"type": "v5litepod-4"}, "sleep 600"))
    tpu.wait_phase(namespace, "paused", "Running", timeout=90)
    tpu.patch_job(namespace, "paused", {"spec": {"suspend": True}})
    tpu.wait_phase(namespace, "paused", "Suspended", timeout=30)
    wait_until(
        lambda: not workload_of(tpu, namespace, "paused")["status"].get("admission"),
        timeout=60,
        message="the suspended job's quota given back",
    )
    assert workload_of(tpu, namespace, "paused")["spec"]["active"] is False
    # Its 4 chips go to another job meanwhile.
    tpu.apply(queued_job("other", namespace, {"type": "v5litepod-4"}, "sleep 1; exit 0"))
    tpu.wait_phase(namespace, "other", "Succeeded", timeout=90)
    tpu.patch_job(namespace, "paused", {"spec": {"suspend": False}})
    resumed = tpu.wait_phase(namespace, "paused", "Running", timeout=90)
    assert resumed["attempt"] == 2 and resumed["restarts"] == 0


ZONE = "topology.kubernetes.io/zone"
FLAVOR_TOLERATION = {"key": "example.com/flavor", "operator": "Exists", "effect": "NoSchedule"}
V5E_2X2 = "v5-lite-podslice-2-2"  # tpu_queues' flavor of the v5e 2x2 pool (v5litepod-4)


def test_the_admitting_flavor_s_node_labels_and_tolerations_reach_the_pods(
    tpu, namespace, queue, operator
):
    nodes = tpu.raw.get("/api/v1/nodes")["items"]
    zone = next(
        n["metadata"]["labels"][ZONE] for n in nodes if n["metadata"]["name"] == "v5e-2x2-0"
    )
    own = f"zone-{namespace}"[:63]

    def flavor(name: str, spec: dict[str, Any]) -> str | None:
        if name != V5E_2X2:
            return None
        spec["nodeLabels"][ZONE] = zone  # the pool's nodes carry it
        spec["tolerations"] = [FLAVOR_TOLERATION]
        return own

    queue(chips=4, flavor=flavor)
    tpu.apply(queued_job("zoned", namespace, {"type": "v5litepod-4"}, "sleep 600"))
    running = tpu.wait_phase(namespace, "zoned", "Running", timeout=90)
    assert running["queue"]["flavors"] == {"google.com/tpu": own}
    (pod,) = tpu.pods(namespace)
    assert pod["spec"]["nodeSelector"][ZONE] == zone
    assert FLAVOR_TOLERATION in pod["spec"]["tolerations"]


def test_a_flavor_that_conflicts_with_the_job_s_placement_fails_it_and_frees_the_quota(
    tpu, namespace, queue, operator
):
    own = f"disk-{namespace}"[:63]

    def flavor(name: str, spec: dict[str, Any]) -> str | None:
        if name != V5E_2X2:
            return None
        spec["nodeLabels"]["example.com/disk"] = "hdd"
        return own

    # Without topology-aware scheduling Kueue admits on quota alone; the Workload's pod
    # template does not carry spec.placement, so Kueue cannot see the conflict.
    cq = queue(chips=4, topology=False, flavor=flavor)
    job = queued_job(
        "clash",
        namespace,
        {"type": "v5litepod-4"},
        "sleep 600",
        placement={"nodeSelector": {"example.com/disk": "ssd"}},
    )
    tpu.apply(job)
    failed = tpu.wait_phase(namespace, "clash", "Failed", timeout=90)
    assert condition(failed, "Failed")["reason"] == "AdmissionConflict"
    assert "example.com/disk" in failed["message"] and "'hdd'" in failed["message"]
    assert not tpu.pods(namespace)
    tpu.wait_events(namespace, "clash", "AdmissionConflict")
    finished = wait_until(
        lambda: condition(workload_of(tpu, namespace, "clash")["status"], "Finished") or None,
        timeout=30,
        message="the Workload finished",
    )
    assert finished["status"] == "True"
    assert workload_of(tpu, namespace, "clash")["status"]["admission"]["clusterQueue"] == cq


def test_a_finished_slice_s_quota_goes_back_while_the_other_slice_runs(
    cluster, tpu, namespace, queue, operator
):
    cq = queue()
    # Slice 0's workers end at once, slice 1's keep running.
    command = f'[ "${contract.ENV_SLICE_INDEX}" = 0 ] && exit 0; sleep 600'
    tpu.apply(queued_job("half", namespace, {"type": "v5p-16"}, command, numSlices=2))

    def reclaimable() -> list[dict[str, Any]] | None:
        return workload_of(tpu, namespace, "half")["status"].get("reclaimablePods")

    found = wait_until(reclaimable, timeout=120, message="the Workload's reclaimablePods")
    assert found == [{"name": "workers", "count": 2}]  # the 2 hosts of slice 0
    # Slice 0 may end before slice 1's workers are all ready: its quota goes back at
    # once, and the job runs on once they are (ready or done, every worker counts).
    tpu.wait_phase(namespace, "half", "Running", timeout=60)
    # Its ready count may trail the pods by the status pacing's second: the job may have
    # been Running with both slices ready for the moment slice 0's workers ran.
    status = wait_until(
        lambda: (s := tpu.status(namespace, "half")).get("slicesReady") == "1/2" and s,
        timeout=30,
        message=lambda: f"slicesReady 1/2; the status is {tpu.status(namespace, 'half')}",
    )
    assert status["phase"] == "Running"

    # Kueue counts the slice's 8 chips free: 8 of the job's 16 remain in use.
    def usage() -> str | None:
        queue_status = (
            json.loads(cluster.kubectl("get", "clusterqueue", cq, "-o", "json").stdout).get(
                "status"
            )
            or {}
        )
        for flavor in queue_status.get("flavorsUsage") or []:
            for resource in flavor.get("resources") or []:
                if resource["name"] == "google.com/tpu" and resource.get("total") not in (
                    None,
                    "0",
                ):
                    return str(resource["total"])
        return None

    assert wait_until(
        lambda: usage() == "8" or None, timeout=30, message=lambda: f"usage {usage()}"
    )
