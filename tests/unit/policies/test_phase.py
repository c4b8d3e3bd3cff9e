"""The phase ladder of an attempt that goes on (``policies/phase.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.api.status import Phase
from tpu_operator.policies import phase
from tpu_operator.state.gang import GangState, Member, SliceCount

pytestmark = pytest.mark.unit


def gang(outcome: str, ready: int = 0, to_create: int = 0, stale: int = 0) -> GangState:
    state = GangState(attempt=1, outcome=outcome, total=2, ready=ready)  # type: ignore[arg-type]
    state.to_create = [Member(0, i, f"j-0-{i}") for i in range(to_create)]
    state.stale = [None] * stale  # type: ignore[list-item]
    state.slices = {0: SliceCount(total=2, existing=2 - to_create, ready=ready)}
    return state


@pytest.mark.parametrize(
    ("ran", "outcome", "to_create", "stale", "backing_off", "expected", "message"),
    [
        (False, "Creating", 2, 0, False, Phase.PENDING, "attempt 1: creating 2 pods"),
        (False, "Creating", 1, 0, False, Phase.STARTING, "attempt 1: 0/2 workers ready"),
        (False, "Starting", 0, 0, False, Phase.STARTING, "attempt 1: 0/2 workers ready"),
        # Once every worker of the attempt has run, a worker not ready keeps it Running.
        (True, "Starting", 0, 0, False, Phase.RUNNING, "all 2 workers running, 0 ready"),
        (False, "Running", 0, 0, False, Phase.RUNNING, "attempt 1: all 2 workers running"),
        (False, "Creating", 2, 2, False, Phase.RESTARTING, "waiting for 2 pods of the previous"),
        (False, "Creating", 2, 0, True, Phase.RESTARTING, "restart backoff until"),
    ],
)
def test_the_phase_and_message_of_an_attempt(
    ran, outcome, to_create, stale, backing_off, expected, message
):
    state = gang(outcome, to_create=to_create, stale=stale)
    found = phase.of_attempt(ran, outcome, state, bool(stale), backing_off)
    assert found == expected
    said = phase.message(found, outcome, state, 1, bool(stale), False, "2026-01-01T00:01:00Z")
    assert message in said


@pytest.mark.parametrize(
    ("previous", "restarts", "events", "timed"),
    [
        (None, 0, ["Running"], True),  # the first attempt: time to running is measured
        ("Starting", 1, ["Running"], False),
        ("Running", 0, [], False),  # already running: nothing new to say
    ],
)
def test_running_is_announced_once(previous, restarts, events, timed):
    recorded = {"attempt": 1, "restarts": restarts}
    if previous is not None:
        recorded["phase"] = previous
    job = facts(recorded=recorded)
    plan = plan_of(job)
    world = World()
    phase.goes_on(job, plan, world, gang("Running", ready=2), "Running", 1, False, False)
    assert plan.status.phase == Phase.RUNNING
    assert plan.status.running_since is not None
    assert reasons(plan) == events
    for action in plan.after_commit:
        action()
    assert bool(world.metrics.running_after) == timed


def test_summaries_count_the_ready_slices():
    job = facts(recorded={"attempt": 1}, numSlices=2)
    plan = plan_of(job)
    state = gang("Starting", ready=2)
    state.slices[1] = SliceCount(total=2, existing=2, ready=1)
    phase.summaries(job, plan, state)
    assert plan.status.slices_ready == "1/2"
    assert [s.name for s in plan.status.slices] == ["j-0", "j-1"]
