"""The job reconciler as a Kueue integration, over the in-memory API (tests/unit/fakeapi.py).

Kueue itself is played by the test: it admits a Workload (status.admission, QuotaReserved
and Admitted True), evicts it (Evicted True) and re-admits it after the operator gave the
quota back (admission cleared).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest

from tests.unit.fakeapi import NS, FakeCluster
from tests.unit.test_dynamic_slicing_parts import cube_nodes
from tpu_operator import contract, controllers
from tpu_operator.builders.workload import POD_SET, WORKLOAD_PLURAL
from tpu_operator.policies import slice_check
from tpu_operator.reconcile.queueing import POSITION_SECONDS, pending_positions
from tpu_operator.reconcile.slice_check import SETTLED_SECONDS

pytestmark = pytest.mark.unit

QUEUE = {contract.LABEL_KUEUE_QUEUE: "tpu"}


def job_spec(type_: str = "v5litepod-4", **extra: Any) -> dict[str, Any]:
    return {
        "slice": {"type": type_},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        **extra,
    }


class KueueCluster(FakeCluster):
    """The fake cluster with the operator's Workload cache (``--kueue``)."""

    def _index(self) -> None:
        super()._index()
        index: defaultdict[Any, list[Any]] = defaultdict(list)
        for key, obj in self.objects.items():
            if f"/{WORKLOAD_PLURAL}/" in key:
                meta = obj["metadata"]
                keys = asyncio.run(controllers.tpu_workloads(body=obj, namespace=meta["namespace"]))
                for k, v in (keys or {}).items():
                    index[k].append(v)
        self.caches.attach_workloads(index)

    def workloads(self) -> list[dict[str, Any]]:
        return [o for k, o in self.objects.items() if f"/{WORKLOAD_PLURAL}/" in k]

    def workload(self) -> dict[str, Any]:
        (found,) = self.workloads()
        return found

    def _bump(self, wl: dict[str, Any]) -> None:
        wl["metadata"]["resourceVersion"] = str(next(self._rv))

    def admit(self, pools: list[str] | None = None, hosts: int = 1) -> None:
        wl = self.workload()
        assignment: dict[str, Any] = {"name": POD_SET, "flavors": {"google.com/tpu": "v5e"}}
        if pools:
            assignment["topologyAssignment"] = {
                "levels": [contract.NODE_LABEL_NODEPOOL],
                "slices": [
                    {
                        "domainCount": len(pools),
                        "valuesPerLevel": [{"individual": {"roots": pools}}],
                        "podCounts": {"universal": hosts},
                    }
                ],
            }
        wl["status"] = {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [assignment]},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
        }
        self._bump(wl)

    def pend(self, message: str = "insufficient unused quota for google.com/tpu") -> None:
        wl = self.workload()
        wl["status"] = {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                }
            ]
        }
        self._bump(wl)

    def evict(self, reason: str = "Preempted") -> None:
        wl = self.workload()
        wl["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": reason, "message": "preempted"}
        )
        self._bump(wl)


def phase(cluster: FakeCluster, name: str = "j") -> str:
    return cluster.job(name)["status"]["phase"]


def condition(cluster: FakeCluster, type_: str, name: str = "j") -> dict[str, Any]:
    return next(c for c in cluster.job(name)["status"]["conditions"] if c["type"] == type_)


def test_a_queued_job_creates_its_workload_and_no_pods_until_admitted():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(numSlices=2), labels=QUEUE)
    cluster.settle()
    assert phase(cluster) == "Queued"
    assert not cluster.pods() and not [k for k in cluster.objects if "/tpuslices/" in k]
    wl = cluster.workload()
    assert wl["spec"]["queueName"] == "tpu"
    assert wl["spec"]["podSets"][0]["count"] == 2
    cluster.pend()
    cluster.settle()
    assert condition(cluster, "Queued")["status"] == "True"
    assert condition(cluster, "Queued")["reason"] == "Pending"
    assert "insufficient" in cluster.job("j")["status"]["queue"]["message"]
    assert not cluster.pods()
    assert len(cluster.workloads()) == 1  # created once

    cluster.admit()
    cluster.settle()
    assert len(cluster.pods("j")) == 2
    status = cluster.job("j")["status"]
    assert status["attempt"] == 1
    assert status["queue"]["state"] == "Admitted"
    assert status["queue"]["clusterQueue"] == "cq"
    assert condition(cluster, "Admitted")["status"] == "True"
    assert condition(cluster, "Queued")["status"] == "False"
    assert "Admitted" in cluster.recorded.reasons("j")

    cluster.run_pods("j")
    cluster.settle()
    assert phase(cluster) == "Running"
    pods_ready = [c for c in cluster.workload()["status"]["conditions"] if c["type"] == "PodsReady"]
    assert pods_ready and pods_ready[0]["status"] == "True"


VISIBILITY = (
    "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/ml/localqueues/tpu/pendingworkloads"
)


def visibility_reads(cluster: FakeCluster) -> int:
    return sum(1 for r in cluster.requests if r.verb == "GET" and r.path == VISIBILITY)


def test_a_queued_job_shows_its_position_from_kueue_s_visibility_api():
    cluster = KueueCluster()
    cluster.objects[VISIBILITY] = {"kind": "PendingWorkloadsSummary", "items": []}
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.pend()
    name = cluster.workload()["metadata"]["name"]
    cluster.objects[VISIBILITY]["items"] = [
        {"metadata": {"name": "other"}, "positionInLocalQueue": 0, "positionInClusterQueue": 0},
        {"metadata": {"name": name}, "positionInLocalQueue": 1, "positionInClusterQueue": 3},
    ]
    cluster.advance(POSITION_SECONDS)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["queue"]["positionInLocalQueue"], status["queue"]["positionInClusterQueue"]) == (
        1,
        3,
    )
    assert status["message"].startswith(
        "queued in tpu at position 1 (ClusterQueue position 3; 0 is next): insufficient"
    )
    reads = visibility_reads(cluster)
    assert reads >= 1
    # one read per LocalQueue every POSITION_SECONDS, however often the job reconciles
    cluster.reconcile_job("j")
    assert visibility_reads(cluster) == reads
    # the position moves: seen at the next read
    cluster.objects[VISIBILITY]["items"] = cluster.objects[VISIBILITY]["items"][1:]
    cluster.objects[VISIBILITY]["items"][0]["positionInLocalQueue"] = 0
    cluster.advance(POSITION_SECONDS)
    cluster.settle()
    assert cluster.job("j")["status"]["queue"]["positionInLocalQueue"] == 0
    # admitted: no position, no more reads
    cluster.admit()
    cluster.settle()
    reads = visibility_reads(cluster)
    assert "positionInLocalQueue" not in cluster.job("j")["status"]["queue"]
    cluster.advance(POSITION_SECONDS)
    cluster.settle()
    assert visibility_reads(cluster) == reads


def test_without_the_visibility_api_a_queued_job_shows_kueue_s_message_alone():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.pend()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert "positionInLocalQueue" not in status["queue"]
    assert status["message"].startswith("queued in tpu: insufficient")
    reads = visibility_reads(cluster)
    assert reads == 1
    cluster.advance(POSITION_SECONDS)
    cluster.settle()
    assert visibility_reads(cluster) == reads  # not asked again for UNSERVED_SECONDS


def test_pending_positions_read_kueue_s_summary():
    summary = {
        "items": [
            {"metadata": {"name": "a"}, "positionInLocalQueue": 0, "positionInClusterQueue": 2},
            {"metadata": {"name": "b"}, "positionInLocalQueue": 1},  # incomplete: left out
            {"metadata": {}, "positionInLocalQueue": 1, "positionInClusterQueue": 1},
        ]
    }
    assert pending_positions(summary) == {"a": (0, 2)}
    assert pending_positions({}) == {}


def test_a_job_without_the_queue_label_is_left_to_the_operator():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec())
    cluster.settle()
    assert phase(cluster) == "Starting"
    assert not cluster.workloads()
    assert "queue" not in cluster.job("j")["status"]


def test_eviction_stops_the_pods_then_gives_the_quota_back_and_resumes_as_a_new_attempt():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert phase(cluster) == "Running"

    cluster.evict("Preempted")
    cluster.settle()
    assert phase(cluster) == "Queued"
    assert condition(cluster, "Evicted")["reason"] == "Preempted"
    assert "WorkloadEvicted" in cluster.recorded.reasons("j")
    # The pods are stopping: the quota is kept until they are gone.
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods("j").values())
    assert cluster.workload()["status"].get("admission")
    assert condition(cluster, "PodsStopped")["status"] == "False"

    cluster.confirm_deletions()
    cluster.settle()
    assert condition(cluster, "PodsStopped")["status"] == "True"
    wl = cluster.workload()
    assert wl["status"].get("admission") is None
    requeued = next(c for c in wl["status"]["conditions"] if c["type"] == "Requeued")
    assert requeued["status"] == "True"

    cluster.admit()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2
    assert status["restarts"] == 0  # a new attempt, not a restart
    assert status["queue"]["admissions"] == 2
    assert condition(cluster, "Evicted")["status"] == "False"
    assert len(cluster.pods("j")) == 1
    # The re-admitted attempt has not run yet: it is not Running, and PodsReady is False.
    assert (status["phase"], status.get("runningSince")) == ("Starting", None)
    pods_ready = [c for c in cluster.workload()["status"]["conditions"] if c["type"] == "PodsReady"]
    assert pods_ready and pods_ready[0]["status"] == "False"
    cluster.run_pods("j")
    cluster.settle()
    assert phase(cluster) == "Running"


def test_a_finished_job_marks_its_workload_finished():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    (pod,) = cluster.pods("j")
    cluster.exit_pod(pod, 0)
    cluster.settle()
    assert phase(cluster) == "Succeeded"
    finished = next(
        c for c in cluster.workload()["status"]["conditions"] if c["type"] == "Finished"
    )
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")


def test_a_job_changed_while_queued_gets_a_new_workload():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    first = cluster.workload()["metadata"]["uid"]
    cluster.edit_job("j", {"numSlices": 3})
    cluster.settle()
    wl = cluster.workload()
    assert wl["metadata"]["uid"] != first
    assert wl["spec"]["podSets"][0]["count"] == 3
    assert phase(cluster) == "Queued"


def test_multislice_slices_go_to_the_node_pools_of_the_topology_assignment():
    cluster = KueueCluster()
    a = cluster.add_pool("v5p-a", "tpu-v5p-slice", "2x2x2", 2)
    b = cluster.add_pool("v5p-b", "tpu-v5p-slice", "2x2x2", 2)
    c = cluster.add_pool("v5p-c", "tpu-v5p-slice", "2x2x2", 2)
    assert a and b and c
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2), labels=QUEUE)
    cluster.settle()
    cluster.admit(["v5p-c", "v5p-a"], hosts=2)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["nodePools"] == ["v5p-c", "v5p-a"]
    pools = {
        p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in cluster.pods("j").values()
    }
    assert pools == {"v5p-c", "v5p-a"}


def test_workload_writes_are_bounded():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(numSlices=2), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    cluster.settle()
    writes = [
        r
        for r in cluster.requests
        if f"/{WORKLOAD_PLURAL}" in r.path and r.verb in ("POST", "PATCH", "PUT", "DELETE")
    ]
    # One creation, PodsReady False on admission, PodsReady True once running.
    assert len(writes) <= 3, writes
    assert NS


def test_deleting_the_job_deletes_its_workload():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    assert cluster.workloads()
    cluster.delete_job("j")
    cluster.settle()
    assert not cluster.workloads()  # owned by the job: the garbage collector's


def test_operator_restarted_after_admission_starts_the_job_once():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.admit()  # while the operator was away: nothing acted on it yet
    cluster.reconcile_job("j")
    cluster.reconcile_job("j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["queue"]["admissions"]) == (1, 1)
    assert len(cluster.pods("j")) == 1


def test_suspend_deactivates_the_workload_and_resume_queues_it_again():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    cluster.edit_job("j", {"suspend": True})
    cluster.settle()
    assert phase(cluster) == "Suspended"
    wl = cluster.workload()
    assert wl["spec"]["active"] is False
    assert wl["status"].get("admission")  # held while the pods stop
    cluster.confirm_deletions()
    cluster.settle()
    assert cluster.workload()["status"].get("admission") is None  # quota given back

    cluster.edit_job("j", {"suspend": False})
    cluster.settle()
    wl = cluster.workload()
    assert wl["spec"]["active"] is True
    assert not (wl["metadata"].get("annotations") or {})
    assert phase(cluster) == "Queued" and not cluster.pods("j")
    cluster.admit()
    cluster.settle()
    assert cluster.job("j")["status"]["attempt"] == 2
    assert len(cluster.pods("j")) == 1


def test_a_workload_kueue_deactivated_is_not_reactivated():
    cluster = KueueCluster()
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    wl = cluster.workload()
    wl["spec"]["active"] = False  # Kueue's own decision (e.g. maximumExecutionTimeSeconds)
    cluster._bump(wl)
    cluster.settle()
    assert cluster.workload()["spec"]["active"] is False
    assert phase(cluster) == "Queued"


FLAVORS = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"
TAINTED = {"key": "example.com/team", "operator": "Exists", "effect": "NoSchedule"}


def add_flavor(cluster: FakeCluster, name: str, spec: dict[str, Any]) -> None:
    cluster.objects[f"{FLAVORS}/{name}"] = {"metadata": {"name": name}, "spec": spec}


def flavor_reads(cluster: FakeCluster) -> int:
    return len([r for r in cluster.requests if r.verb == "GET" and r.path.startswith(FLAVORS)])


def test_the_admitting_flavor_s_node_labels_and_tolerations_go_to_the_pods():
    cluster = KueueCluster()
    labels = {
        contract.NODE_LABEL_ACCELERATOR: "tpu-v5-lite-podslice",
        contract.NODE_LABEL_TOPOLOGY: "2x2",
        "topology.kubernetes.io/zone": "z1",
    }
    add_flavor(cluster, "v5e", {"nodeLabels": labels, "tolerations": [TAINTED]})
    cluster.apply_job("j", job_spec(numSlices=2), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert phase(cluster) == "Running"
    pods = cluster.pods("j").values()
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["topology.kubernetes.io/zone"] == "z1"
        assert TAINTED in pod["spec"]["tolerations"]
    assert flavor_reads(cluster) == 1  # once per admission, not per reconcile


def test_a_flavor_that_conflicts_with_the_slice_shape_fails_the_job_once():
    cluster = KueueCluster()
    add_flavor(cluster, "v5e", {"nodeLabels": {contract.NODE_LABEL_ACCELERATOR: "tpu-v6e-slice"}})
    cluster.apply_job("j", job_spec(), labels=QUEUE)
    cluster.settle()
    cluster.admit()
    cluster.settle()  # a steady state: no loop
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert "tpu-v6e-slice" in status["message"] and "tpu-v5-lite-podslice" in status["message"]
    assert condition(cluster, "Failed")["reason"] == "AdmissionConflict"
    warnings = [e for e in cluster.recorded.events if e[2] == "AdmissionConflict"]
    assert len(warnings) == 1 and warnings[0][1] == "Warning"
    assert not cluster.pods("j") and not [k for k in cluster.objects if "/tpuslices/" in k]
    finished = next(
        c for c in cluster.workload()["status"]["conditions"] if c["type"] == "Finished"
    )
    assert (finished["status"], finished["reason"]) == ("True", "Failed")  # quota freed


def test_a_finished_slice_s_workers_are_reclaimable_until_the_admission_ends():
    cluster = KueueCluster()
    cluster.add_pool("v5p-a", "tpu-v5p-slice", "2x2x2", 2)
    cluster.add_pool("v5p-b", "tpu-v5p-slice", "2x2x2", 2)
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2), labels=QUEUE)
    cluster.settle()
    cluster.admit(["v5p-a", "v5p-b"], hosts=2)
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert "reclaimablePods" not in cluster.workload()["status"]
    slice0 = [
        name
        for name, pod in cluster.pods("j").items()
        if pod["metadata"]["labels"][contract.LABEL_SLICE_INDEX] == "0"
    ]
    assert len(slice0) == 2
    cluster.exit_pod(slice0[0], 0)  # half of slice 0: nothing to release yet
    cluster.settle()
    assert "reclaimablePods" not in cluster.workload()["status"]
    cluster.exit_pod(slice0[1], 0)
    cluster.settle()
    assert phase(cluster) == "Running"
    assert cluster.workload()["status"]["reclaimablePods"] == [{"name": POD_SET, "count": 2}]
    pods_ready = next(
        c for c in cluster.workload()["status"]["conditions"] if c["type"] == "PodsReady"
    )
    assert pods_ready["status"] == "True"

    cluster.evict("Preempted")
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    status = cluster.workload()["status"]
    assert status.get("admission") is None and "reclaimablePods" not in status


KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"


def add_queue(cluster: FakeCluster, flavors: dict[str, str | None]) -> None:
    """LocalQueue ``tpu`` in the test namespace -> ClusterQueue ``cq`` over ``flavors``
    (name -> its topologyName, or None)."""
    cluster.objects[f"{KUEUE_API}/namespaces/{NS}/localqueues/tpu"] = {
        "metadata": {"name": "tpu", "namespace": NS},
        "spec": {"clusterQueue": "cq"},
    }
    cluster.objects[f"{KUEUE_API}/clusterqueues/cq"] = {
        "metadata": {"name": "cq"},
        "spec": {
            "resourceGroups": [
                {"coveredResources": ["google.com/tpu"], "flavors": [{"name": n} for n in flavors]}
            ]
        },
    }
    for name, topology in flavors.items():
        add_flavor(cluster, name, {"topologyName": topology} if topology else {})


@pytest.mark.parametrize(
    ("flavors", "asks"),
    [
        # A flavor with a Topology: one node pool per slice, through Kueue.
        ({"plain": None, "tas": "gke-nodepool"}, True),
        # None has one: Kueue would admit a topology request on none of them.
        ({"plain": None, "other": None}, False),
        # The queue cannot be read (not there yet): the topology request, as before.
        (None, True),
    ],
)
def test_a_multi_host_job_asks_for_a_topology_only_where_its_queue_has_one(flavors, asks):
    cluster = KueueCluster()
    if flavors is not None:
        add_queue(cluster, flavors)
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2), labels=QUEUE)
    cluster.settle()
    (pod_set,) = cluster.workload()["spec"]["podSets"]
    assert ("topologyRequest" in pod_set) is asks, pod_set
    # Read once for the queue, not on every reconcile.
    reads = [
        r
        for r in cluster.requests
        if r.verb == "GET" and r.path.startswith(f"{KUEUE_API}/namespaces/")
    ]
    assert len(reads) == 1


def test_a_queued_job_s_workload_follows_its_queue_gaining_a_topology():
    cluster = KueueCluster()
    add_queue(cluster, {"plain": None})
    cluster.apply_job("j", job_spec("v5p-16", numSlices=2), labels=QUEUE)
    cluster.settle()
    assert "topologyRequest" not in cluster.workload()["spec"]["podSets"][0]
    add_flavor(cluster, "plain", {"topologyName": "gke-nodepool"})
    cluster.advance(31)  # the queue's answer is kept for 30 s
    cluster.settle()
    (pod_set,) = cluster.workload()["spec"]["podSets"]
    assert pod_set["topologyRequest"]["podSetSliceSize"] == 2


# Ironwood dynamic slicing: the operator serves Kueue's accelerator.gke.io/slice check.

SLICES = f"/apis/{contract.SLICE_API_VERSION}/{contract.SLICE_CRD_PLURAL}"
CHECKS = "/apis/kueue.x-k8s.io/v1beta2/admissionchecks"
SUPER_SLICE = {"accelerator": "tpu7x", "topology": "4x4x8", "dynamicSlicing": "SuperSlice"}


def ironwood(cluster: KueueCluster) -> list[str]:
    """Two cubes and two AdmissionChecks: the slice controller's and another one."""
    hosts = []
    for cube in ("cube-a", "cube-b"):
        for node in cube_nodes(cube):
            cluster.objects[f"/api/v1/nodes/{node['metadata']['name']}"] = node
            hosts.append(node["metadata"]["name"])
    for name, controller in (("slices", slice_check.CONTROLLER_NAME), ("prov", "other")):
        cluster.objects[f"{CHECKS}/{name}"] = {
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"controllerName": controller},
        }
    return hosts


def reserve(cluster: KueueCluster, hosts: list[str]) -> None:
    """Kueue reserves quota on ``hosts`` (one pod each) with both checks Pending."""
    wl = cluster.workload()
    wl["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": POD_SET,
                    "flavors": {"google.com/tpu": "tpu7x"},
                    "count": len(hosts),
                    "topologyAssignment": {
                        "levels": ["kubernetes.io/hostname"],
                        "slices": [
                            {
                                "domainCount": len(hosts),
                                "valuesPerLevel": [{"individual": {"roots": hosts}}],
                                "podCounts": {"universal": 1},
                            }
                        ],
                    },
                }
            ],
        },
        "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}],
        "admissionChecks": [
            {"name": "prov", "state": "Pending", "message": "provisioning"},
            {"name": "slices", "state": "Pending", "message": ""},
        ],
    }
    cluster._bump(wl)


def test_the_slice_admission_check_forms_the_job_s_slice_and_sets_only_its_own_entry():
    cluster = KueueCluster()
    hosts = ironwood(cluster)
    template = job_spec()["template"]
    cluster.apply_job("j", {"slice": SUPER_SLICE, "template": template}, labels=QUEUE)
    cluster.settle()
    reserve(cluster, hosts)
    cluster.settle()

    wl = cluster.workload()
    name = slice_check.gke_slice_name(NS, wl["metadata"]["name"], POD_SET, 0)
    formed = cluster.objects[f"{SLICES}/{name}"]
    cubes = [
        n["metadata"]["labels"][contract.partition_id_label("4x4x4")]
        for n in (cube_nodes("cube-a")[0], cube_nodes("cube-b")[0])
    ]
    assert formed["spec"] == {"type": "tpu7x", "topology": "4x4x8", "partitionIds": cubes}
    assert formed["metadata"]["annotations"] == {
        slice_check.OWNER_NAMESPACE: NS,
        slice_check.OWNER_NAME: wl["metadata"]["name"],
        slice_check.OWNER_POD_SET: POD_SET,
    }
    checks = {c["name"]: c for c in wl["status"]["admissionChecks"]}
    assert checks["prov"] == {"name": "prov", "state": "Pending", "message": "provisioning"}
    assert (checks["slices"]["state"], checks["slices"]["message"]) == (
        "Pending",
        "Slices are in states: 1 CREATED",
    )
    assert not wl["metadata"].get("finalizers")  # never GKE's: its controller would act
    assert not cluster.pods("j")

    # GKE forms the Slice: the check is Ready with the pods' topology selector.
    formed["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]}
    cluster.advance(slice_check.RECHECK_SECONDS)
    cluster.settle()
    checks = {c["name"]: c for c in cluster.workload()["status"]["admissionChecks"]}
    assert checks["slices"]["state"] == "Ready"
    assert checks["slices"]["podSetUpdates"] == [
        {"name": POD_SET, "nodeSelector": {contract.NODE_LABEL_TOPOLOGY: "4x4x8"}}
    ]
    assert checks["prov"]["state"] == "Pending"
    assert [r.verb for r in cluster.requests if r.path.startswith(SLICES)].count("POST") == 1

    # Kueue admits: the slice runs on that Slice and forms none of its own.
    wl = cluster.workload()
    wl["status"]["conditions"].append({"type": "Admitted", "status": "True", "reason": "Admitted"})
    checks["prov"]["state"] = "Ready"
    wl["status"]["admissionChecks"] = list(checks.values())
    cluster._bump(wl)
    cluster.settle()
    assert cluster.slice("j-0")["spec"]["gkeSlice"] == name
    pods = cluster.pods("j")
    assert len(pods) == 32
    assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_TPU_SLICE] for p in pods.values()} == {
        name
    }
    assert [k for k in cluster.objects if k.startswith(f"{SLICES}/")] == [f"{SLICES}/{name}"]

    # Settled: pod events read no Slice; one list per SETTLED_SECONDS finds a deleted one.
    def slice_lists() -> int:
        return sum(1 for r in cluster.requests if r.verb == "GET" and r.path == SLICES)

    cluster.run_pods("j")
    cluster.clear_requests()
    cluster.settle()
    cluster.reconcile_job("j")
    assert slice_lists() == 0
    del cluster.objects[f"{SLICES}/{name}"]  # someone deletes it
    cluster.advance(SETTLED_SECONDS)
    cluster.reconcile_job("j")
    assert slice_lists() == 1
    check = next(
        c for c in cluster.workload()["status"]["admissionChecks"] if c["name"] == "slices"
    )
    assert (check["state"], check["message"]) == ("Retry", "Slice has been deleted")
    assert cluster.job("j")["status"]["phase"] == "Queued"  # stopped as evicted, not failed
    assert cluster.job("j")["status"].get("restarts", 0) == 0

    # The job deleted: its Slice goes too (cluster-scoped, nothing else collects it).
    cluster.delete_job("j")
    cluster.reconcile_job("j")
    assert not [k for k in cluster.objects if k.startswith(f"{SLICES}/")]
