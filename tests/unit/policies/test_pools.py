"""A running job's recorded pools (``policies/pools.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
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
