"""``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished`` (``policies/lifetime.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import facts, plan_of, stamp_at
from tpu_operator.policies import lifetime
from tpu_operator.policies.plan import Act

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("deadline", "started", "now", "passed", "requeue"),
    [
        (None, 0, 100, False, None),
        (60, None, 100, False, None),
        (60, 0, 30, False, 30.0),  # looks again when it will have passed
        (60, 0, 60, True, None),
        (60, 50, 100, False, 10.0),  # from startTime (reset on resume)
    ],
)
def test_the_deadline(deadline, started, now, passed, requeue):
    fields = {"activeDeadlineSeconds": deadline} if deadline is not None else {}
    status = {"startTime": stamp_at(started)} if started is not None else {}
    job = facts(now, recorded=status, **fields)
    plan = plan_of(job)
    assert lifetime.deadline_passed(job, plan) is passed
    assert plan.requeue == requeue


@pytest.mark.parametrize(
    ("ttl", "now", "act", "requeue"),
    [
        (None, 1000, Act.STOP, None),
        (300, 200, Act.STOP, 200.0),
        (300, 400, Act.DELETE, None),
    ],
)
def test_a_finished_job_is_deleted_after_its_ttl(ttl, now, act, requeue):
    fields = {"ttlSecondsAfterFinished": ttl} if ttl is not None else {}
    recorded = {"phase": "Succeeded", "completionTime": stamp_at(100)}
    job = facts(now, recorded=recorded, **fields)
    plan = plan_of(job)
    lifetime.finished(job, plan)
    assert (plan.act, plan.requeue) == (act, requeue)
    assert plan.condition_is("PodsStopped", True)  # type: ignore[arg-type]
