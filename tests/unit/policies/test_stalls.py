"""Stalled training (``policies/stalls.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import at, facts, plan_of, reasons
from tpu_operator.api.status import ConditionType
from tpu_operator.policies import stalls
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack

pytestmark = pytest.mark.unit


def track(step_at: float | None) -> JobTrack | None:
    if step_at is None:
        return None
    found = JobTrack(attempt=1)
    worker = found.worker("j-0-0", 0, 0, "n0")
    found.observe(worker, WorkerSample(at=at(step_at).timestamp(), steps_total=7, step=7))
    return found


@pytest.mark.parametrize(
    ("step_at", "now", "stalled", "reason"),
    [
        (None, 100, False, None),  # no samples: nothing to say
        (90, 100, False, "Progressing"),
        (0, 100, True, "Stalled"),  # the default stallTimeout is shorter than 100 s
    ],
)
def test_a_stall(step_at, now, stalled, reason):
    job = facts(
        now, recorded={"attempt": 1}, track=track(step_at), monitoring={"stallTimeout": "60s"}
    )
    plan = plan_of(job)
    found = stalls.stall(job, plan)
    assert (found is not None) is stalled
    assert plan.condition_reason(ConditionType.STALLED) == reason
    assert reasons(plan) == (["Stalled"] if stalled else [])
    if found is not None:
        assert found.pod == "j-0-0" and "at step 7" in found.message
