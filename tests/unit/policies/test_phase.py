"""The phase ladder of an attempt that goes on (``policies/phase.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, at, facts, plan_of, reasons, stamp_at
from tpu_operator.api.status import ConditionType, Phase
from tpu_operator.policies import phase
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack
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


def straggling_track(now: float) -> JobTrack:
    """Four workers of slice 0 read twice, 10 s apart up to ``now``: j-0-2 waits 0.4 s
    for data per step, the others 0.001 s."""
    track = JobTrack(attempt=1)
    for worker in range(4):
        pod = track.worker(f"j-0-{worker}", 0, worker, f"node-{worker}")
        for when, steps in ((now - 10, 1), (now, 21)):
            wait = (0.4 if worker == 2 else 0.001) * (steps - 1)
            track.observe(pod, worker_sample(at(when).timestamp(), steps, wait))
    return track


def worker_sample(when: float, steps: int, wait: float) -> WorkerSample:
    return WorkerSample(
        at=when,
        steps_total=steps,
        step=steps,
        tokens=steps * 100,
        step_seconds_sum=steps * 0.1,
        step_seconds_count=steps,
        start_time=1.0,
        phases={"data_wait": wait, "step": steps * 0.1},
    )


@pytest.mark.parametrize(
    ("straggler_before", "published_ago", "slowest"),
    [
        # The Straggler condition turns True: the progress written with it is fresh, so
        # slowestWorkers names the straggler the condition names.
        (False, 5, "j-0-2"),
        # Already said: the progress waits for its publish interval (30 s) as before.
        (True, 5, "j-0-0"),
        (True, 40, "j-0-2"),
    ],
)
def test_a_straggler_found_is_published_with_fresh_progress(
    straggler_before, published_ago, slowest
):
    now = 100.0
    conditions = [
        {"type": "Straggler", "status": str(straggler_before), "reason": "Straggler"},
    ]
    published = {
        "step": 5,
        "sampledTime": stamp_at(now - published_ago),
        "slowestWorkers": [{"slice": 0, "pod": "j-0-0", "stepSeconds": 0.1}],
    }
    recorded = {
        "attempt": 1,
        "phase": "Running",
        "runningSince": stamp_at(0),
        "conditions": conditions,
        "progress": published,
    }
    job = facts(now, recorded=recorded, track=straggling_track(now))
    plan = plan_of(job)
    phase.goes_on(job, plan, World(), gang("Running", ready=2), "Running", 1, False, False)
    assert plan.condition_is(ConditionType.STRAGGLER, True)
    assert plan.status.progress is not None
    assert plan.status.progress.slowest_workers[0].pod == slowest
