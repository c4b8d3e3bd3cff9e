"""Status-write pacing: counters wait, everything else goes out at once."""

from __future__ import annotations

import pytest

from tests.unit.fakeapi import ManualClock
from tpu_operator.reconcile.pacing import (
    StatusPacer,
    clock_only,
    counters_only,
    material_slice,
    reconcile_spacing,
)


def status(waiting: int, phase: str = "Restarting", **extra: object) -> dict[str, object]:
    return {
        "phase": phase,
        "attempt": 2,
        "ready": f"{256 - waiting}/256",
        "readyWorkers": 256 - waiting,
        "message": f"waiting for {waiting} pods",
        "conditions": [
            {
                "type": "Running",
                "status": "False",
                "reason": phase,
                "message": f"attempt 2: waiting for {waiting} pods of the previous attempt",
                "lastTransitionTime": "2026-11-21T22:47:26Z",
            }
        ],
        "slices": [{"index": 0, "phase": phase, "workers": 256, "readyWorkers": 256 - waiting}],
        **extra,
    }


pytestmark = pytest.mark.unit


def goodput(wall: float, finished: float = 0.0) -> dict[str, object]:
    return {
        "wallSeconds": wall,
        "badputSeconds": {"restartDowntime": wall - 6},
        "finishedAttempts": {"productive": finished},
    }


def test_counts_messages_and_the_live_goodput_account_are_counters_only():
    assert counters_only(status(200), status(150))
    assert counters_only(status(200, goodput=goodput(6.5)), status(150, goodput=goodput(7.2)))


def test_a_slice_summarys_phase_is_paced_as_its_count_is():
    """The job's summary of a slice follows that slice's phase (the slice's own status
    says it at once); its failures and pool are material."""
    before = status(200)
    after = status(200)
    after["slices"] = [{**before["slices"][0], "phase": "Running"}]  # type: ignore[index]
    assert counters_only(before, after)
    failed = status(200)
    failed["slices"] = [{**before["slices"][0], "failures": 1}]  # type: ignore[index]
    assert not counters_only(before, failed)


def test_a_change_of_the_live_goodput_alone_is_no_reason_to_write():
    before = status(200, goodput=goodput(6.5))
    assert clock_only(before, status(200, goodput=goodput(36.5)))
    assert not clock_only(before, status(199, goodput=goodput(36.5)))  # and a count
    assert not clock_only(before, status(200, goodput=goodput(36.5, 5.0)))  # carried
    assert not clock_only(status(200), status(200, goodput=goodput(6.5)))  # its first


def test_goodput_carried_from_finished_attempts_is_material():
    before, after = status(200, goodput=goodput(6.5)), status(200, goodput=goodput(7, 5.0))
    assert not counters_only(before, after)


def test_phase_reason_attempt_and_new_fields_are_material():
    assert not counters_only(status(200), status(200, phase="Running"))
    assert not counters_only(status(200), {**status(200), "attempt": 3})
    assert not counters_only(status(200), status(200, lastFailure={"reason": "Failed"}))
    flipped = status(200)
    flipped["conditions"][0]["status"] = "True"  # type: ignore[index]
    assert not counters_only(status(200), flipped)


def test_first_write_and_material_writes_are_never_held():
    clock = ManualClock(100.0)
    pacer = StatusPacer(interval=1.0, clock=clock)
    assert pacer.hold("uid", status(200), status(199)) == 0.0  # nothing written yet
    pacer.wrote("uid")
    assert pacer.hold("uid", status(199), status(199, phase="Running")) == 0.0
    assert pacer.hold("other", status(199), status(198)) == 0.0


def test_counter_writes_wait_for_the_rest_of_the_interval():
    clock = ManualClock(100.0)
    pacer = StatusPacer(interval=1.0, clock=clock)
    pacer.wrote("uid")
    clock.now += 0.25
    assert pacer.hold("uid", status(200), status(190)) == 0.75
    clock.now += 0.75
    assert pacer.hold("uid", status(200), status(190)) == 0.0
    assert pacer.hold("uid", status(190), status(190)) == 0.0  # nothing to write


@pytest.mark.parametrize(
    ("interval", "sharing", "spaced"),
    [
        (1.0, 1, 1.0),
        (1.0, 4, 4.0),  # a slice of a 4-slice job
        (1.0, 199, 10.0),  # capped: a slice's counts are never more than 10 s old
        (0.5, 8, 4.0),
        (20.0, 4, 20.0),  # never less than the interval
        (1.0, 0, 1.0),
    ],
)
def test_objects_sharing_an_interval_space_their_counter_writes(interval, sharing, spaced):
    clock = ManualClock(100.0)
    pacer = StatusPacer(interval=interval, clock=clock)
    assert pacer.spaced(sharing) == spaced
    pacer.wrote("uid")
    clock.now += 0.5
    assert pacer.hold("uid", status(200), status(190), sharing) == pytest.approx(spaced - 0.5)
    # Material writes are never held, whatever the sharing.
    assert pacer.hold("uid", status(200), status(200, phase="Running"), sharing) == 0.0


def test_counters_wait_longer_while_many_objects_write():
    """A thousand jobs starting at once: counters-only writes of all objects together stay
    near ``busy_writes`` a second; material writes still go out at once."""
    clock = ManualClock(100.0)
    pacer = StatusPacer(interval=1.0, clock=clock, busy_writes=20.0)
    for i in range(19):
        pacer.wrote(f"o{i}")
    assert pacer.spaced() == 1.0  # a quiet cluster: each object's own interval
    for i in range(19, 200):
        pacer.wrote(f"o{i}")
    assert (pacer.spaced(), pacer.spaced(sharing=4), pacer.spaced(sharing=199)) == (10, 10, 10)
    for i in range(200, 1000):
        pacer.wrote(f"o{i}")
    assert pacer.spaced() == 30.0  # never more stale than MAX_BUSY_INTERVAL
    clock.now += 0.5
    assert pacer.hold("o5", status(200), status(190)) == pytest.approx(29.5)
    assert pacer.hold("o5", status(200), status(200, phase="Running")) == 0.0
    assert pacer.hold("new", status(200), status(190)) == 0.0  # its first write
    clock.now += 30.0  # the burst is over: the objects that wrote in it no longer count
    assert pacer.spaced() == 1.0
    assert pacer.hold("o5", status(200), status(190)) == 0.0


@pytest.mark.parametrize(
    ("pods", "minimum", "spacing"),
    [
        (0, 0.1, 0.1),  # a job without pods yet: the operator's minimum
        (256, 0.1, 0.1),
        (1_000, 0.1, 0.1),  # up to 1,000 pods nothing changes
        (500, 0.0, 0.0),  # not even a minimum of 0 (reconcile on every event)
        (2_000, 0.0, 0.2),
        (4_096, 0.1, 0.4096),
        (12_736, 0.1, 1.2736),  # 199 slices of v5litepod-256
        (12_736, 2.0, 2.0),  # a larger minimum wins
        (1_000_000, 0.1, 5.0),  # capped: a job is never left alone for long
    ],
)
def test_reconcile_spacing_grows_with_the_pods_of_a_job(pods, minimum, spacing):
    assert reconcile_spacing(pods, minimum) == pytest.approx(spacing)


@pytest.mark.parametrize(
    ("pods", "changes", "spacing"),
    [
        (256, 0, 0.1),  # up to 1,000 pods: the minimum, whatever changed
        (1000, 0, 0.1),
        (2000, None, 0.2),  # an urgent event: the spacing alone
        (2000, 32, 0.2),  # 1/64 of the pods changed
        (2000, 31, 0.8),  # fewer: four times the spacing
        (4096, 10, 1.6384),
        (12736, 199, 1.2736),
        (12736, 198, 5.0),  # capped
        (12736, None, 1.2736),
    ],
)
def test_a_large_job_waits_longer_until_enough_of_its_pods_changed(pods, changes, spacing):
    assert reconcile_spacing(pods, 0.1, changes) == pytest.approx(spacing)


def slice_body(**status: object) -> dict[str, object]:
    base: dict[str, object] = {
        "phase": "Starting",
        "attempt": 1,
        "createdAttempt": 1,
        "readyWorkers": 3,
        "message": "3/64 ready",
        "conditions": [{"type": "Ready", "status": "False", "reason": "Starting", "message": "3"}],
    }
    return {"metadata": {"uid": "u", "generation": 1}, "status": {**base, **status}}


def test_a_slice_whose_counters_alone_moved_tells_its_job_nothing_new():
    before = material_slice(slice_body())
    conditions = [{"type": "Ready", "status": "False", "reason": "Starting", "message": "9"}]
    assert material_slice(slice_body(readyWorkers=9, message="9/64 ready")) == before
    assert material_slice(slice_body(conditions=conditions)) == before
    ready = [{"type": "Ready", "status": "True", "reason": "Running", "message": ""}]
    for changed in (
        slice_body(phase="Running"),
        slice_body(createdAttempt=2),
        slice_body(conditions=ready),
        slice_body(failure={"reason": "InvalidPodTemplate", "attempt": 1}),
    ):
        assert material_slice(changed) != before
    respecified = slice_body()
    respecified["metadata"] = {"uid": "u", "generation": 2}
    assert material_slice(respecified) != before
