"""A running job's recorded pools (``policies/pools.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.api.status import ConditionType
from tpu_operator.placement.pools import Allocation, PoolGone
from tpu_operator.policies import pools

pytestmark = pytest.mark.unit

GONE = PoolGone(
    0, "p1", True, "slice 0: node pool p1 has no nodes; its pods ask GKE for a new pool"
)
KEPT = PoolGone(0, "p1", False, "slice 0: pinned node pool p1 has no nodes; waiting")


@pytest.mark.parametrize(
    ("recorded", "world", "created", "after", "events"),
    [
        (["p1"], World(), {}, ["p1"], []),
        (["p1"], World(gone=[GONE]), {}, ["auto:claim-0-1"], ["NodePoolGone"]),
        # Its pods exist already: a new pool only for the next attempt's.
        (["p1"], World(gone=[GONE]), {0: {"status": {"createdAttempt": 1}}}, ["p1"], []),
        (["p1"], World(gone=[KEPT]), {}, ["p1"], []),
        (["auto:c"], World(resolved={0: "gke-made"}), {}, ["gke-made"], ["NodePoolsAssigned"]),
        (["auto:c"], World(still_provisioning=["slice 0: no nodes yet"]), {}, ["auto:c"], []),
    ],
)
def test_vanished_and_created_pools(recorded, world, created, after, events):
    job = facts(recorded={"attempt": 1, "nodePools": recorded}, slices=created)
    plan = plan_of(job)
    pools.check(job, plan, world)
    assert plan.status.node_pools == after
    assert reasons(plan) == events
    assert plan.pools_gone == [
        g.message for g in world.gone if g.index not in created or not g.reclaim
    ]


BROKEN = "p1 has 1 of its 2 VMs not ready or cordoned"


@pytest.mark.parametrize(
    ("unhealthy", "recreated", "allocation", "placement", "after", "moved"),
    [
        # The recreated slice's pool is unhealthy: it moves to the free pool found.
        ({1: BROKEN}, [1], ["p0", "spare"], None, ["p0", "spare"], "moved to node pool spare"),
        # Healthy pools, or an unhealthy one of a slice that is not recreated: no move.
        ({}, [1], ["p0", "spare"], None, ["p0", "p1"], None),
        ({1: BROKEN}, [0], ["p0", "spare"], None, ["p0", "p1"], None),
        # No free healthy pool: the slice stays and says it waits for the repair.
        ({1: BROKEN}, [1], None, None, ["p0", "p1"], "wait for the repair"),
        # Pools the user pinned are never moved.
        ({1: BROKEN}, [1], ["p0", "spare"], {"nodePools": ["p0", "p1"]}, ["p0", "p1"], None),
    ],
)
def test_a_recreated_slice_leaves_an_unhealthy_pool(
    unhealthy, recreated, allocation, placement, after, moved
):
    fields = {"numSlices": 2} | ({"placement": placement} if placement else {})
    job = facts(recorded={"attempt": 2, "nodePools": ["p0", "p1"]}, **fields)
    plan = plan_of(job)
    world = World(
        unhealthy=unhealthy,
        allocation=Allocation(allocation, "no free pool" if allocation is None else ""),
    )
    pools.move_from_unhealthy(job, plan, world, recreated)
    assert plan.status.node_pools == after
    if moved is None:
        assert reasons(plan) == [] and world.allocated == []
        return
    ((_, reason, message),) = plan.events
    assert reason == "NodePoolUnhealthy" and moved in message and BROKEN in message
    # Every other slice keeps its pool (pinned in the request); the broken one may not
    # ask GKE for a new pool here.
    (requests,) = world.allocated
    assert [r.pinned for r in requests] == ["p0", None]
    assert requests[1].provision is False


@pytest.mark.parametrize(
    ("capacity", "allocation", "said"),
    [
        # Flex-start or queued-provisioning capacity comes as new VMs: the slice asks GKE
        # for a new pool of it (a claim) and never takes a free pool of another kind.
        ("FlexStart", ["p0", "auto:claim-1-2"], "ask GKE for a new node pool"),
        ("QueuedProvisioning", ["p0", "auto:claim-1-2"], "ask GKE for a new node pool"),
    ],
)
def test_a_slice_of_new_vms_moves_only_to_a_new_pool_of_them(capacity, allocation, said):
    job = facts(
        recorded={"attempt": 2, "nodePools": ["p0", "p1"]},
        numSlices=2,
        placement={"capacity": capacity},
    )
    plan = plan_of(job)
    world = World(unhealthy={1: BROKEN}, allocation=Allocation(allocation))
    pools.move_from_unhealthy(job, plan, world, [1])
    (requests,) = world.allocated
    assert [r.pinned for r in requests] == ["p0", None]
    assert requests[1].fresh and requests[1].provision
    assert requests[1].claim == "claim-1-2" and requests[1].leaves == "p1"
    assert plan.status.node_pools == allocation
    ((_, reason, message),) = plan.events
    assert reason == "NodePoolUnhealthy" and said in message and "claim-1-2" in message


def deleted(reclaim: bool) -> PoolGone:
    return PoolGone(1, "p1", reclaim, "slice 1: node pool p1 has no nodes; ...")


@pytest.mark.parametrize(
    ("gone", "recreated", "allocation", "placement", "after", "stuck", "events"),
    [
        # A recreated slice's pool was deleted: it moves to a free pool (a spare first).
        (deleted(False), [1], ["p0", "s"], None, ["p0", "s"], {}, ["NodePoolGone"]),
        (deleted(True), [1], ["p0", "s"], None, ["p0", "s"], {}, ["NodePoolGone"]),
        # Nowhere to move, and it may provision: not stuck (GKE makes it a new pool,
        # ``renew_vanished``), and nothing said here.
        (deleted(True), [1], None, None, ["p0", "p1"], {}, []),
        # Nowhere to move, and it may not provision: stuck (an elastic job may go on
        # without it); the wait is said by the status of the pool gone, not as a repair.
        (deleted(False), [1], None, None, ["p0", "p1"], {1: "has no nodes (deleted)"}, []),
        # A slice that is not recreated, or a pool the user pinned: left alone.
        (deleted(False), [0], ["p0", "s"], None, ["p0", "p1"], {}, []),
        (deleted(False), [1], ["p0", "s"], {"nodePools": ["p0", "p1"]}, ["p0", "p1"], {}, []),
    ],
)
def test_a_recreated_slice_leaves_a_deleted_pool(
    gone, recreated, allocation, placement, after, stuck, events
):
    fields = {"numSlices": 2} | ({"placement": placement} if placement else {})
    job = facts(recorded={"attempt": 2, "nodePools": ["p0", "p1"]}, **fields)
    plan = plan_of(job)
    world = World(
        gone=[gone],
        allocation=Allocation(
            allocation,
            "no free pool" if allocation is None else "",
            spares=[1] if allocation else [],
        ),
    )
    left = pools.move_from_unhealthy(job, plan, world, recreated)
    assert plan.status.node_pools == after
    assert left.keys() == stuck.keys()
    for index, words in stuck.items():
        assert words in left[index]
    assert reasons(plan) == events
    if events:
        assert "moved to spare node pool s" in plan.events[0][2]
    # A deleted pool is never reported as broken: it does not come back to be given out.
    assert plan.status.broken_node_pools == []


@pytest.mark.parametrize("reclaim", [True, False])
def test_a_deleted_pool_s_slice_that_may_provision_asks_gke_when_nothing_is_free(reclaim):
    """Slice 0's pool is broken, slice 1's deleted: both move at once. Slice 1 may ask GKE
    for a new pool (it may provision), so it never keeps slice 0 from a free pool."""
    job = facts(recorded={"attempt": 2, "nodePools": ["p0", "p1"]}, numSlices=2)
    plan = plan_of(job)
    world = World(
        unhealthy={0: "p0 has 1 of its 2 VMs not ready or cordoned"},
        gone=[deleted(reclaim)],
        allocation=Allocation(["p2", "auto:claim-1-2"], provisioning=[1]),
    )
    pools.move_from_unhealthy(job, plan, world, [0, 1])
    (requests,) = world.allocated
    assert [r.provision for r in requests] == [False, reclaim]
    if not reclaim:
        return  # (the stand-in allocator answers the same either way)
    assert plan.status.node_pools == ["p2", "auto:claim-1-2"]
    assert reasons(plan) == ["NodePoolUnhealthy", "NodePoolGone"]
    # The new pool asked for is said as a renewal is (the message of the pool gone).
    assert plan.events[1][2] == deleted(reclaim).message
    for report in plan.after_commit:
        report()
    assert world.metrics.moves == ["pool"]


def test_a_slice_moved_to_a_spare_reports_the_broken_pool():
    job = facts(
        recorded={"attempt": 2, "nodePools": ["p0", "p1"]},
        numSlices=2,
        placement={"spares": {"nodePools": ["s"]}},
    )
    plan = plan_of(job)
    world = World(unhealthy={1: BROKEN}, allocation=Allocation(["p0", "s"], spares=[1]))
    assert pools.move_from_unhealthy(job, plan, world, [1]) == {}
    assert plan.status.node_pools == ["p0", "s"]
    ((_, reason, message),) = plan.events
    assert reason == "NodePoolUnhealthy" and "moved to spare node pool s" in message
    # The moving slice may take a spare; the others keep their pools.
    (requests,) = world.allocated
    assert [(r.pinned, r.replacing, r.leaves) for r in requests] == [
        ("p0", False, None),
        (None, True, "p1"),
    ]
    ((pool),) = plan.status.broken_node_pools
    assert (pool.node_pool, pool.slice, pool.moved_to, pool.spare, pool.reason) == (
        "p1",
        1,
        "s",
        True,
        BROKEN,
    )
    (condition,) = [c for c in plan.conditions if c["type"] == "NodePoolsHealthy"]
    assert (condition["status"], condition["reason"]) == ("False", "NodePoolUnhealthy")
    assert "node pool p1 (slice 1 moved to spare s)" in condition["message"]
    for report in plan.after_commit:
        report()
    assert world.metrics.moves == ["spare"]


def test_a_slice_moved_for_its_failures_leaves_no_broken_pool_behind():
    job = facts(recorded={"attempt": 2, "nodePools": ["p0", "p1"]}, numSlices=2)
    plan = plan_of(job)
    world = World(allocation=Allocation(["p0", "p2"]))
    worn = {1: "3 failures on node pool p1"}
    assert pools.move_from_unhealthy(job, plan, world, [1], worn) == {}
    assert plan.status.node_pools == ["p0", "p2"]
    assert plan.status.broken_node_pools == []
    assert not plan.has_condition(ConditionType.NODE_POOLS_HEALTHY)
    for report in plan.after_commit:
        report()
    assert world.metrics.moves == ["pool"]


def broken(pool: str, index: int) -> dict[str, object]:
    return {"nodePool": pool, "slice": index, "movedTo": f"s{index}", "reason": "was broken"}


@pytest.mark.parametrize(
    ("recorded", "unhealthy", "left", "condition", "events"),
    [
        # Nothing was moved: no condition at all.
        ([], {}, [], None, []),
        # Still broken, as it was: nothing to write.
        ([broken("p1", 1)], {0: "was broken"}, ["p1"], None, []),
        # Still broken, otherwise: kept, with why now.
        ([broken("p1", 1)], {0: "p1 has 2 of its 2 VMs not ready"}, ["p1"], "False", []),
        # Healthy again (or gone): it leaves the list and is free.
        ([broken("p1", 1)], {}, [], "True", ["NodePoolsHealthy"]),
        (
            [broken("p1", 1), broken("p0", 0)],
            {1: "p0: 1 not ready"},
            ["p0"],
            "False",
            ["NodePoolsHealthy"],
        ),
    ],
)
def test_a_pool_moved_off_leaves_the_report_once_healthy(
    recorded, unhealthy, left, condition, events
):
    job = facts(
        recorded={"attempt": 2, "nodePools": ["s0", "s1"], "brokenNodePools": recorded},
        numSlices=2,
    )
    plan = plan_of(job)
    pools.check(job, plan, World(unhealthy=unhealthy))
    assert [b.node_pool for b in plan.status.broken_node_pools] == left
    assert [b.reason for b in plan.status.broken_node_pools] == [
        unhealthy[i] for i, b in enumerate(recorded) if b["nodePool"] in left
    ]
    found = [c for c in plan.conditions if c["type"] == "NodePoolsHealthy"]
    assert [c["status"] for c in found] == ([condition] if condition else [])
    assert reasons(plan) == events


def left_for_spare(pool: str, index: int, spare: str) -> dict[str, object]:
    return {**broken(pool, index), "movedTo": spare, "spare": True}


@pytest.mark.parametrize(
    ("recorded", "held", "gone", "spares", "said"),
    [
        # Left for a spare, healthy again: a spare of the job in the spare's place.
        (
            [left_for_spare("b1", 1, "s1")],
            [],
            [],
            ["b1"],
            "node pool b1 is healthy again; held as a spare of this job in place of spare s1, "
            "which slice 1 runs on",
        ),
        # Left for a free pool (no spare taken): free again.
        ([broken("b1", 1)], [], [], [], "node pool b1 is healthy again; it is free"),
        # Gone rather than healthy: nothing to hold.
        ([left_for_spare("b1", 1, "s1")], [], ["b1"], [], "node pool b1 is gone"),
        # Held already: listed once.
        (
            [left_for_spare("b1", 1, "s1")],
            ["b1"],
            [],
            ["b1"],
            "node pool b1 is healthy again; held as a spare of this job in place of spare s1, "
            "which slice 1 runs on",
        ),
        # A held spare that is gone leaves the list (nothing moved off now).
        ([], ["b1", "b2"], ["b2"], ["b1"], None),
        # A held spare a slice of the job runs on now is no spare: it leaves the list.
        ([], ["b1", "s0"], [], ["b1"], None),
    ],
)
def test_a_pool_left_for_a_spare_becomes_a_spare_once_healthy(recorded, held, gone, spares, said):
    job = facts(
        recorded={
            "attempt": 2,
            "nodePools": ["s0", "s1"],
            "brokenNodePools": recorded,
            "spareNodePools": held,
        },
        numSlices=2,
    )
    plan = plan_of(job)
    vanished = [PoolGone(i, p, False, f"{p} gone") for p in gone for i in range(8)]
    pools.check(job, plan, World(gone=vanished))
    assert plan.status.spare_node_pools == spares
    assert plan.status.broken_node_pools == []
    assert [m for _, r, m in plan.events if r == "NodePoolsHealthy"] == ([said] if said else [])
