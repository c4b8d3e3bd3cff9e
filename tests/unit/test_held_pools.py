"""Who holds which node pool (``reconcile/pools.HeldPools``), looked up pool by pool.

Scenarios over the in-memory API: the holder each rule names, their order, the pool GKE
created for a claim, and that a lookup reads only the pods of the pools asked about.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakeapi import NS, FakeCluster
from tpu_operator import catalog
from tpu_operator.api.status import Phase
from tpu_operator.placement.pools import Request, allocate
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL, claim_ref
from tpu_operator.reconcile.cached import job_keys
from tpu_operator.reconcile.pools import (
    HeldPools,
    held_pools,
    holds_spares,
    job_holder,
    job_pool_records,
    slice_pool_records,
    spares_of_others,
    tpu_pools,
)
from tpu_operator.runtime.caches import SPARES_HOLDER

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")  # v5p-16: 2 hosts of 4 chips


def job_spec(**extra: Any) -> dict[str, Any]:
    return {
        "slice": {"type": "v5p-16"},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        **extra,
    }


def cluster_with_pools(*pools: str) -> FakeCluster:
    cluster = FakeCluster()
    for pool in pools:
        cluster.add_pool(pool, *V5P, hosts=2)
    return cluster


def held(cluster: FakeCluster, exclude: str = "") -> HeldPools:
    cluster._index()  # the caches as the watches would have them now
    return held_pools(cluster.ctx, exclude=exclude)


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # The job's record holds the pool before its pods exist ...
        ("recorded", "TPUJob ml/a"),
        # ... its pods hold it while they exist, whatever the record says ...
        ("running", "TPUJob ml/a (2 of its pods are on it, 0 terminating)"),
        ("suspending", "TPUJob ml/a (2 of its pods are on it, 2 terminating)"),
        # ... and once they are gone, a suspended job holds nothing.
        ("suspended", None),
    ],
)
def test_the_holder_named_at_each_stage_of_a_jobs_life(stage: str, expected: str | None):
    cluster = cluster_with_pools("p1", "p2")
    cluster.apply_job("a", job_spec())
    cluster.reconcile_job("a")  # records the pool; its slices create no pods yet
    if stage != "recorded":
        cluster.settle()
        cluster.run_pods("a")
        cluster.settle()
    if stage in ("suspending", "suspended"):
        cluster.edit_job("a", {"suspend": True})
        cluster.settle()
    if stage == "suspended":
        cluster.confirm_deletions()
        cluster.settle()
        assert cluster.job("a")["status"]["phase"] == Phase.SUSPENDED
    asked = held(cluster)  # ``in`` first: its own lookup, not the words ``get`` kept
    assert [p in asked for p in ("p1", "p2")] == [expected is not None, False]
    found = held(cluster)
    assert found.get("p1") == expected
    assert found.get("p2") is None
    own = held(cluster, exclude="TPUJob ml/a")
    assert "p1" not in own and own.get("p1") is None, "its own pools are free"
    assert list(found) == (["p1"] if expected else [])


def test_a_reservation_holds_a_pool_before_any_record():
    cluster = cluster_with_pools("p1")
    cluster.ctx.reservations.reserve("TPUJob ml/b", ["p1"])
    assert held(cluster).get("p1") == "TPUJob ml/b"
    assert "p1" in held(cluster)
    assert held(cluster, exclude="TPUJob ml/b").get("p1") is None
    assert "p1" not in held(cluster, exclude="TPUJob ml/b")


def test_a_pool_gke_created_for_a_claim_is_held_by_the_claims_holder():
    cluster = cluster_with_pools()
    names = cluster.add_pool("gke-made", *V5P, hosts=2)
    for name in names:
        cluster.objects[f"/api/v1/nodes/{name}"]["metadata"]["labels"][SLICE_POOL_LABEL] = "v1"
    cluster.ctx.reservations.reserve("TPUJob ml/a", [claim_ref("v1")])
    assert "gke-made" in held(cluster) and "gke-made" not in held(cluster, "TPUJob ml/a")
    found = held(cluster)
    assert found.get(claim_ref("v1")) == "TPUJob ml/a"
    assert found.get("gke-made") == "TPUJob ml/a", "a claim and its pool are one pool"
    assert set(found) == {"gke-made", claim_ref("v1")}


def test_an_allocation_reads_the_pods_of_the_pools_it_looks_at_only():
    cluster = cluster_with_pools(*(f"p{i}" for i in range(6)))
    for name in ("a", "b", "c"):
        cluster.apply_job(name, job_spec())
        cluster.settle()
        cluster.run_pods(name)
        cluster.settle()
    assert [cluster.job(n)["status"]["nodePools"] for n in "abc"] == [["p0"], ["p1"], ["p2"]]
    asked: list[str] = []
    pods_in_pool = cluster.caches.pods_in_pool

    def counted(pool: str) -> Any:
        asked.append(pool)
        return pods_in_pool(pool)

    cluster.caches.pods_in_pool = counted  # type: ignore[method-assign]
    found = held(cluster, exclude="TPUJob ml/d")
    allocation = allocate([Request(catalog.shape(*V5P))], tpu_pools(cluster.ctx), found)
    assert allocation.pools == ["p3"]
    assert asked == ["p0", "p1", "p2", "p3"], "p4 and p5 were never looked at"


def test_an_allocation_names_the_holders_only_when_the_request_waits():
    """A choice passes over held pools asking only whether they are held (``in``); the
    holders are named, their pods counted, for the message of a request that waits."""
    cluster = cluster_with_pools("p0", "p1", "p2")
    for name in ("a", "b"):
        cluster.apply_job(name, job_spec())
        cluster.settle()
        cluster.run_pods(name)
        cluster.settle()
    named: list[str] = []

    class Counted(HeldPools):
        def get(self, pool: str, default: Any = None) -> Any:
            named.append(pool)
            return super().get(pool, default)

    cluster._index()
    shape = catalog.shape(*V5P)
    allocation = allocate(
        [Request(shape)], tpu_pools(cluster.ctx), Counted(cluster.ctx, "TPUJob ml/c", {})
    )
    assert (allocation.pools, named) == (["p2"], [])
    allocation = allocate(
        [Request(shape), Request(shape)],
        tpu_pools(cluster.ctx),
        Counted(cluster.ctx, "TPUJob ml/c", {}),
    )
    assert allocation.pools is None
    assert named == ["p0", "p1", "p2"], "slice 0 took p2 naming no one"
    assert allocation.message == (
        "waiting for a free node pool for slice 1 (tpu-v5p-slice 2x2x2 (2 VMs of 4 chips)): "
        "p0 is held by TPUJob ml/a (2 of its pods are on it, 0 terminating); "
        "p1 is held by TPUJob ml/b (2 of its pods are on it, 0 terminating); "
        "p2 is held by this job"
        " (placement.provisioning: Auto lets GKE create one: node auto-provisioning, Autopilot)"
    )


def test_records_are_read_for_the_pools_looked_at_only():
    """Rule 2 comes from the job and slice indexes by pool: an allocation reads the records
    of the pools it asks about, never every job and slice of the cluster."""
    cluster = cluster_with_pools(*(f"p{i}" for i in range(6)))
    for name in ("a", "b"):
        cluster.apply_job(name, job_spec())
        cluster.reconcile_job(name)  # records its pool; no pods yet
    standalone = job_spec()
    cluster.apply_slice("s", {**standalone.pop("slice"), **standalone})
    cluster.reconcile_slice("s")  # a standalone slice records its pool too
    assert [cluster.job(n)["status"]["nodePools"] for n in "ab"] == [["p0"], ["p1"]]
    assert cluster.slice("s")["status"]["nodePool"] == "p2"
    cluster._index()
    asked: list[str] = []
    records = cluster.caches.pool_records

    def counted(pool: str) -> list[str]:
        asked.append(pool)
        return records(pool)

    def every(*_: Any) -> Any:
        raise AssertionError("an allocation read every job or slice")

    cluster.caches.pool_records = counted  # type: ignore[method-assign]
    cluster.caches.jobs = cluster.caches.all_slices = every  # type: ignore[method-assign]
    found = HeldPools(cluster.ctx, "TPUJob ml/d", tpu_pools(cluster.ctx))
    allocation = allocate([Request(catalog.shape(*V5P))], tpu_pools(cluster.ctx), found)
    assert allocation.pools == ["p3"]
    # p2 is held by the slice's pods, found before any record is read.
    assert asked == ["p0", "p1", "p3"]
    assert [found.get(p) for p in ("p0", "p1")] == ["TPUJob ml/a", "TPUJob ml/b"]
    assert str(found.get("p2")).startswith("TPUSlice ml/s (")
    assert records("p2") == ["TPUSlice ml/s"]  # and its record is filed under its pool


@pytest.mark.parametrize(
    ("status", "records"),
    [
        (
            {"phase": "Running", "nodePools": ["p1", "p2"]},
            {"p1": "TPUJob ml/j", "p2": "TPUJob ml/j"},
        ),
        ({"phase": "Pending", "nodePools": ["p1"]}, {"p1": "TPUJob ml/j"}),
        ({"phase": "Suspended", "nodePools": ["p1"]}, {}),
        ({"phase": "Succeeded", "nodePools": ["p1"]}, {}),
        ({"phase": "Failed", "nodePools": ["p1"]}, {}),
        ({"phase": "Running"}, {}),
        ({}, {}),
    ],
)
def test_a_jobs_records(status: dict[str, Any], records: dict[str, str]):
    body = {"metadata": {"namespace": "ml", "name": "j"}, "status": status}
    assert job_pool_records(body) == records


@pytest.mark.parametrize(
    ("owned", "status", "records"),
    [
        (False, {"phase": "Running", "nodePool": "p1"}, {"p1": "TPUSlice ml/s"}),
        (False, {"phase": "Pending", "nodePool": "p1"}, {"p1": "TPUSlice ml/s"}),
        (False, {"phase": "Failed", "nodePool": "p1"}, {}),
        (False, {"phase": "Running"}, {}),
        (True, {"phase": "Running", "nodePool": "p1"}, {}),  # its job records it
    ],
)
def test_a_standalone_slices_records(owned: bool, status: dict[str, Any], records: dict[str, str]):
    body: dict[str, Any] = {"metadata": {"namespace": "ml", "name": "s"}, "status": status}
    if owned:
        body["metadata"]["ownerReferences"] = [{"kind": "TPUJob", "name": "j", "controller": True}]
    assert slice_pool_records(body) == records


@pytest.mark.parametrize(
    ("spec", "records"),
    [
        ({"nodePool": "p1"}, {"p1": "TPUJob ml/j"}),
        ({"nodePool": "p1", "suspend": False}, {"p1": "TPUJob ml/j"}),
        ({"nodePool": "p1", "suspend": True}, {}),  # its pods hold it while they exist
        ({"nodePool": ""}, {}),
        ({}, {}),
    ],
)
def test_a_jobs_slice_holds_its_pool_for_its_job_until_suspended(
    spec: dict[str, Any], records: dict[str, str]
):
    body: dict[str, Any] = {
        "metadata": {
            "namespace": "ml",
            "name": "j-0",
            "ownerReferences": [{"kind": "TPUJob", "name": "j", "uid": "u", "controller": True}],
        },
        "spec": spec,
        "status": {"phase": "Failed"},  # what the slice reports does not matter
    }
    assert slice_pool_records(body) == records


def waiting_on(cluster: FakeCluster, name: str) -> str:
    status = cluster.job(name).get("status") or {}
    assert not status.get("nodePools"), f"{name} took a pool: {status}"
    return str(status.get("message", ""))


def test_a_write_that_loses_to_the_jobs_own_unseen_write_keeps_its_pools():
    """The job watch trails: a job recorded a pool and created its slice, and is reconciled
    again (woken by its slice's event) before the cache shows its own write. That reconcile
    decides from the old status, its write gets 409, and the pool it recorded must stay
    held: another job looking for a pool now must not get it."""
    cluster = cluster_with_pools("p1")
    cluster.apply_job("b", job_spec())
    cluster.apply_job("c", job_spec())
    cluster.lag(cluster.job_path("b"))  # the cache keeps showing b as it is now
    cluster.reconcile_job("b")
    assert cluster.job("b")["status"]["nodePools"] == ["p1"]
    cluster.clear_requests()
    cluster.reconcile_job("b")  # from the status before its own write
    assert cluster.status_writes() == (0, 1)
    cluster.reconcile_job("c")
    assert "TPUJob ml/b" in waiting_on(cluster, "c")
    cluster.lagging.clear()
    cluster.reconcile_job("c")
    assert "TPUJob ml/b" in waiting_on(cluster, "c")


def test_a_deleted_jobs_slices_hold_its_pool_until_they_and_their_pods_are_gone():
    """A job deleted while its slice has not created its pods yet: the slice (not yet
    removed by the garbage collector) creates nothing and holds the pool for the deleted
    job; once the slice is gone, the pool is free."""
    cluster = cluster_with_pools("p1")
    cluster.apply_job("a", job_spec())
    cluster.reconcile_job("a")  # records p1 and creates its slice
    cluster.apply_job("c", job_spec())
    cluster.delete_job("a", collect=False)
    cluster.reconcile_job("a")  # its deletion's event: it reserves nothing any more
    cluster.reconcile_slice("a-0")
    assert cluster.pods() == {}, "a slice of a deleted job created pods"
    cluster.reconcile_job("c")
    assert "TPUJob ml/a" in waiting_on(cluster, "c")
    cluster.collect_garbage()
    cluster.reconcile_job("c")
    assert cluster.job("c")["status"]["nodePools"] == ["p1"]


def test_a_slice_of_another_job_of_the_same_name_does_nothing():
    """Owner references are compared by UID: a job deleted and created again under the same
    name does not take over the old job's slice (the garbage collector removes it)."""
    cluster = cluster_with_pools("p1", "p2")
    cluster.apply_job("a", job_spec())
    cluster.reconcile_job("a")
    cluster.delete_job("a", collect=False)
    cluster.apply_job("a", job_spec())
    cluster.reconcile_slice("a-0")
    assert cluster.pods() == {}


def test_pods_created_but_not_yet_cached_hold_their_pool_after_their_slice_is_gone():
    """The pod watch trails the slice watch: a slice created its pods, then its job and
    the slice were deleted, and the cache shows the slice gone before it shows the pods.
    The pods in flight hold the pool for the deleted job until the cache shows them (and
    then until they are gone)."""
    cluster = cluster_with_pools("p1")
    cluster.apply_job("a", job_spec())
    cluster.reconcile_job("a")
    cluster.reconcile_slice("a-0")
    created = sorted(cluster.pods())
    assert len(created) == 2
    for name in created:
        cluster.lag(f"/api/v1/namespaces/{NS}/pods/{name}")
    for name in created:  # the cache had not shown them before either
        cluster.lagging[f"/api/v1/namespaces/{NS}/pods/{name}"] = None
    cluster.delete_job("a", collect=False)
    cluster.reconcile_job("a")
    slice_path = cluster.slice_path("a-0")
    cluster.objects.pop(slice_path)  # the garbage collector removed the slice, not its pods
    cluster.apply_job("c", job_spec())
    cluster.reconcile_job("c")
    assert "TPUJob ml/a (2 of its pods are being created on it)" in waiting_on(cluster, "c")
    cluster.lagging.clear()  # the pods show: they hold it as long as they exist
    cluster.reconcile_job("c")
    assert "TPUJob ml/a (2 of its pods are on it" in waiting_on(cluster, "c")
    cluster.collect_garbage()
    cluster.reconcile_job("c")
    assert cluster.job("c")["status"]["nodePools"] == ["p1"]


@pytest.mark.parametrize(("finished", "taken"), [(False, "p3"), (True, "p1")])
def test_a_job_s_spares_are_kept_from_other_jobs_until_it_finishes(finished: bool, taken: str):
    cluster = cluster_with_pools("p1", "p2", "p3")
    cluster.apply_job("b", job_spec(placement={"spares": {"nodePools": ["p1"]}}))
    cluster.reconcile_job("b")
    assert cluster.job("b")["status"]["nodePools"] == ["p2"]  # its own spare it leaves too
    if finished:
        cluster.job("b")["status"]["phase"] = Phase.SUCCEEDED
        cluster.job("b")["status"]["nodePools"] = []
    cluster.apply_job("a", job_spec())
    cluster.reconcile_job("a")
    assert cluster.job("a")["status"]["nodePools"] == [taken]


@pytest.mark.parametrize(
    ("spec", "status", "filed"),
    [
        ({}, {}, False),  # no spares: not filed, never read by an allocation
        ({"placement": {"spares": {"nodePools": ["s1"]}}}, {}, True),
        ({"placement": {"spares": {"selector": {"matchLabels": {"a": "b"}}}}}, {}, True),
        ({}, {"spareNodePools": ["s1"], "phase": "Running"}, True),  # held, not named
        ({"placement": {"spares": {"nodePools": ["s1"]}}}, {"phase": "Succeeded"}, False),
        ({}, {"spareNodePools": ["s1"], "phase": "Failed"}, False),
        ({"placement": {"spares": "bad"}}, {}, False),  # not a mapping: names nothing
    ],
)
def test_only_the_unfinished_jobs_with_spares_are_filed_for_allocations(
    spec: dict[str, Any], status: dict[str, Any], filed: bool
) -> None:
    body = {"metadata": {"namespace": NS, "name": "a"}, "spec": spec, "status": status}
    assert holds_spares(body) is filed
    assert (SPARES_HOLDER in job_keys(body)) is filed


def test_an_allocation_reads_the_spares_of_the_filed_jobs_alone() -> None:
    cluster = cluster_with_pools("p1", "s1")
    cluster.apply_job("a", job_spec(placement={"spares": {"nodePools": ["s1"]}}))
    cluster.apply_job("b", job_spec())
    cluster._index()
    filed = [b["metadata"]["name"] for b in cluster.ctx.caches.jobs_holding_spares()]
    assert filed == ["a"]
    assert spares_of_others(cluster.ctx, job_holder(NS, "b")).names == frozenset({"s1"})
    assert not spares_of_others(cluster.ctx, job_holder(NS, "a"))
