"""A running job's recorded pools (``policies/pools.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.placement.pools import PoolGone
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
