"""Suspension and success (``policies/suspend.py``, ``policies/success.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import facts, plan_of, reasons
from tpu_operator.api.status import ConditionType, Phase
from tpu_operator.policies import success, suspend
from tpu_operator.policies.plan import Act
from tpu_operator.state.gang import GangState

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("phase", "active", "terminating", "message", "stopped", "events"),
    [
        ("Running", 2, 0, "suspended; 2 pods still stopping", False, ["Suspended"]),
        ("Suspended", 0, 1, "suspended; 1 pods still stopping", False, []),
        ("Suspended", 0, 0, "suspended", True, []),
    ],
)
def test_a_suspended_job_stops_and_says_when_its_pods_are_gone(
    phase, active, terminating, message, stopped, events
):
    job = facts(recorded={"attempt": 1, "phase": phase, "nodePools": ["p1"]}, suspend=True)
    plan = plan_of(job)
    plan.status.active_pods, plan.status.terminating_pods = active, terminating
    suspend.suspend(job, plan)
    status = plan.status
    assert (status.phase, status.node_pools, plan.act) == (Phase.SUSPENDED, None, Act.STOP)
    assert status.message == message
    assert plan.condition_is(ConditionType.PODS_STOPPED, stopped)
    assert reasons(plan) == events


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("AllWorkers", "all 4 workers exited 0"),
        ("LeaderWorker", "worker 0 of slice 0 exited 0 (successPolicy LeaderWorker)"),
    ],
)
def test_success(policy, message):
    job = facts(recorded={"attempt": 1, "nodePools": ["p1"]}, successPolicy=policy)
    plan = plan_of(job)
    success.succeed(job, plan, GangState(attempt=1, outcome="Succeeded", total=4))
    status = plan.status
    assert (status.phase, status.message, status.node_pools) == (Phase.SUCCEEDED, message, None)
    assert plan.act is Act.STOP and reasons(plan) == ["Succeeded"]
    assert plan.condition_reason(ConditionType.SUCCEEDED) == policy
