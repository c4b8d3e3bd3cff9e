"""Elastic multislice: which slices an attempt runs without, and growing back
(``policies/elastic.py``)."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from tests.unit.policies.world import World, facts, plan_of, reasons, stamp_at
from tpu_operator.api.job import DroppedSlice, TPUJobSpec
from tpu_operator.api.status import Phase, Reason, RestartKind
from tpu_operator.placement.pools import Allocation
from tpu_operator.policies import elastic, failure
from tpu_operator.progress import report
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.state.gang import WorkerFailure

pytestmark = pytest.mark.unit

BROKEN = "p1 has 1 of its 2 VMs not ready or cordoned"


@pytest.mark.parametrize(
    ("num", "stuck", "minimum", "dropped"),
    [
        (3, {}, 2, {}),
        # One slice cannot come back: the others go on without it.
        (3, {1: "broken"}, 2, {1: "broken"}),
        (3, {0: "broken"}, 2, {0: "broken"}),
        # Fewer than minSlices would remain: nobody is dropped (the job waits).
        (3, {0: "a", 2: "b"}, 2, {}),
        (3, {0: "a", 2: "b"}, 1, {0: "a", 2: "b"}),
        (2, {1: "broken"}, 2, {}),
        # Every slice stuck: nothing to train on.
        (2, {0: "a", 1: "b"}, 1, {}),
        # Indexes outside the job are not its slices.
        (2, {5: "x"}, 1, {}),
    ],
)
def test_slices_to_drop(num, stuck, minimum, dropped):
    assert elastic.slices_to_drop(num, stuck, minimum) == dropped


@pytest.mark.parametrize(
    ("num", "dropped", "world"),
    [(3, set(), None), (3, {1}, [0, 2]), (3, {0}, [1, 2]), (4, {0, 3}, [1, 2])],
)
def test_world_of(num, dropped, world):
    assert elastic.world_of(num, dropped) == world


def _dropped(*indexes: int, worn: bool = False) -> list[DroppedSlice]:
    return [DroppedSlice(index=i, reason="r", worn=worn) for i in indexes]


@pytest.mark.parametrize(
    ("dropped", "refs", "unhealthy", "own", "other"),
    [
        # Its pool healed: back on it.
        (_dropped(1), ["p0", "p1", "p2"], {}, [1], []),
        # Still broken: another pool is needed.
        (_dropped(1), ["p0", "p1", "p2"], {1: BROKEN}, [], [1]),
        # Its failures wore its pool out: never back on it.
        (_dropped(1, worn=True), ["p0", "p1", "p2"], {}, [], [1]),
        (_dropped(0, 2), ["p0", "p1", "p2"], {2: BROKEN}, [0], [2]),
        # A claim GKE never served is no pool to go back to.
        (_dropped(1), ["p0", "auto:c"], {}, [], [1]),
    ],
)
def test_pools_back(dropped, refs, unhealthy, own, other):
    assert elastic.pools_back(dropped, refs, unhealthy) == (own, other)


T = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("waited", "before", "now", "written"),
    [
        (1.0, 3.0, 3.0, False),
        (1.0, 3.0, 4.5, True),  # worker 0 spent more time saving: the checkpoint is written
        (1.0, None, 4.5, False),
        (1.0, 3.0, None, False),
        (elastic.CHECKPOINT_WAIT_SECONDS, 3.0, 3.0, True),  # waited long enough
        (elastic.CHECKPOINT_WAIT_SECONDS, None, None, True),
    ],
)
def test_checkpoint_written(waited, before, now, written):
    assert (
        elastic.checkpoint_written(
            requested_at=T,
            now=T + dt.timedelta(seconds=waited),
            saved_before=before,
            saved_now=now,
        )
        is written
    )


@pytest.mark.parametrize(
    ("num", "minimum", "error"),
    [(3, 2, None), (3, 3, None), (3, 4, "elastic.minSlices"), (3, 0, "elastic.minSlices")],
)
def test_min_slices_is_validated(num, minimum, error):
    raw = {
        "slice": {"type": "v5p-16"},
        "numSlices": num,
        "elastic": {"minSlices": minimum},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
    }
    if error is None:
        assert TPUJobSpec.model_validate(raw).elastic.min_slices == minimum
        return
    with pytest.raises(ValidationError, match=error):
        TPUJobSpec.model_validate(raw)


def lost(pod: str) -> WorkerFailure:
    return WorkerFailure(Reason.NODE_LOST, f"node of {pod} lost", pod, "n1", None, None)


REFS = ["p0", "p1", "p2"]


@pytest.mark.parametrize(
    ("elastic_spec", "allocation", "active", "dropped", "events"),
    [
        # Elastic, no free healthy pool: the job trains on 2 of 3 slices.
        ({"minSlices": 2}, None, 2, [1], ["Restarting", "SlicesDropped"]),
        # A free healthy pool: the slice moves there, nobody is dropped.
        ({"minSlices": 2}, ["p0", "spare", "p2"], 3, [], ["Restarting", "NodePoolUnhealthy"]),
        # minSlices 3: waits for the repair, as a job that is not elastic.
        ({"minSlices": 3}, None, 3, [], ["Restarting", "NodePoolUnhealthy"]),
        (None, None, None, [], ["Restarting", "NodePoolUnhealthy"]),
    ],
)
def test_a_restart_drops_a_slice_it_cannot_bring_back(
    elastic_spec, allocation, active, dropped, events
):
    fields = {"numSlices": 3} | ({"elastic": elastic_spec} if elastic_spec else {})
    job = facts(recorded={"attempt": 1, "nodePools": REFS, "phase": "Running"}, **fields)
    plan = plan_of(job)
    world = World(
        unhealthy={1: BROKEN},
        allocation=Allocation(allocation, "no free pool" if allocation is None else ""),
    )
    failure.attempt_failed(job, plan, world, lost("j-1-0"), 1)
    status = plan.status
    assert status.phase == Phase.RESTARTING and status.attempt == 2
    assert status.active_slices == active
    assert [d.index for d in status.dropped_slices] == dropped
    assert reasons(plan) == events
    if dropped:
        assert status.restart_kind == RestartKind.RECREATE
        assert BROKEN in status.dropped_slices[0].reason
        message = plan.events[1][2]
        assert "training on 2 of 3 slices" in message and "without slice 1" in message


def test_a_slice_whose_pool_failures_ran_out_is_dropped_when_it_cannot_move():
    recorded = {
        "attempt": 3,
        "nodePools": REFS,
        "slices": [
            {
                "index": i,
                "name": f"j-{i}",
                "phase": "Running",
                "workers": 2,
                "readyWorkers": 2,
                "nodePool": REFS[i],
                "failures": 1 if i == 2 else 0,
                "poolFailures": 1 if i == 2 else 0,
            }
            for i in range(3)
        ],
    }
    job = facts(
        recorded=recorded,
        numSlices=3,
        elastic={"minSlices": 2},
        failurePolicy={"maxSliceFailuresPerPool": 2},
    )
    plan = plan_of(job)
    world = World(allocation=Allocation(None, "no free pool"))
    cause = WorkerFailure(Reason.WORKER_FAILED, "exit 1", "j-2-0", "n2", 1, None)
    failure.attempt_failed(job, plan, world, cause, 3)
    status = plan.status
    ((dropped),) = status.dropped_slices
    assert dropped.index == 2 and dropped.worn
    assert "maxSliceFailuresPerPool" in dropped.reason
    assert status.active_slices == 2 and status.counted_restarts == 1


def degraded(**recorded):
    return {
        "attempt": 2,
        "phase": "Running",
        "runningSince": stamp_at(10),
        "nodePools": REFS,
        "activeSlices": 2,
        "droppedSlices": [{"index": 1, "reason": BROKEN, "since": stamp_at(5)}],
        "restarts": 1,
        "countedRestarts": 0,
        "lastFailure": {"attempt": 1, "reason": "NodeLost", "message": "m", "time": stamp_at(5)},
        **recorded,
    }


def _grow(recorded, world, *, now=100.0, supervised=True, track=None):
    job = facts(now, recorded=recorded, numSlices=3, elastic={"minSlices": 2}, track=track)
    job.supervised = supervised
    plan = plan_of(job)
    elastic.grow(job, plan, world, recorded["attempt"])
    return plan


def test_no_pool_back_keeps_the_smaller_world():
    plan = _grow(degraded(), World(unhealthy={1: BROKEN}, allocation=Allocation(None, "none")))
    status = plan.status
    assert status.attempt == 2 and status.grow_back is None and plan.events == []
    assert plan.requeue == elastic.RECHECK_SECONDS


def test_a_healed_pool_asks_for_a_checkpoint_first():
    plan = _grow(degraded(), World())
    status = plan.status
    assert status.attempt == 2 and status.phase == Phase.RUNNING
    assert status.grow_back is not None and status.grow_back.requested_at == stamp_at(100)
    assert status.checkpoint_requests == 1 and len(plan.checkpoint_for) == 1
    assert reasons(plan) == ["CheckpointRequested"]


def track_with(checkpoint_seconds: float) -> JobTrack:
    track = JobTrack(attempt=2)
    sample = WorkerSample(at=99.0, step=7, phases={"checkpoint_save": checkpoint_seconds})
    track.observe(track.worker("j-0-0", 0, 0, "n0"), sample)
    return track


@pytest.mark.parametrize(
    ("now", "before", "saved", "grows"),
    [
        (110.0, 1.0, 1.0, False),  # asked, not written yet
        (110.0, 1.0, 2.5, True),  # written
        (100.0 + elastic.CHECKPOINT_WAIT_SECONDS, 1.0, 1.0, True),  # waited long enough
    ],
)
def test_growing_back_after_the_checkpoint(now, before, saved, grows):
    recorded = degraded(growBack={"requestedAt": stamp_at(100), "checkpointSaveSeconds": before})
    plan = _grow(recorded, World(), now=now, track=track_with(saved))
    status = plan.status
    if not grows:
        assert status.attempt == 2 and plan.events == [] and plan.requeue is not None
        # The request again, word for word (the same id: asked of a worker once), in case
        # it was not sent; counted once.
        assert plan.checkpoint_for == _grow(degraded(), World()).checkpoint_for
        assert status.checkpoint_requests == 0
        return
    assert status.attempt == 3 and status.phase == Phase.RESTARTING
    assert status.dropped_slices == [] and status.active_slices == 3
    assert status.restart_kind == RestartKind.RECREATE and status.grow_back is None
    # Not a failure: not counted against maxRestarts.
    assert status.restarts == 2 and status.counted_restarts == 0
    assert status.restarts_by_reason == {"SlicesRestored": 1}
    assert reasons(plan) == ["SlicesRestored"]


def test_growing_back_onto_another_free_pool():
    world = World(unhealthy={1: BROKEN}, allocation=Allocation(["p0", "spare", "p2"]))
    plan = _grow(degraded(), world, supervised=False)
    status = plan.status
    # Unsupervised workers cannot be asked to checkpoint: the restart follows at once.
    assert status.attempt == 3 and status.node_pools == ["p0", "spare", "p2"]
    (requests,) = world.allocated
    assert [r.pinned for r in requests] == ["p0", None, "p2"] and requests[1].leaves == "p1"
    assert not requests[1].provision and not requests[1].fresh


def test_a_slice_of_new_vms_grows_back_only_onto_a_pool_of_them():
    job = facts(
        100.0,
        recorded=degraded(),
        numSlices=3,
        elastic={"minSlices": 2},
        placement={"capacity": "FlexStart"},
    )
    job.supervised = False
    world = World(unhealthy={1: BROKEN}, allocation=Allocation(None, "none"))
    plan = plan_of(job)
    elastic.grow(job, plan, world, 2)
    (requests,) = world.allocated
    # A free pool of other capacity is never taken (fresh), nor is a new one asked for.
    assert requests[1].fresh and not requests[1].provision
    assert plan.status.attempt == 2 and plan.status.grow_back is None


def test_a_full_job_does_not_grow():
    recorded = {"attempt": 1, "phase": "Running", "nodePools": REFS}
    plan = _grow(recorded, World())
    assert plan.status.attempt == 1 and plan.events == []


def test_a_job_that_is_not_running_waits_to_grow():
    plan = _grow(degraded(phase="Starting"), World())
    assert plan.status.attempt == 2 and plan.events == []


def test_a_restart_of_a_smaller_job_brings_healed_slices_back():
    job = facts(recorded=degraded(), numSlices=3, elastic={"minSlices": 2})
    plan = plan_of(job)
    failure.attempt_failed(job, plan, World(), lost("j-2-0"), 2)
    status = plan.status
    assert status.attempt == 3 and status.dropped_slices == [] and status.active_slices == 3
    assert status.restart_kind == RestartKind.RECREATE
    assert "SlicesRestored" in reasons(plan)


def test_dropped_capacity_is_booked_as_degraded():
    job = facts(recorded=degraded(), numSlices=3, elastic={"minSlices": 2})
    plan = plan_of(job)
    assert plan.account.degraded() == pytest.approx(1 / 3)
    full = plan_of(facts(recorded={"attempt": 1}, numSlices=3))
    assert full.account.degraded() == 0.0


@pytest.mark.parametrize(
    ("share", "degraded", "productive"), [(0.0, 0.0, 90.0), (1 / 3, 30.0, 60.0)]
)
def test_the_missing_share_of_step_time_is_badput(share, degraded, productive):
    sample = WorkerSample(at=1100.0, step=50, start_time=1000.0, phases={"step": 90.0})
    live = report.goodput(
        created=1000.0,
        now=1100.0,
        carried={},
        current=sample,
        waiting_since=None,
        waiting_kind="other",
        degraded=share,
    )
    assert live.badput_seconds[report.DEGRADED] == pytest.approx(degraded, abs=0.1)
    assert live.productive_seconds == pytest.approx(productive, abs=0.1)
    # Carried over when the attempt ends, and counted once.
    carried = report.carry_over({}, sample, closed_at=1100.0, degraded=share)
    assert carried.get(report.DEGRADED, 0.0) == pytest.approx(degraded)
    after = report.goodput(
        created=1000.0,
        now=1200.0,
        carried=carried,
        current=None,
        waiting_since=None,
        waiting_kind="other",
    )
    assert after.badput_seconds[report.DEGRADED] == pytest.approx(degraded, abs=0.1)
    assert after.productive_seconds == pytest.approx(productive, abs=0.1)
