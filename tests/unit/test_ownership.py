"""Which pods are the operator's workers (``runtime/ownership.py``): a pod's controller
owner reference names a TPUSlice the operator knows, by UID, and its labels agree with
that slice. Labels alone grant nothing: a look-alike pod is not counted in a gang, holds
no pool, is never deleted, and leaves no tombstone."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakeapi import NS, FakeCluster, ManualClock
from tests.unit.test_runtime_wakes import owners as job_indexes
from tests.unit.test_runtime_wakes import started
from tpu_operator import contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.catalog import shape
from tpu_operator.runtime.listwatch import pod_keys, pod_tally
from tpu_operator.runtime.ownership import SliceOwners
from tpu_operator.state.views import FOREIGN, ORPHAN, OWN, pod_view

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")


def slice_body(name: str, uid: str, job: tuple[str, str] | None = None, ns: str = "ml") -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid}
    if job is not None:
        meta["ownerReferences"] = [
            {"kind": "TPUJob", "name": job[0], "uid": job[1], "controller": True}
        ]
    return {"metadata": meta}


@pytest.fixture
def owners() -> SliceOwners:
    known = SliceOwners(ttl=100.0, clock=ManualClock(0.0))
    known.known(slice_body("j-0", "s0", ("j", "ju")))
    known.known(slice_body("solo", "s9"))
    return known


@pytest.mark.parametrize(
    ("owner", "namespace", "slice_name", "job", "deleting", "expected"),
    [
        ("s0", "ml", "j-0", "j", False, OWN),
        ("s0", "ml", "j-0", "j", True, OWN),
        ("s9", "ml", "solo", "solo", False, OWN),  # a standalone slice's pods
        # Labels that disagree with the owner: another slice, job or namespace.
        ("s0", "ml", "j-1", "j", False, FOREIGN),
        ("s0", "ml", "j-0", "k", False, FOREIGN),
        ("s0", "other", "j-0", "j", False, FOREIGN),
        ("s9", "ml", "solo", "j", False, FOREIGN),
        # No owner the operator knows: foreign, or, being deleted, an orphan.
        ("nope", "ml", "j-0", "j", False, FOREIGN),
        ("nope", "ml", "j-0", "j", True, ORPHAN),
        (None, "ml", "j-0", "j", False, FOREIGN),
        (None, "ml", "j-0", "j", True, FOREIGN),
    ],
)
def test_ownership(owners, owner, namespace, slice_name, job, deleting, expected):
    assert owners.ownership(owner, namespace, slice_name, job, deleting) == expected


def test_a_deleted_slices_pods_stay_the_operators_while_it_is_remembered():
    clock = ManualClock(0.0)
    owners = SliceOwners(ttl=100.0, clock=clock)
    owners.known(slice_body("j-0", "s0", ("j", "ju")))
    owners.gone("s0")
    assert owners.ownership("s0", "ml", "j-0", "j", False) == OWN
    clock.now = 101.0
    owners.prune()
    assert owners.ownership("s0", "ml", "j-0", "j", False) == FOREIGN
    assert owners.ownership("s0", "ml", "j-0", "j", True) == ORPHAN


def raw_pod(name: str, owner_uid: str | None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "uid": f"u-{name}",
        "labels": {
            contract.LABEL_SLICE_NAME: "j-0",
            contract.LABEL_JOB_NAME: "j",
            contract.LABEL_WORKER_INDEX: "0",
            contract.LABEL_RESTART_ATTEMPT: "1",
        },
        **extra.pop("meta", {}),
    }
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": contract.API_VERSION,
                "kind": contract.SLICE_KIND,
                "name": "j-0",
                "uid": owner_uid,
                "controller": True,
            }
        ]
    spec = {"nodeName": "n0", "nodeSelector": {contract.NODE_LABEL_NODEPOOL: "p1"}}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}


def test_keys_and_counts_of_own_orphan_and_foreign_pods(owners):
    own = pod_view(raw_pod("j-0-0", "s0"), owners.ownership)
    forged = pod_view(raw_pod("j-0-0", "fake"), owners.ownership)
    orphan = pod_view(
        raw_pod("j-0-0", "gone", meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        owners.ownership,
    )
    assert own is not None and forged is not None and orphan is not None
    assert (own.ownership, forged.ownership, orphan.ownership) == (OWN, FOREIGN, ORPHAN)
    assert ("slice", "ml", "j-0") in pod_keys(own) and pod_tally(own)
    assert set(pod_keys(forged)) == {
        ("owner", "fake"),
        ("foreign-pool", "p1"),
        ("foreign-node", "n0"),
    }
    assert pod_tally(forged) == ()
    assert set(pod_keys(orphan)) == {("owner", "gone"), ("pool", "p1"), ("node", "n0")}
    assert pod_tally(orphan) == ()


def test_a_pod_seen_before_its_slice_is_filed_again_as_the_operators(tmp_path: Path):
    runtime = started(tmp_path / "kubeconfig", {"jobs": {}, "slices": {}})
    owners = runtime.caches.owners
    body = raw_pod("j-0-0", "s0")
    view = pod_view(body, owners.ownership)
    assert view is not None and view.ownership == FOREIGN
    store = runtime.pod_watch.store
    store.put(("ml", "j-0-0", "u-j-0-0"), view)
    assert runtime.caches.pods_of_slice("ml", "j-0") == []
    runtime.slice_known(slice_body("j-0", "s0", ("j", "ju")))
    (refiled,) = runtime.caches.pods_of_slice("ml", "j-0")
    assert refiled.ownership == OWN and refiled.uid == "u-j-0-0"
    assert runtime.caches.pods_in_pool("p1") == [refiled]
    assert store.get(("foreign-pool", "p1")) is None


def test_a_slices_pods_are_filed_again_when_it_carries_them_into_another_attempt(
    tmp_path: Path,
):
    """The job writes once on the slice that its pods belong to attempt 2 (in place): the
    operator's cached views, indexes and counts follow at once, with no write to a pod."""
    runtime = started(tmp_path / "kubeconfig", {"jobs": {}, "slices": {}})
    owners = runtime.caches.owners
    runtime.slice_known(slice_body("j-0", "s0", ("j", "ju")))
    store = runtime.pod_watch.store
    for name in ("j-0-0", "j-0-1"):
        view = pod_view(raw_pod(name, "s0"), owners.ownership, owners.carried)
        assert view is not None
        store.put(("ml", name, f"u-{name}"), view)
    assert set(runtime.caches.attempts_of_job("ml", "j")) == {1}
    carried = slice_body("j-0", "s0", ("j", "ju"))
    carried["spec"] = {"attempt": 2, "inPlaceFrom": 1}
    runtime.slice_known(carried)
    assert set(runtime.caches.attempts_of_job("ml", "j")) == {2}
    pods = runtime.caches.pods_of_slice("ml", "j-0")
    assert {(p.attempt, p.label_attempt, p.carried) for p in pods} == {(2, 1, True)}
    # Recreated as attempt 3: its record carries nothing, the pods are attempt 1's again.
    recreated = slice_body("j-0", "s0", ("j", "ju"))
    recreated["spec"] = {"attempt": 3}
    runtime.slice_known(recreated)
    assert set(runtime.caches.attempts_of_job("ml", "j")) == {1}


def test_pods_filed_again_wake_their_slice_and_job_only_as_routine_progress(tmp_path: Path):
    """A pod filed into the attempt its slice now carries it into did not change: the
    slice's event woke the slice and its job already. Each ready pod of the carried
    slice looked like the last of its attempt to turn ready, and woke both urgently."""
    runtime = started(tmp_path / "kubeconfig", job_indexes(attempt=2))
    owners = runtime.caches.owners
    runtime.slice_known(slice_body("j-0", "s0", ("j", "u")))
    store = runtime.pod_watch.store
    for name in ("j-0-0", "j-0-1"):
        body = raw_pod(name, "s0")
        body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        view = pod_view(body, owners.ownership, owners.carried)
        assert view is not None and view.ready
        store.put(("ml", name, f"u-{name}"), view)
    carried = slice_body("j-0", "s0", ("j", "u"))
    carried["spec"] = {"attempt": 2, "inPlaceFrom": 1}
    runtime.slice_known(carried)
    assert {p.attempt for p in runtime.caches.pods_of_slice("ml", "j-0")} == {2}
    for queue in (runtime.slices, runtime.jobs):
        assert queue.calls, "the refiled pods woke nothing"
        assert not any(urgent for _, urgent in queue.calls)
        assert all(queue.routine)


def test_the_templates_operator_labels_and_annotations_are_not_passed_through():
    template = {
        "metadata": {
            "labels": {"team": "a", contract.LABEL_SLICE_NAME: "other"},
            "annotations": {contract.ANNOTATION_SUPERVISED: "true", "note": "n"},
        },
        "spec": {"containers": [{"name": "worker", "image": "w"}]},
    }
    wiring = PodWiring(
        job_name="j",
        service="j",
        slice_name="j-0",
        shape=shape(*V5P),
        num_slices=1,
        slice_index=0,
        worker_index=0,
        attempt=1,
    )
    pod = worker_pod(
        namespace="ml",
        wiring=wiring,
        template=template,
        owner=Owner(contract.API_VERSION, contract.SLICE_KIND, "j-0", "s0"),
        placement=NodePlacement(node_pool="p1"),
    )
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"][contract.LABEL_SLICE_NAME] == "j-0"
    assert pod["metadata"]["annotations"] == {"note": "n"}  # not supervised: no supervisor


def forge(cluster: FakeCluster, like: str, namespace: str = NS, **changes: Any) -> str:
    """A pod made by someone who can create pods: a copy of worker ``like`` (its labels,
    node selector) under another name, with ``changes`` to its metadata."""
    original = cluster.pods()[like]
    forged = copy.deepcopy(original)
    meta = forged["metadata"]
    meta.pop("ownerReferences", None)
    meta.update(name=f"forged-{like}", namespace=namespace, uid=f"forged-{like}", **changes)
    forged["status"] = {"phase": "Pending"}
    forged["spec"].pop("nodeName", None)
    cluster.objects[f"/api/v1/namespaces/{namespace}/pods/{meta['name']}"] = forged
    return meta["name"]


def test_a_forged_pod_is_not_counted_deleted_or_a_barrier():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job(
        "j",
        {
            "slice": {"type": "v5p-16"},
            "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        },
    )
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    # A copy of worker 0 labelled as attempt 0 of the same slice (a stale pod, if it were
    # the operator's: deleted, and a barrier for the next attempt), with a forged owner.
    fake_owner = [
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.SLICE_KIND,
            "name": "j-0",
            "uid": "not-the-slice",
            "controller": True,
        }
    ]
    name = forge(cluster, "j-0-0", ownerReferences=fake_owner)
    cluster.pods()[name]["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] = "0"
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["activePods"], status["ready"]) == ("Running", 2, "2/2")
    assert not cluster.pods()[name]["metadata"].get("deletionTimestamp"), "it was deleted"
    # A restart: the forged "attempt 0" pod is no barrier for attempt 2.
    cluster.exit_pod("j-0-1", 1)
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2, status
    cluster.advance(60)  # the restart backoff
    cluster.settle()
    assert {
        p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT]
        for n, p in cluster.pods("j").items()
        if n != name
    } == {"2"}
    assert name in cluster.pods()


def test_a_labelled_pod_in_another_namespace_holds_no_pool():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    spec = {
        "slice": {"type": "v5p-16"},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
    }
    cluster.apply_job("j", spec)
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    forge(cluster, "j-0-0", namespace="tenant-b")  # pinned to p1, any owner or none
    cluster.edit_job("j", {"suspend": True})
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    cluster.apply_job("k", spec)
    cluster.settle()
    assert cluster.job("k")["status"]["nodePools"] == ["p1"]
