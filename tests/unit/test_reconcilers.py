"""The TPUJob and TPUSlice reconcilers over an in-memory API (tests/unit/fakeapi.py).

Each scenario drives the control loop by hand (reconcile, pods start, fail, stop, time
passes) and checks status, events, the children and the number of status writes: one per
reconcile where one suffices, and none that conflicts with itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from tests.unit.fakeapi import FakeCluster
from tests.unit.test_dynamic_slicing_parts import cube_nodes
from tpu_operator import contract
from tpu_operator.placement import dynamic
from tpu_operator.runtime.kube import ApiError

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")  # v5p-16: 2 hosts of 4 chips


def job_spec(type_: str = "v5litepod-4", **extra: Any) -> dict[str, Any]:
    return {
        "slice": {"type": type_},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        **extra,
    }


def slice_spec(type_: str = "v5litepod-4", **extra: Any) -> dict[str, Any]:
    """A standalone TPUSlice: the shape fields at the top of its spec."""
    spec = job_spec(type_, **extra)
    return {**spec.pop("slice"), **spec}


def phase(cluster: FakeCluster, name: str) -> str:
    return cluster.job(name)["status"]["phase"]


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == type_)


def running_job(cluster: FakeCluster, name: str = "j", **spec: Any) -> None:
    """A job whose attempt 1 is Running (its pods started and ready)."""
    cluster.apply_job(name, job_spec(**spec))
    cluster.settle()
    cluster.run_pods(name)
    cluster.settle()
    assert phase(cluster, name) == "Running"


def suspend_until_stopped(cluster: FakeCluster, name: str) -> None:
    """Suspend the standalone slice ``name`` and let the kubelets confirm its pods gone."""
    cluster.slice(name)["spec"]["suspend"] = True
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()


# start


def test_first_reconcile_writes_status_once_and_creates_the_children():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec())
    cluster.reconcile_job("j")
    assert cluster.status_writes() == (1, 0)
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"]) == ("Pending", 1)
    assert cluster.slice("j-0")["spec"]["attempt"] == 1
    assert any(r.verb == "POST" and r.path.endswith("/services") for r in cluster.requests)


def slice_names(cluster: FakeCluster) -> list[str]:
    return sorted(
        o["metadata"]["name"]
        for k, o in cluster.objects.items()
        if f"/{contract.SLICE_PLURAL}/" in k
    )


class Concurrent(FakeCluster):
    """The in-memory API, answering each slice write only after yielding to the loop, and
    refusing the writes of the slices named in ``refuse`` (a 500)."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.refuse = refuse
        self.in_flight = 0
        self.most_in_flight = 0

    async def _slice_write(self, path: str) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        if any(path.endswith(f"/{name}") for name in self.refuse):
            raise ApiError("PATCH", path, 500, "InternalError", "etcd is unhappy")

    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        if path.endswith(f"/{contract.SLICE_PLURAL}"):
            await self._slice_write(f"{path}/{body['metadata']['name']}")
        return await super().create(path, body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        if f"/{contract.SLICE_PLURAL}/" in path and not path.endswith("/status"):
            await self._slice_write(path)
        return await super().merge_patch(path, patch)


def test_a_jobs_slices_are_created_and_suspended_all_at_once():
    cluster = Concurrent()
    cluster.apply_job("j", job_spec(numSlices=4))
    cluster.reconcile_job("j")
    assert slice_names(cluster) == ["j-0", "j-1", "j-2", "j-3"]
    assert cluster.most_in_flight == 4  # not one after the other
    cluster.most_in_flight = 0
    cluster.edit_job("j", {"suspend": True})
    cluster.reconcile_job("j")
    assert all(cluster.slice(n)["spec"]["suspend"] for n in slice_names(cluster))
    assert cluster.most_in_flight == 4


def test_one_refused_slice_write_leaves_the_others_sent_and_fails_the_reconcile():
    cluster = Concurrent(refuse=("j-1",))
    cluster.apply_job("j", job_spec(numSlices=3))
    with pytest.raises(ApiError, match="etcd is unhappy"):
        cluster.reconcile_job("j")
    assert slice_names(cluster) == ["j-0", "j-2"]
    cluster.refuse = ()
    cluster.reconcile_job("j")  # the retry creates what is missing
    assert slice_names(cluster) == ["j-0", "j-1", "j-2"]


def test_start_to_running_writes_and_events():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec())
    cluster.settle()
    assert len(cluster.pods("j")) == 1
    assert phase(cluster, "j") == "Starting"
    cluster.run_pods("j")
    cluster.clear_requests()
    cluster.reconcile_job("j")
    assert phase(cluster, "j") == "Running"
    assert cluster.status_writes() == (1, 0)
    assert cluster.recorded.reasons("j").count("Running") == 1
    assert cluster.recorded.running_after == [1.0]  # settle() let 1 s pass
    assert cluster.job("j")["status"]["runningSince"]


def test_running_stays_running_while_a_worker_is_not_ready():
    cluster = FakeCluster()
    running_job(cluster)
    (pod,) = cluster.pods("j")
    cluster.set_ready(pod, False)
    cluster.advance(5)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Running"
    assert "0 ready or done" in status["message"]
    cluster.set_ready(pod, True)
    cluster.advance(5)
    cluster.settle()
    assert phase(cluster, "j") == "Running"
    assert cluster.recorded.reasons("j").count("Running") == 1


# node pools


def test_waiting_for_pools_then_taking_one_when_it_appears():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v5p-16"))
    assert cluster.reconcile_job("j") == 15.0
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending"
    assert "the cluster has no TPU node pools" in status["message"]
    assert cluster.recorded.reasons("j") == ["WaitingForNodePools"]
    assert cluster.status_writes() == (1, 0)
    assert "j-0" not in str(list(cluster.objects))
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.clear_requests()
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["nodePools"] == ["p1"]
    assert cluster.slice("j-0")["spec"]["nodePool"] == "p1"
    assert cluster.status_writes() == (1, 0)
    cluster.settle()
    pods = cluster.pods("j")
    assert len(pods) == 2
    assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in pods.values()} == {
        "p1"
    }


def test_a_pool_is_held_until_the_previous_holders_pods_are_gone():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job("a", job_spec("v5p-16"))
    cluster.settle()
    cluster.run_pods("a")
    cluster.settle()
    cluster.apply_job("b", job_spec("v5p-16"))
    cluster.settle()
    assert "p1 is held by TPUJob ml/a" in cluster.job("b")["status"]["message"]

    cluster.edit_job("a", {"suspend": True})
    cluster.settle()
    a = cluster.job("a")["status"]
    assert a["phase"] == "Suspended"
    assert (a["activePods"], a["terminatingPods"]) == (0, 2)
    assert condition(cluster.job("a"), "PodsStopped")["status"] == "False"
    b = cluster.job("b")["status"]
    assert b["phase"] == "Pending"
    assert "p1 is held by TPUJob ml/a (2 of its pods are on it, 2 terminating)" in b["message"]
    assert not cluster.pods("b")

    cluster.confirm_deletions()
    cluster.settle()
    assert condition(cluster.job("a"), "PodsStopped")["status"] == "True"
    assert cluster.job("b")["status"]["nodePools"] == ["p1"]
    assert len(cluster.pods("b")) == 2


def test_a_resumed_job_waits_for_a_pool_in_pending_and_never_runs_without_one():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job("a", job_spec("v5p-16"))
    cluster.settle()
    cluster.edit_job("a", {"suspend": True})
    cluster.settle()
    cluster.confirm_deletions()
    cluster.apply_job("b", job_spec("v5p-16"))
    cluster.settle()
    assert cluster.job("b")["status"]["nodePools"] == ["p1"]
    cluster.edit_job("a", {"suspend": False})
    cluster.settle()
    status = cluster.job("a")["status"]
    assert status["phase"] == "Pending"
    assert "p1 is held by TPUJob ml/b" in status["message"]
    assert not cluster.pods("a")
    assert condition(cluster.job("a"), "Suspended")["status"] == "True"


def test_job_and_standalone_slice_of_one_name_do_not_share_pools_or_pods():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.add_pool("p2", *V5P, hosts=2)
    cluster.apply_slice("x", slice_spec("v5p-16"))
    cluster.settle()
    slice_pool = cluster.slice("x")["status"]["nodePool"]
    cluster.apply_job("x", job_spec("v5p-16"))
    cluster.settle()
    (job_pool,) = cluster.job("x")["status"]["nodePools"]
    assert {slice_pool, job_pool} == {"p1", "p2"}
    job_pods = {
        n
        for n, p in cluster.pods().items()
        if p["metadata"]["labels"][contract.LABEL_SLICE_NAME] == "x-0"
    }
    assert job_pods == {"x-0-0", "x-0-1"}
    assert cluster.job("x")["status"]["workers"] == 2


# restarts


RESTART_CAUSES = [
    # (what happens to worker 0, restart reason, counted)
    ("exit 1", "Failed", True),
    ("exit 75", "Failed", True),
    ("evicted", "Evicted", False),
    ("node lost", "NodeLost", False),
    ("deleted", "PodDeleted", True),
]


@pytest.mark.parametrize(("cause", "reason", "counted"), RESTART_CAUSES)
def test_restart_by_cause(cause: str, reason: str, counted: bool):
    cluster = FakeCluster()
    running_job(cluster, numSlices=1)
    (pod,) = cluster.pods("j")
    if cause.startswith("exit"):
        cluster.exit_pod(pod, int(cause.split()[1]))
    elif cause == "evicted":
        cluster.evict_pod(pod)
    elif cause == "deleted":  # kubectl delete pod: marked for deletion while running
        asyncio.run(cluster.delete(f"/api/v1/namespaces/ml/pods/{pod}"))
    else:
        node = cluster.pods("j")[pod]["spec"]["nodeName"]
        cluster.add_node(node, "sh", "tpu-v5-lite-podslice", "2x2")
        cluster.set_node_ready(node, False)
    cluster.clear_requests()
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"]) == ("Restarting", 2)
    assert status["lastFailure"]["reason"] == reason
    assert status["lastFailure"]["counted"] is counted
    assert status["countedRestarts"] == int(counted)
    assert status["restartsByReason"] == {reason: 1}
    assert cluster.status_writes() == (1, 0)
    assert cluster.slice("j-0")["spec"]["attempt"] == 2
    assert cluster.recorded.restarts == [("TPUJob", reason)]
    # the old pod goes, then the new attempt's pod is created
    cluster.settle()
    cluster.confirm_deletions()
    cluster.advance(10)  # the default backoff before the first restart
    cluster.settle()
    (new,) = cluster.pods("j").values()
    assert new["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "2"


def test_backoff_delays_the_next_attempt():
    cluster = FakeCluster()
    running_job(cluster, failurePolicy={"backoffSeconds": 10})
    (pod,) = cluster.pods("j")
    cluster.exit_pod(pod, 1)
    assert cluster.reconcile_job("j") == 10.0
    status = cluster.job("j")["status"]
    assert status["restartAt"] == "2026-01-01T00:00:12Z"
    assert cluster.slice("j-0")["spec"]["notBefore"] == status["restartAt"]
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    assert not cluster.pods("j")
    assert "restart backoff" in cluster.job("j")["status"]["message"]
    cluster.advance(10)
    cluster.settle()
    assert len(cluster.pods("j")) == 1


def test_no_slice_starts_the_next_attempt_while_a_pod_of_the_last_is_left_in_the_gang():
    cluster = FakeCluster()
    running_job(cluster, numSlices=2)
    cluster.exit_pod("j-0-0", 1)
    cluster.reconcile_job("j")
    assert [cluster.slice(s)["spec"]["attempt"] for s in ("j-0", "j-1")] == [2, 2]
    cluster.reconcile_slice("j-0")
    cluster.reconcile_slice("j-1")  # both mark their attempt-1 pods for deletion
    cluster.advance(10)  # past the restart backoff
    # Slice j-1's old pod is gone; j-0's is still terminating: j-1 waits for it.
    cluster.confirm_deletion("j-1-0")
    cluster.reconcile_slice("j-1")
    assert sorted(cluster.pods("j")) == ["j-0-0"]
    assert cluster.slice("j-1")["status"]["phase"] == "Restarting"
    cluster.confirm_deletions()
    cluster.settle()
    attempts = {
        p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in cluster.pods("j").values()
    }
    assert sorted(cluster.pods("j")) == ["j-0-0", "j-1-0"] and attempts == {"2"}


def test_max_restarts_fails_the_job():
    cluster = FakeCluster()
    running_job(cluster, failurePolicy={"maxRestarts": 0})
    (pod,) = cluster.pods("j")
    cluster.exit_pod(pod, 1)
    cluster.clear_requests()
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert condition(cluster.job("j"), "Failed")["reason"] == "MaxRestartsExceeded"
    assert cluster.status_writes() == (1, 0)
    assert cluster.slice("j-0")["spec"]["suspend"] is True
    assert cluster.recorded.restarts == []


def test_a_conflicting_status_write_decides_again_and_counts_once():
    cluster = FakeCluster()
    running_job(cluster)
    (pod,) = cluster.pods("j")
    cluster.exit_pod(pod, 1)
    cluster.conflict_next_status_write.add("j")
    assert cluster.reconcile_job("j") == 0.2
    assert cluster.slice("j-0")["spec"]["attempt"] == 1  # nothing acted on
    assert cluster.recorded.restarts == []
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["restarts"] == 1
    assert cluster.recorded.restarts == [("TPUJob", "Failed")]


def test_a_slice_whose_status_write_conflicts_creates_no_pods():
    """A slice commits its status before it acts on its pods, as the job does: a write
    that loses to a concurrent change (409) creates nothing; the next pass does."""
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec())
    cluster.apply_job("j", job_spec())
    cluster.reconcile_job("j")
    for name in ("s", "j-0"):
        cluster.conflict_next_status_write.add(name)
        assert cluster.reconcile_slice(name) == 0.2
        assert not cluster.pods(name.removesuffix("-0"))
        assert cluster.status_writes(contract.SLICE_PLURAL)[1] == 1
        cluster.clear_requests()
        cluster.reconcile_slice(name)
        assert cluster.status_writes(contract.SLICE_PLURAL) == (1, 0)
        assert len(cluster.pods(name.removesuffix("-0"))) == 1
        cluster.clear_requests()


def test_a_slice_whose_status_write_conflicts_makes_and_withdraws_no_provisioning_request():
    """The ProvisioningRequest of queued provisioning (and its PodTemplate) is made, and
    withdrawn, only after the status that names it is written."""
    cluster = FakeCluster()
    queued = {"capacity": "QueuedProvisioning"}
    cluster.apply_slice("s", slice_spec("v6e-16", placement=queued))
    cluster.apply_job("j", job_spec("v6e-16", placement=queued))
    cluster.reconcile_job("j")
    made = ("/podtemplates", "/provisioningrequests")

    def acts() -> list[tuple[str, str]]:
        return [
            (r.verb, r.path)
            for r in cluster.requests
            if r.verb in ("POST", "DELETE") and any(p in r.path for p in made)
        ]

    for name in ("s", "j-0"):
        request = f"{name}-a1-r0"
        cluster.clear_requests()
        cluster.conflict_next_status_write.add(name)
        assert cluster.reconcile_slice(name) == 0.2
        assert acts() == []
        assert not cluster.pods(name.removesuffix("-0"))
        cluster.clear_requests()
        cluster.reconcile_slice(name)
        assert cluster.status_writes(contract.SLICE_PLURAL) == (1, 0)
        writes = [i for i, r in enumerate(cluster.requests) if r.path.endswith(f"/{name}/status")]
        assert [p for _, p in acts()] == [
            "/api/v1/namespaces/ml/podtemplates",
            "/apis/autoscaling.x-k8s.io/v1/namespaces/ml/provisioningrequests",
        ]
        first_act = next(i for i, r in enumerate(cluster.requests) if r.verb == "POST")
        assert writes[0] < first_act  # the status said it first
        assert cluster.slice(name)["status"]["provisioningRequest"] == request
        assert f"ProvisioningRequest {request}" in cluster.slice(name)["status"]["message"]

    # The standalone slice's capacity is no longer queued: its request is withdrawn, once
    # the status that forgets it is written.
    body = cluster.slice("s")
    body["spec"]["placement"] = {}
    body["metadata"]["generation"] += 1
    cluster.clear_requests()
    cluster.conflict_next_status_write.add("s")
    assert cluster.reconcile_slice("s") == 0.2
    assert acts() == []
    assert cluster.slice("s")["status"]["provisioningRequest"] == "s-a1-r0"
    cluster.clear_requests()
    cluster.reconcile_slice("s")
    assert cluster.status_writes(contract.SLICE_PLURAL) == (1, 0)
    assert not cluster.slice("s")["status"].get("provisioningRequest")
    assert [p.rsplit("/", 2)[-2:] for _, p in acts()] == [
        ["provisioningrequests", "s-a1-r0"],
        ["podtemplates", "s-a1-r0"],
    ]


def test_a_slice_whose_status_write_conflicts_forms_and_deletes_no_gke_slice():
    """The GKE Slice of dynamic slicing is formed, and deleted, only after the status that
    says it is written."""
    cluster = FakeCluster()
    for node in cube_nodes("cube-a"):
        cluster.objects[f"/api/v1/nodes/{node['metadata']['name']}"] = node
    sub_slice = {"accelerator": "tpu7x", "topology": "2x2x2", "dynamicSlicing": "SubSlice"}
    cluster.apply_slice("s", {**sub_slice, "template": job_spec()["template"]})
    gke = f"/apis/{contract.SLICE_API_VERSION}/{contract.SLICE_CRD_PLURAL}"
    name = dynamic.slice_name("ml", "s", 1)

    def acts() -> list[tuple[str, str]]:
        return [(r.verb, r.path) for r in cluster.requests if r.verb in ("POST", "DELETE")]

    cluster.conflict_next_status_write.add("s")
    assert cluster.reconcile_slice("s") == 0.2
    assert acts() == []
    cluster.clear_requests()
    cluster.reconcile_slice("s")
    assert cluster.status_writes(contract.SLICE_PLURAL) == (1, 0)
    assert acts()[0] == ("POST", gke)  # after the write
    assert f"form Slice {name} of " in cluster.slice("s")["status"]["message"]
    formed = cluster.objects[f"{gke}/{name}"]
    formed["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]}
    cluster.clear_requests()
    cluster.reconcile_slice("s")
    assert len(cluster.pods("s")) == 2

    body = cluster.slice("s")
    body["spec"]["suspend"] = True
    body["metadata"]["generation"] += 1
    cluster.clear_requests()
    cluster.conflict_next_status_write.add("s")
    assert cluster.reconcile_slice("s") == 0.2
    assert acts() == []
    cluster.clear_requests()
    cluster.reconcile_slice("s")
    assert cluster.status_writes(contract.SLICE_PLURAL) == (1, 0)
    assert ("DELETE", f"{gke}/{name}") in acts()
    assert f"{gke}/{name}" not in cluster.objects


def test_a_resumed_standalone_slice_writes_its_new_attempt_before_its_pods_exist():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec())
    cluster.settle()
    cluster.run_pods("s")
    cluster.settle()
    suspend_until_stopped(cluster, "s")
    assert not cluster.pods("s")
    cluster.slice("s")["spec"]["suspend"] = False
    cluster.conflict_next_status_write.add("s")
    cluster.reconcile_slice("s")
    assert not cluster.pods("s")  # attempt 2 is not written yet: none of its pods exist
    assert cluster.slice("s")["status"]["attempt"] == 1
    cluster.reconcile_slice("s")
    assert cluster.slice("s")["status"]["attempt"] == 2
    (pod,) = cluster.pods("s").values()
    assert pod["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "2"


def test_standalone_slice_restart_is_counted_once_when_its_write_conflicts():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec())
    cluster.settle()
    cluster.run_pods("s")
    cluster.settle()
    (pod,) = cluster.pods("s")
    cluster.exit_pod(pod, 1)
    cluster.conflict_next_status_write.add("s")
    cluster.reconcile_slice("s")
    assert cluster.recorded.restarts == []
    cluster.reconcile_slice("s")
    assert cluster.slice("s")["status"]["restarts"] == 1
    assert cluster.recorded.restarts == [("TPUSlice", "Failed")]


# success


@pytest.mark.parametrize(
    ("policy", "exits", "expected"),
    [
        ("AllWorkers", {"j-0-0": 0}, "Running"),
        ("AllWorkers", {"j-0-0": 0, "j-0-1": 0}, "Succeeded"),
        ("LeaderWorker", {"j-0-0": 0}, "Succeeded"),
        ("LeaderWorker", {"j-0-1": 0}, "Running"),
    ],
)
def test_success_policies(policy: str, exits: dict[str, int], expected: str):
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    running_job(cluster, type_="v5p-16", successPolicy=policy)
    for pod, code in exits.items():
        cluster.exit_pod(pod, code)
    cluster.clear_requests()
    cluster.reconcile_job("j")
    assert phase(cluster, "j") == expected
    if expected == "Succeeded":
        assert cluster.status_writes() == (1, 0)
        assert cluster.job("j")["status"]["completionTime"]
        assert "nodePools" not in cluster.job("j")["status"]
        assert cluster.recorded.reasons("j")[-1] == "Succeeded"


# suspend, deadline, TTL, invalid


def test_suspend_and_resume():
    cluster = FakeCluster()
    running_job(cluster)
    cluster.edit_job("j", {"suspend": True})
    cluster.clear_requests()
    cluster.reconcile_job("j")
    assert cluster.status_writes() == (1, 0)
    assert phase(cluster, "j") == "Suspended"
    assert cluster.slice("j-0")["spec"]["suspend"] is True
    cluster.settle()
    assert cluster.job("j")["status"]["message"] == "suspended; 1 pods still stopping"
    cluster.confirm_deletions()
    cluster.settle()
    assert cluster.job("j")["status"]["message"] == "suspended"
    cluster.edit_job("j", {"suspend": False})
    cluster.clear_requests()
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"]) == ("Pending", 2)
    assert cluster.status_writes() == (1, 0)
    assert cluster.recorded.reasons("j")[-1] == "Resumed"
    assert cluster.slice("j-0")["spec"] == {
        **cluster.slice("j-0")["spec"],
        "attempt": 2,
        "suspend": False,
    }
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert phase(cluster, "j") == "Running"


def test_a_resumed_job_follows_its_new_pods_and_books_its_suspension():
    """Each attempt has its own runningSince: a resumed job whose pods are not scheduled
    yet is Starting (not Running on the strength of the attempt before the suspension),
    and its goodput books the suspended time as ``suspended``, the wait after the resume
    as ``scheduling``, and neither as productive."""
    cluster = FakeCluster()
    running_job(cluster)
    assert cluster.job("j")["status"]["runningSince"] == "2026-01-01T00:00:01Z"
    cluster.advance(100)
    suspended_at = cluster.now
    cluster.edit_job("j", {"suspend": True})
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status.get("runningSince")) == ("Suspended", None)
    cluster.advance(50)
    resumed_at = cluster.now
    cluster.edit_job("j", {"suspend": False})
    cluster.settle()
    cluster.advance(10)
    cluster.settle()  # the new pods exist and no node took them yet
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2
    assert (status["phase"], status.get("runningSince")) == ("Starting", None)
    assert status["message"] == "attempt 2: 0/1 workers ready"
    suspended = (resumed_at - suspended_at).total_seconds()
    assert status["goodput"]["badputSeconds"]["suspended"] == suspended
    ran_at = cluster.now
    cluster.run_pods("j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Running"
    assert status["runningSince"] == ran_at.strftime("%Y-%m-%dT%H:%M:%SZ")  # its own
    badput = status["goodput"]["badputSeconds"]
    assert badput["suspended"] == suspended
    # 1 s before attempt 1 ran, and from the resume until attempt 2 ran.
    assert badput["scheduling"] == 1.0 + (ran_at - resumed_at).total_seconds()
    assert badput["restartDowntime"] == 0.0
    assert status["goodput"]["productiveSeconds"] == 0.0


def test_a_job_created_suspended_creates_nothing():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec(suspend=True))
    cluster.settle()
    assert phase(cluster, "j") == "Suspended"
    assert not [k for k in cluster.objects if "/tpuslices/" in k]


def test_deadline_fails_the_job():
    cluster = FakeCluster()
    running_job(cluster, activeDeadlineSeconds=60)
    assert cluster.reconcile_job("j") == pytest.approx(60, abs=2)
    cluster.advance(61)
    cluster.reconcile_job("j")
    assert phase(cluster, "j") == "Failed"
    assert condition(cluster.job("j"), "Failed")["reason"] == "DeadlineExceeded"


def test_ttl_deletes_the_finished_job():
    cluster = FakeCluster()
    running_job(cluster, ttlSecondsAfterFinished=30)
    (pod,) = cluster.pods("j")
    cluster.exit_pod(pod, 0)
    cluster.reconcile_job("j")
    assert phase(cluster, "j") == "Succeeded"
    assert cluster.reconcile_job("j") == 30.0
    cluster.advance(30)
    cluster.reconcile_job("j")
    assert not [k for k in cluster.objects if "/tpujobs/" in k]


def test_invalid_spec_fails_once_with_a_clear_message():
    cluster = FakeCluster()
    cluster.apply_job("j", {"slice": {"type": "v5p-3"}, "template": {}})
    cluster.reconcile_job("j")
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith("invalid spec:")
    assert cluster.status_writes() == (1, 0)
    assert cluster.recorded.reasons("j") == ["Invalid"]


def test_a_service_owned_by_another_object_is_reported_not_shared():
    cluster = FakeCluster()
    cluster.apply_slice("x", slice_spec())
    cluster.settle()
    cluster.apply_job("x", job_spec())
    cluster.settle()
    cluster.run_pods("x")
    cluster.settle()
    message = cluster.job("x")["status"]["message"]
    assert "Service ml/x belongs to TPUSlice x" in message
    assert cluster.recorded.reasons("x").count("ServiceConflict") == 1
    assert "belongs to" not in cluster.slice("x")["status"]["message"]


# pools GKE creates (placement.provisioning: Auto) and machine types

SLICE_POOL = "tpu-operator.dev/slice-pool"
V6E_2X4 = ("tpu-v6e-slice", "2x4")


def typed_pool(
    cluster: FakeCluster,
    pool: str,
    shape: tuple[str, str],
    vms: int,
    chips: int,
    *,
    slice_pool: str | None = None,
) -> list[str]:
    """A pool whose nodes carry GKE's machine type label (and a slice-pool label)."""
    prefix = {"tpu-v6e-slice": "ct6e-standard", "tpu-v5p-slice": "ct5p-hightpu"}[shape[0]]
    names = [f"{pool}-n{i}" for i in range(vms)]
    for name in names:
        cluster.add_node(name, pool, *shape, chips=chips)
        labels = cluster.objects[f"/api/v1/nodes/{name}"]["metadata"]["labels"]
        labels["node.kubernetes.io/instance-type"] = f"{prefix}-{chips}t"
        if slice_pool:
            labels[SLICE_POOL] = slice_pool
    return names


def unschedulable(cluster: FakeCluster, owner: str) -> None:
    for pod in cluster.pods(owner).values():
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 node(s) didn't match node selector",
            }
        ]


def bind_to_claim_pools(cluster: FakeCluster, owner: str) -> None:
    """The scheduler: each Pending pod onto a free node carrying its slice-pool label."""
    nodes = [o for k, o in cluster.objects.items() if k.startswith("/api/v1/nodes/")]
    taken = {p["spec"].get("nodeName") for p in cluster.pods().values()}
    for pod in cluster.pods(owner).values():
        if pod["status"]["phase"] != "Pending" or pod["metadata"].get("deletionTimestamp"):
            continue
        selector = pod["spec"]["nodeSelector"]
        node = next(
            n["metadata"]["name"]
            for n in nodes
            if n["metadata"]["name"] not in taken
            and all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())
        )
        taken.add(node)
        pod["spec"]["nodeName"] = node
        cluster._set_pod(pod, "Running", ready=True)


def auto(**extra: Any) -> dict[str, Any]:
    return {"placement": {"provisioning": "Auto"}, **extra}


def test_without_a_free_pool_slices_ask_gke_for_pools_of_their_own():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2, **auto()))
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    refs = status["nodePools"]
    assert len(refs) == 2 and len(set(refs)) == 2
    assert all(r.startswith("auto:j-") for r in refs)
    assert "GKE is to create the node pools of slices 0, 1" in status["message"]
    assert cluster.recorded.reasons("j") == ["WaitingForNodePools"] * 2
    assert cluster.status_writes() == (1, 0)
    cluster.settle()
    pods = cluster.pods("j")
    assert len(pods) == 4
    for pod in pods.values():
        claim = refs[int(pod["metadata"]["labels"][contract.LABEL_SLICE_INDEX])][5:]
        assert pod["spec"]["nodeSelector"][SLICE_POOL] == claim
        assert contract.NODE_LABEL_NODEPOOL not in pod["spec"]["nodeSelector"]
        toleration = {"key": SLICE_POOL, "operator": "Equal", "value": claim}
        assert {**toleration, "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    unschedulable(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["message"].startswith("attempt 1: waiting for GKE to create node pools: ")
    assert "Unschedulable" not in cluster.recorded.reasons("j")
    assert condition(cluster.job("j"), "PodsScheduled")["reason"] == "WaitingForNodePools"

    # GKE creates one pool per slice, labelled and tainted with the slice's value
    typed_pool(cluster, "nap-a", V5P, 2, 4, slice_pool=refs[0][5:])
    typed_pool(cluster, "nap-b", V5P, 2, 4, slice_pool=refs[1][5:])
    cluster.clear_requests()
    cluster.settle()
    assert cluster.job("j")["status"]["nodePools"] == ["nap-a", "nap-b"]
    assert cluster.slice("j-0")["spec"]["nodePool"] == "nap-a"
    # The pools are there: their pods are placed, and the wait is over.
    assert cluster.recorded.reasons("j")[-2:] == ["NodePoolsAssigned", "WaitEnded"]
    assert [reason for reason, _ in cluster.recorded.waits] == ["WaitingForNodePools"]
    assert cluster.status_writes()[1] == 0

    # another job may not take them while j's pods (selecting the label) are there
    cluster.apply_job("k", job_spec("v5p-16"))
    cluster.settle()
    message = cluster.job("k")["status"]["message"]
    assert "nap-a is held by TPUJob ml/j" in message and "nap-b is held by TPUJob ml/j" in message


def test_pods_waiting_for_a_spot_pool_gke_does_not_create_start_again_on_demand():
    cluster = FakeCluster()
    placement = {
        "provisioning": "Auto",
        "spot": True,
        "fallbacks": [{"afterSeconds": 300, "spot": False}],
    }
    cluster.apply_job("j", job_spec("v5p-16", placement=placement))
    cluster.settle()
    first = cluster.job("j")["status"]["nodePools"]
    (old,) = first
    pods = cluster.pods("j")
    assert len(pods) == 2
    assert all(p["spec"]["nodeSelector"][contract.NODE_LABEL_SPOT] == "true" for p in pods.values())
    unschedulable(cluster, "j")
    cluster.settle()
    assert condition(cluster.job("j"), "PodsScheduled")["reason"] == "WaitingForNodePools"
    cluster.advance(290)
    cluster.settle()
    assert cluster.job("j")["status"]["attempt"] == 1
    cluster.advance(10)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2 and status["fallback"]["step"] == 1
    assert status["restarts"] == 0 and not status.get("lastFailure")
    (new,) = status["nodePools"]
    assert new.startswith("auto:j-0-") and new != old  # a pool of its own for the new step
    assert cluster.recorded.reasons("j").count("CapacityFallback") == 1
    assert cluster.slice("j-0")["spec"]["placement"] == {"provisioning": "Auto", "spot": False}
    assert cluster.confirm_deletions() == 2  # attempt 1's pods, before any of attempt 2
    cluster.settle()
    pods = cluster.pods("j")
    assert len(pods) == 2
    for pod in pods.values():
        assert pod["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "2"
        assert contract.NODE_LABEL_SPOT not in pod["spec"]["nodeSelector"]
        assert pod["spec"]["nodeSelector"][SLICE_POOL] == new[5:]


def test_a_restart_stays_on_the_pools_gke_created_and_tolerates_their_taint():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v5p-16", **auto(failurePolicy={"backoffSeconds": 0})))
    cluster.settle()
    (ref,) = cluster.job("j")["status"]["nodePools"]
    typed_pool(cluster, "nap-a", V5P, 2, 4, slice_pool=ref[5:])
    bind_to_claim_pools(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["nodePools"]) == ("Running", ["nap-a"])
    cluster.exit_pod("j-0-1", 1)
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    pods = cluster.pods("j")
    assert {p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in pods.values()} == {"2"}
    for pod in pods.values():
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] == "nap-a"
        assert SLICE_POOL not in pod["spec"]["nodeSelector"]
        assert {
            "key": SLICE_POOL,
            "operator": "Equal",
            "value": ref[5:],
            "effect": "NoSchedule",
        } in (pod["spec"]["tolerations"])
    assert cluster.job("j")["status"]["nodePools"] == ["nap-a"]


def test_a_free_pool_is_still_taken_first_when_gke_could_create_one():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2, **auto()))
    cluster.settle()
    pools = cluster.job("j")["status"]["nodePools"]
    assert pools[0] == "p1" and pools[1].startswith("auto:")


def test_a_standalone_slice_asks_gke_for_a_pool_and_records_it():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec("v5p-16", **auto()))
    cluster.settle()
    ref = cluster.slice("s")["status"]["nodePool"]
    assert ref.startswith("auto:s-")
    assert {p["spec"]["nodeSelector"][SLICE_POOL] for p in cluster.pods("s").values()} == {ref[5:]}
    typed_pool(cluster, "nap-s", V5P, 2, 4, slice_pool=ref[5:])
    cluster.settle()
    assert cluster.slice("s")["status"]["nodePool"] == "nap-s"


def test_pools_are_matched_on_chips_per_vm():
    cluster = FakeCluster()
    typed_pool(cluster, "p8", V6E_2X4, 2, 8)  # two single-host 8-chip VMs
    typed_pool(cluster, "p4", V6E_2X4, 2, 4)  # one slice of two 4-chip VMs
    cluster.apply_job("a", job_spec("v6e-8", slice={"type": "v6e-8", "chipsPerHost": 4}))
    cluster.settle()
    assert cluster.job("a")["status"]["nodePools"] == ["p4"]
    cluster.apply_job("b", job_spec("v6e-8", slice={"type": "v6e-8", "chipsPerHost": 4}))
    cluster.settle()
    message = cluster.job("b")["status"]["message"]
    assert "p8 has 8-chip VMs (ct6e-standard-8t); the slice needs 4-chip VMs" in message
    assert "p4 is held by TPUJob ml/a" in message
    assert not cluster.job("b")["status"].get("nodePools")


def test_an_unset_chips_per_host_takes_the_machine_type_the_cluster_has():
    cluster = FakeCluster()
    typed_pool(cluster, "p4", V6E_2X4, 2, 4)
    cluster.apply_job("j", job_spec("v6e-8"))
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["shape"]["chipsPerHost"], status["shape"]["hosts"]) == (4, 2)
    assert status["shape"]["machineType"] == "ct6e-standard-4t"
    assert status["nodePools"] == ["p4"]
    assert cluster.slice("j-0")["spec"]["chipsPerHost"] == 4
    pods = cluster.pods("j").values()
    assert len(pods) == 2
    for pod in pods:
        worker = pod["spec"]["containers"][0]
        assert worker["resources"]["limits"][contract.TPU_RESOURCE] == "4"
    (event,) = [m for _, _, r, m in cluster.recorded.events if r == "NodePoolsAssigned"]
    assert "slice 0 -> p4" in event and "4-chip VMs (ct6e-standard-4t)" in event
    # decided once: later reconciles keep it, whatever the cluster shows
    typed_pool(cluster, "p8", V6E_2X4, 1, 8)
    cluster.settle()
    assert cluster.job("j")["status"]["shape"]["chipsPerHost"] == 4


def test_with_neither_machine_type_a_job_waits_and_takes_the_one_that_appears():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v6e-8"))
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending" and not status.get("attempt")
    assert (
        "either machine type, ct6e-standard-8t (1 VM of 8 chips) or ct6e-standard-4t "
        "(2 VMs of 4 chips): the cluster has neither" in status["message"]
    )
    (scheduled,) = [c for c in status["conditions"] if c["type"] == "PodsScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "WaitingForNodePools")
    assert not cluster.pods("j") and not any("/tpuslices/" in k for k in cluster.objects)
    typed_pool(cluster, "p4", V6E_2X4, 2, 4)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["shape"]["machineType"] == "ct6e-standard-4t"
    assert (status["attempt"], status["nodePools"]) == (1, ["p4"])
    assert len(cluster.pods("j")) == 2


def test_with_neither_machine_type_a_job_that_provisions_asks_gke_for_the_default():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v6e-8", placement={"provisioning": "Auto"}))
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 1
    assert (status["shape"]["machineType"], status["shape"]["hosts"]) == ("ct6e-standard-8t", 1)
    (pod,) = cluster.pods("j").values()
    worker = pod["spec"]["containers"][0]
    assert worker["resources"]["limits"][contract.TPU_RESOURCE] == "8"


def test_a_job_waiting_for_a_spot_pool_falls_back_to_on_demand_after_its_limit():
    cluster = FakeCluster()
    cluster.add_pool("od", *V5P, hosts=2)  # on-demand VMs only
    placement = {"spot": True, "fallbacks": [{"afterSeconds": 600, "spot": False}]}
    cluster.apply_job("j", job_spec("v5p-16", placement=placement))
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending" and not status.get("nodePools")
    assert "od is on-demand" in status["message"] and "fallback" not in status
    cluster.advance(590)
    cluster.settle()
    assert not cluster.job("j")["status"].get("nodePools")
    cluster.advance(10)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["nodePools"]) == (1, ["od"])
    assert (status["fallback"]["step"], status["fallback"]["capacity"]) == (1, "on-demand")
    (moved,) = [m for _, _, r, m in cluster.recorded.events if r == "CapacityFallback"]
    assert moved.endswith("falling back to step 1 of placement.fallbacks: on-demand")
    placed = cluster.slice("j-0")["spec"]["placement"]
    assert placed == {"spot": False}
    for pod in cluster.pods("j").values():
        assert contract.NODE_LABEL_SPOT not in pod["spec"]["nodeSelector"]
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert {"key": contract.NODE_LABEL_SPOT, "operator": "NotIn", "values": ["true"]} in (
            terms[0]["matchExpressions"]
        )


def test_with_both_machine_types_a_job_takes_the_free_one():
    cluster = FakeCluster()
    typed_pool(cluster, "p8", V6E_2X4, 1, 8)
    typed_pool(cluster, "p4", V6E_2X4, 2, 4)
    cluster.apply_job("a", job_spec("v6e-8"))  # both free: the default, one 8-chip VM
    cluster.settle()
    assert cluster.job("a")["status"]["shape"]["chipsPerHost"] == 8
    cluster.run_pods("a")
    cluster.settle()
    (pod,) = cluster.pods("a").values()
    assert pod["spec"]["nodeName"] == "p8-n0"
    cluster.apply_job("b", job_spec("v6e-8"))  # the 8-chip VM is busy: two 4-chip VMs
    cluster.settle()
    status = cluster.job("b")["status"]
    assert (status["shape"]["chipsPerHost"], status["nodePools"]) == (4, ["p4"])


def test_a_pinned_pool_of_another_machine_type_is_refused():
    cluster = FakeCluster()
    typed_pool(cluster, "p8", V6E_2X4, 2, 8)
    spec = job_spec("v6e-8", placement={"nodePools": ["p8"]})
    spec["slice"]["chipsPerHost"] = 4
    cluster.apply_job("j", spec)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending" and not status.get("nodePools")
    assert "pinned node pool p8 cannot run it: its VMs are 8-chip VMs" in status["message"]


def test_workers_ending_one_by_one_never_take_the_job_or_slice_out_of_running():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    running_job(cluster, type_="v5p-16")
    # The kubelet reports the container's end first and the pod's phase a moment later.
    cluster.exit_container("j-0-0", 0)
    cluster.settle()
    assert phase(cluster, "j") == "Running"
    assert cluster.slice("j-0")["status"]["phase"] == "Running"
    cluster.exit_pod("j-0-0", 0)
    cluster.exit_container("j-0-1", 0)
    cluster.settle()
    assert phase(cluster, "j") == "Succeeded"
    assert cluster.recorded.reasons("j").count("Running") == 1
    assert cluster.recorded.reasons("j-0", kind="TPUSlice").count("Running") == 1
    assert cluster.job("j")["status"]["slices"][0]["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("num_slices", "held"),
    [
        # The slice last wrote 2.5 s before (settle() lets 1 s pass after it; then 1.5).
        (None, 0.0),  # a standalone slice: its counters go out after the 1 s interval
        (1, 0.0),
        (4, 1.5),  # the job's status carries each slice's ready count: 4 intervals
        (64, 7.5),  # capped at 10 s
    ],
)
def test_a_slice_of_a_larger_job_writes_its_counters_less_often(num_slices, held):
    cluster = FakeCluster()
    if num_slices is None:
        name = "s"
        cluster.apply_slice(name, slice_spec())
    else:
        name = "j-0"
        cluster.apply_job("j", job_spec(numSlices=num_slices))
    cluster.settle()
    cluster.run_pods()
    cluster.settle()
    assert cluster.slice(name)["status"]["phase"] == "Running"
    (pod,) = cluster.pods(name)
    cluster.advance(1.5)
    cluster.set_ready(pod, False)  # only the slice's counters and message move
    cluster.clear_requests()
    requeue = cluster.reconcile_slice(name)
    writes = cluster.status_writes(contract.SLICE_PLURAL)[0]
    assert writes == (0 if held else 1)
    if held:
        assert requeue == pytest.approx(held)
        assert cluster.slice(name)["status"]["readyWorkers"] == 1
        cluster.advance(held)
        cluster.reconcile_slice(name)
        assert cluster.status_writes(contract.SLICE_PLURAL)[0] == 1
    assert cluster.slice(name)["status"]["readyWorkers"] == 0
    assert cluster.slice(name)["status"]["phase"] == "Running"


def test_a_resumed_job_takes_the_free_pool_gke_created_for_it_first():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec("v5p-16", **auto()))
    cluster.settle()
    (ref,) = cluster.job("j")["status"]["nodePools"]
    unschedulable(cluster, "j")
    cluster.settle()
    assert phase(cluster, "j") == "Starting"
    typed_pool(cluster, "nap-a", V5P, 2, 4, slice_pool=ref[5:])
    bind_to_claim_pools(cluster, "j")
    cluster.settle()
    cluster.edit_job("j", {"suspend": True})
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    cluster.edit_job("j", {"suspend": False})
    cluster.settle()
    assert cluster.job("j")["status"]["nodePools"] == ["nap-a"]
    for pod in cluster.pods("j").values():
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] == "nap-a"
        assert any(t.get("value") == ref[5:] for t in pod["spec"]["tolerations"])


def test_a_standalone_slice_says_what_a_job_says_of_its_wait_for_a_pool_and_its_resume():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec("v5p-16"))
    cluster.settle()
    cluster.settle()
    status = cluster.slice("s")["status"]
    assert status["phase"] == "Pending"
    assert "the cluster has no TPU node pools" in status["message"]
    # Once per wait, not once per look at the pools.
    assert cluster.recorded.reasons("s", contract.SLICE_KIND) == ["WaitingForNodePools"]
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.settle()
    cluster.run_pods("s")
    cluster.settle()
    suspend_until_stopped(cluster, "s")
    cluster.slice("s")["spec"]["suspend"] = False
    cluster.settle()
    reasons = cluster.recorded.reasons("s", contract.SLICE_KIND)
    assert reasons.count("WaitingForNodePools") == 1
    assert reasons[-1] == "Resumed"
    resumed = [m for _, _, r, m in cluster.recorded.events if r == "Resumed"]
    assert resumed == ["resumed as attempt 2"]
    # A job's slices leave these events to their job.
    cluster.apply_job("j", job_spec("v5p-16"))
    cluster.settle()
    assert "WaitingForNodePools" in cluster.recorded.reasons("j")
    assert "WaitingForNodePools" not in cluster.recorded.reasons("j-0", contract.SLICE_KIND)


def test_a_suspended_standalone_slice_hands_its_pool_over_without_a_restart():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_slice("serve", slice_spec("v5p-16"))
    cluster.settle()
    cluster.run_pods("serve")
    cluster.settle()
    cluster.apply_job("train", job_spec("v5p-16"))
    cluster.settle()
    assert "held by TPUSlice ml/serve" in cluster.job("train")["status"]["message"]
    body = cluster.slice("serve")
    body["spec"]["suspend"] = True
    body["metadata"]["generation"] += 1
    cluster.settle()
    status = cluster.slice("serve")["status"]
    assert status["phase"] == "Suspended"
    assert status.get("restarts", 0) == 0
    assert "Restarting" not in cluster.recorded.reasons("serve", kind="TPUSlice")
    cluster.confirm_deletions()
    cluster.settle()
    assert cluster.job("train")["status"]["nodePools"] == ["p1"]


def test_a_standalone_slice_resumes_as_a_new_attempt_whatever_its_stopped_pods_exited_with():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec())
    cluster.settle()
    cluster.run_pods("s")
    cluster.settle()
    body = cluster.slice("s")
    body["spec"]["suspend"] = True
    cluster.settle()
    cluster.exit_pod("s-0", 0)  # its SIGTERM handler checkpointed and exited 0
    cluster.settle()
    assert cluster.slice("s")["status"]["phase"] == "Suspended"
    cluster.confirm_deletions()
    cluster.settle()
    body = cluster.slice("s")
    body["spec"]["suspend"] = False
    cluster.settle()
    status = cluster.slice("s")["status"]
    assert (status["attempt"], status.get("restarts", 0)) == (2, 0)
    (pod,) = cluster.pods("s").values()
    assert pod["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "2"


class OneTrack:
    """The progress sampler's side, for one job: a fixed track."""

    publish_interval = 30.0

    def __init__(self, track: Any) -> None:
        self._track = track

    def track(self, namespace: str, name: str) -> Any:
        return self._track


def test_a_stalled_job_is_restarted_as_a_gang_from_its_last_step():
    from tests.unit.fakeapi import T0
    from tpu_operator.progress.samples import WorkerSample
    from tpu_operator.progress.tracker import JobTrack

    cluster = FakeCluster()
    running_job(cluster, monitoring={"stallTimeout": "60s"})
    track = JobTrack(attempt=1)
    worker = track.worker("j-0-0", 0, 0, "n0")
    started = T0.timestamp()
    track.observe(
        worker,
        WorkerSample(at=started + 5, steps_total=7, step=7, start_time=started, phases={}),
    )
    cluster.ctx.progress = OneTrack(track)
    cluster.advance(30)
    cluster.reconcile_job("j")
    assert phase(cluster, "j") == "Running"
    cluster.advance(60)
    cluster.clear_requests()
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["phase"], status["lastFailure"]["reason"]) == ("Restarting", "Stalled")
    assert status["lastFailure"]["time"] == "2026-01-01T00:00:05Z"  # the last step
    assert condition(cluster.job("j"), "Stalled")["status"] == "True"
    assert cluster.status_writes() == (1, 0)
    assert cluster.recorded.reasons("j")[-2:] == ["Stalled", "Restarting"]


def test_a_suspended_slice_deletes_a_pod_it_counts_as_lost_that_still_runs():
    """A pod on a node lost to the slice (not ready, or a cube GKE marked unhealthy) is a
    failure to the gang, not an active pod, yet it runs: stopping the slice deletes it
    too, or the job would wait for it for ever ("1 pods still stopping")."""
    cluster = FakeCluster()
    running_job(cluster)
    (pod,) = cluster.pods().values()
    cluster.set_node_ready(pod["spec"]["nodeName"], False)
    cluster.edit_job("j", {"suspend": True})
    cluster.clear_requests()
    cluster.settle()
    deletes = [r.path for r in cluster.requests if r.verb == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/j-0-0"]
    cluster.confirm_deletions()
    cluster.settle()
    assert cluster.job("j")["status"]["message"] == "suspended"
