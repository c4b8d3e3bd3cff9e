"""Placement and the start of an attempt (``policies/start.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.api.status import ConditionType, Phase
from tpu_operator.placement.pools import Allocation
from tpu_operator.policies import start
from tpu_operator.policies.plan import Act

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("attempt", "status", "multi_host", "starts"),
    [
        (0, {}, True, True),  # not started
        (1, {"phase": "Suspended"}, True, True),  # resumed
        (1, {"phase": "Queued"}, True, True),  # admitted again
        (1, {"phase": "Pending"}, True, True),  # resumed, still waiting for pools
        (1, {"phase": "Running", "nodePools": ["p1"]}, True, False),
        (1, {"phase": "Running"}, False, False),  # single-host slices record no pools
    ],
)
def test_when_an_attempt_starts(attempt, status, multi_host, starts):
    job = facts(recorded=status, slice={"type": "v5p-16" if multi_host else "v5litepod-4"})
    assert start.should_start(job, plan_of(job), attempt) is starts


@pytest.mark.parametrize(
    ("allocation", "admitted", "phase", "pools", "act", "events"),
    [
        (Allocation(["p1"]), None, Phase.PENDING, ["p1"], Act.RUN, ["NodePoolsAssigned"]),
        (Allocation(["auto:c"]), None, Phase.PENDING, ["auto:c"], Act.RUN, ["WaitingForNodePools"]),
        (
            Allocation(None, "p1 is held by TPUJob ml/a"),
            None,
            Phase.PENDING,
            None,
            Act.NOTHING,
            ["WaitingForNodePools"],
        ),
        # An admission's topology assignment is taken as it is.
        (
            Allocation(None, "unused"),
            ["kueue-pool"],
            Phase.PENDING,
            ["kueue-pool"],
            Act.RUN,
            ["NodePoolsAssigned"],
        ),
    ],
)
def test_a_first_attempt_takes_pools_for_every_slice_or_waits(
    allocation, admitted, phase, pools, act, events
):
    job = facts()
    plan = plan_of(job)
    world = World(allocation=allocation)
    start.start(job, plan, world, 0, admitted)
    status = plan.status
    assert (status.phase, status.node_pools, plan.act) == (phase, pools, act)
    assert reasons(plan) == events
    assert status.attempt == (1 if act is Act.RUN else 0)
    assert bool(world.allocated) == (admitted is None)
    if act is Act.NOTHING:
        assert status.message == allocation.message
        assert plan.condition_reason(ConditionType.PODS_SCHEDULED) == "WaitingForNodePools"
        assert plan.requeue == start.POOL_RETRY_SECONDS


def test_a_resumed_job_starts_a_new_attempt_and_says_so():
    job = facts(recorded={"attempt": 3, "phase": "Suspended"})
    plan = plan_of(job)
    plan.condition(ConditionType.SUSPENDED, True, "Suspended")
    plan.condition(ConditionType.PODS_STOPPED, True, "AllPodsStopped")
    start.start(job, plan, World(), 3, None)
    assert (plan.status.attempt, plan.status.running_since) == (4, None)
    assert reasons(plan) == ["NodePoolsAssigned", "Resumed"]
    assert plan.condition_is(ConditionType.SUSPENDED, False)
    assert plan.condition_is(ConditionType.PODS_STOPPED, False)
