"""``waitingTimeoutSeconds`` (``policies/patience.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import facts, plan_of, reasons, stamp_at
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.policies import patience
from tpu_operator.policies.plan import Act

pytestmark = pytest.mark.unit


def condition(type_: str, status: str, since: float, reason: str, message: str = "") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp_at(since),
    }


NO_POOL = condition("PodsScheduled", "False", 0, "WaitingForNodePools", "p1 is held")
SCHEDULED = condition("PodsScheduled", "True", 0, "Scheduled")
QUEUED = condition("Queued", "True", 30, "Pending", "insufficient quota")


@pytest.mark.parametrize(
    ("timeout", "now", "conditions", "phase", "fails", "requeue"),
    [
        (None, 1000, [NO_POOL], "Pending", False, None),  # unset: waits for ever
        (60, 10, [NO_POOL], "Pending", False, 50.0),  # looks again when it would expire
        (60, 61, [NO_POOL], "Pending", True, None),
        (60, 1000, [SCHEDULED], "Running", False, None),  # not waiting
        (60, 100, [QUEUED], "Queued", True, None),  # Kueue's queue counts too
        (60, 80, [QUEUED], "Queued", False, 10.0),
        (60, 1000, [NO_POOL], "Suspended", False, None),  # a suspended job is not waiting
    ],
)
def test_a_job_waits_for_capacity_at_most_its_timeout(
    timeout, now, conditions, phase, fails, requeue
):
    fields = {"waitingTimeoutSeconds": timeout} if timeout is not None else {}
    job = facts(now, recorded={"attempt": 0, "phase": phase, "conditions": conditions}, **fields)
    plan = plan_of(job)
    patience.check(job, plan)
    assert (plan.status.phase == Phase.FAILED) is fails
    assert plan.requeue == requeue
    if fails:
        assert plan.act is Act.STOP and reasons(plan) == ["Failed"]
        assert plan.condition_reason(ConditionType.FAILED) == Reason.WAITING_TIMEOUT
        assert "waitingTimeoutSeconds (60)" in plan.status.message
        assert conditions[0]["message"] in plan.status.message
