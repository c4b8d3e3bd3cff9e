"""The progress and goodput account of a job across attempts (progress/account.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tpu_operator.api.common import Failure
from tpu_operator.api.job import TPUJobStatus
from tpu_operator.api.status import Phase
from tpu_operator.progress.account import Account
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def track_with(step: float, phases: dict[str, float], *, at_s: float, attempt: int = 1):
    track = JobTrack(attempt=attempt)
    worker = track.worker("j-0-0", 0, 0, "n0")
    track.observe(
        worker,
        WorkerSample(
            at=T0.timestamp() + at_s,
            steps_total=step,
            step=step,
            step_seconds_sum=phases.get("step", 0.0),
            step_seconds_count=step,
            start_time=T0.timestamp(),
            phases=phases,
        ),
    )
    return track


def leader_at(at_s: float, **sample: Any) -> JobTrack:
    """A track whose leader (worker 0 of slice 0) was read at ``at_s`` with ``sample``."""
    track = JobTrack(attempt=1)
    track.observe(
        track.worker("j-0-0", 0, 0, "n0"), WorkerSample(at=T0.timestamp() + at_s, **sample)
    )
    return track


def account(status: TPUJobStatus, now: float, track: JobTrack | None = None) -> Account:
    return Account(status, created=T0, now=at(now), track=track, publish_interval=30.0)


def test_waiting_for_the_first_attempt_is_scheduling():
    status = TPUJobStatus()
    account(status, 12).publish(Phase.STARTING, 4)
    assert status.goodput is not None
    assert status.goodput.badput_seconds["scheduling"] == 12.0
    assert status.goodput.fraction == 0.0


def test_began_running_books_the_wait_once():
    status = TPUJobStatus()
    account(status, 20).began_running(first_attempt=True)
    assert status.running_since == "2026-01-01T00:00:20Z"
    assert status.goodput is not None
    assert status.goodput.finished_attempts == {"scheduling": 20.0}
    account(status, 50).publish(Phase.RUNNING, 4)
    assert status.goodput.badput_seconds["scheduling"] == 20.0


def test_restart_downtime_runs_from_the_failure_to_running_again():
    status = TPUJobStatus(restarts=1)
    status.last_failure = Failure(attempt=1, reason="Failed", time="2026-01-01T00:01:00Z")
    account(status, 90).publish(Phase.PENDING, 4)
    assert status.goodput is not None
    assert status.goodput.badput_seconds["restartDowntime"] == 30.0
    account(status, 100).began_running(first_attempt=False)
    assert status.goodput.finished_attempts["restartDowntime"] == 40.0


def test_closing_an_attempt_carries_its_seconds_and_publishes_its_last_progress():
    status = TPUJobStatus(running_since="2026-01-01T00:00:10Z")
    track = track_with(100, {"step": 40.0, "compile": 5.0}, at_s=60)
    account(status, 61, track).close_attempt(4)
    assert status.running_since is None
    assert status.progress is not None and status.progress.step == 100
    assert status.goodput is not None
    carried = status.goodput.finished_attempts
    assert (carried["step"], carried["compilation"], carried["previousStep"]) == (40.0, 5.0, 100)
    assert status.goodput.productive_seconds == 40.0


def test_a_process_first_step_is_badput_of_its_own_in_every_attempt():
    """A restarted process redoes its first step (and waits in it for peers that still
    compile or restore): the account books it as firstStep, carried across attempts, and
    never as productive time."""
    status = TPUJobStatus(running_since="2026-01-01T00:00:00Z")
    first = {"step": 40.0, "compile": 5.0, "first_step": 12.0}
    account(status, 61, track_with(100, first, at_s=60)).close_attempt(4)
    assert status.goodput is not None
    assert status.goodput.finished_attempts["firstStep"] == 12.0
    status.running_since = "2026-01-01T00:01:30Z"
    second = {"step": 20.0, "first_step": 8.0}
    account(status, 130, track_with(150, second, at_s=129)).publish(Phase.RUNNING, 4)
    goodput = status.goodput
    assert goodput.badput_seconds["firstStep"] == 20.0
    # The step phase of both attempts, less the steps the second one redid.
    assert goodput.productive_seconds + goodput.badput_seconds["lostProgress"] == 60.0
    assert goodput.productive_seconds + sum(goodput.badput_seconds.values()) == pytest.approx(
        goodput.wall_seconds
    )


def test_progress_is_published_at_most_once_per_interval():
    status = TPUJobStatus(running_since="2026-01-01T00:00:00Z")
    account(status, 10, track_with(5, {"step": 5.0}, at_s=10)).publish(Phase.RUNNING, 1)
    assert status.progress is not None and status.progress.step == 5
    account(status, 20, track_with(9, {"step": 9.0}, at_s=20)).publish(Phase.RUNNING, 1)
    assert status.progress.step == 5  # 10 s after the last publish: not due
    account(status, 41, track_with(20, {"step": 20.0}, at_s=41)).publish(Phase.RUNNING, 1)
    assert status.progress.step == 20


def test_time_after_training_is_shutdown_not_other():
    status = TPUJobStatus(running_since="2026-01-01T00:00:10Z")
    track = JobTrack(attempt=1)
    worker = track.worker("j-0-0", 0, 0, "n0")
    track.observe(
        worker,
        WorkerSample(
            at=T0.timestamp() + 60,
            steps_total=50,
            step=50,
            step_seconds_sum=40.0,
            step_seconds_count=50,
            start_time=T0.timestamp() + 10,
            end_time=T0.timestamp() + 55,
            phases={"step": 40.0, "init": 5.0},
        ),
    )
    account(status, 62, track).publish(Phase.RUNNING, 1)
    assert status.goodput is not None
    assert status.goodput.badput_seconds["shutdown"] == 7.0
    account(status, 70, track).close_attempt(1)
    goodput = status.goodput
    assert goodput.finished_attempts["shutdown"] == 15.0
    assert goodput.badput_seconds["shutdown"] == 15.0
    assert goodput.badput_seconds["other"] == 70 - 40 - 5 - 15


@pytest.mark.parametrize("ran_at", [10.0, 10.7])
def test_init_before_every_worker_ran_is_not_booked_twice(ran_at: float):
    # The process started at 8 s; the operator saw every worker running at 10 s: the
    # 2 s in between are scheduling, not also initialization. At 10.7 s, runningSince
    # still says 10 s (second precision) and the worker's init is trimmed from there, so
    # the wait must end at 10 s too, or the 0.7 s would be booked twice.
    status = TPUJobStatus()
    account(status, ran_at).began_running(first_attempt=True)
    assert status.running_since == "2026-01-01T00:00:10Z"
    track = JobTrack(attempt=1)
    worker = track.worker("j-0-0", 0, 0, "n0")
    track.observe(
        worker,
        WorkerSample(
            at=T0.timestamp() + 30,
            steps_total=10,
            step=10,
            step_seconds_sum=15.0,
            step_seconds_count=10,
            start_time=T0.timestamp() + 8,
            phases={"init": 7.0, "step": 15.0},
        ),
    )
    account(status, 30, track).publish(Phase.RUNNING, 1)
    goodput = status.goodput
    assert goodput is not None
    assert goodput.badput_seconds["scheduling"] == 10.0
    assert goodput.badput_seconds["initialization"] == 5.0
    booked = goodput.productive_seconds + sum(goodput.badput_seconds.values())
    assert booked == goodput.wall_seconds == 30.0


def test_a_gang_seen_running_late_is_not_booked_twice():
    # The process started at 8 s: init until 11 s, then a 2 s restore, 5 s of compile and
    # 10 s of steps by the reading at 30 s. The operator saw the gang running only at 20 s
    # (busy): 12 s of the worker's seconds were booked as scheduling already.
    status = TPUJobStatus()
    account(status, 20).began_running(first_attempt=True)
    track = leader_at(
        30,
        steps_total=10,
        step=10,
        start_time=T0.timestamp() + 8,
        phases={"init": 3.0, "checkpoint_restore": 2.0, "compile": 5.0, "step": 10.0},
    )
    account(status, 30, track).publish(Phase.RUNNING, 1)
    goodput = status.goodput
    assert goodput is not None
    badput = goodput.badput_seconds
    assert (badput["scheduling"], goodput.productive_seconds) == (20.0, 10.0)
    assert badput["initialization"] == badput["checkpointRestore"] == badput["compilation"] == 0
    assert goodput.productive_seconds + sum(badput.values()) == goodput.wall_seconds == 30.0


def test_restart_downtime_starts_after_the_shutdown_already_booked():
    # Training ended at 55 s; the attempt closed at 70 s (15 s of shutdown), and the
    # failure that ended it was stamped 65 s: downtime runs from 70 s, not 65 s.
    status = TPUJobStatus(running_since="2026-01-01T00:00:10Z")
    track = leader_at(
        60,
        steps_total=50,
        step=50,
        start_time=T0.timestamp() + 10,
        end_time=T0.timestamp() + 55,
        phases={"step": 40.0, "init": 5.0},
    )
    status.restarts = 1
    status.last_failure = Failure(attempt=1, reason="Failed", time="2026-01-01T00:01:05Z")
    account(status, 70, track).close_attempt(1)
    account(status, 100.5).began_running(first_attempt=False)
    goodput = status.goodput
    assert goodput is not None
    assert goodput.finished_attempts["restartDowntime"] == 30.0
    assert goodput.finished_attempts["shutdown"] == 15.0


def test_timestamps_round_trip_at_second_precision_in_utc():
    """The one timestamp module the account, the progress report and conditions share."""
    from tpu_operator import timestamps
    from tpu_operator.api import conditions
    from tpu_operator.progress import report

    local = dt.datetime(2026, 1, 1, 3, 4, 5, 678000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert timestamps.stamp(local) == "2026-01-01T01:04:05Z"
    assert timestamps.parse("2026-01-01T01:04:05Z") == dt.datetime(
        2026, 1, 1, 1, 4, 5, tzinfo=dt.UTC
    )
    assert timestamps.parse("2026-01-01T03:04:05+02:00") == timestamps.parse("2026-01-01T01:04:05Z")
    assert timestamps.parse("") is None and timestamps.parse(None) is None
    assert timestamps.stamp_epoch(T0.timestamp() + 1.9) == "2026-01-01T00:00:01Z"
    assert (conditions.stamp, conditions.parse) == (timestamps.stamp, timestamps.parse)
    assert report.stamp_epoch is timestamps.stamp_epoch


def test_a_suspension_closes_the_attempt_and_is_booked_as_suspended():
    status = TPUJobStatus(running_since="2026-01-01T00:00:10Z")
    status.goodput = None
    track = track_with(20.0, {"step": 60.0, "init": 5.0}, at_s=90.0)
    account(status, 100, track).suspend(4)
    assert status.running_since is None
    assert status.progress is not None and status.progress.step == 20
    carried = status.goodput.finished_attempts if status.goodput else {}
    assert carried["step"] == 60.0 and carried["suspendedAt"] == at(100).timestamp()
    assert account(status, 130).waiting() == (at(100).timestamp(), "suspended")
    account(status, 130).suspend(4)  # every reconcile of the suspended job: no change
    assert status.goodput is not None
    assert status.goodput.finished_attempts["suspendedAt"] == at(100).timestamp()
    account(status, 150).resume()
    assert status.goodput.badput_seconds["suspended"] == 50.0
    assert account(status, 160).waiting() == (at(150).timestamp(), "scheduling")
    account(status, 170).began_running(first_attempt=False)
    assert status.running_since == "2026-01-01T00:02:50Z"
    badput = status.goodput.badput_seconds
    assert (badput["suspended"], badput["scheduling"], badput["restartDowntime"]) == (
        50.0,
        20.0,
        0.0,
    )
    assert status.goodput.productive_seconds == 60.0


def test_a_restart_downtime_cut_by_a_suspension_is_booked_up_to_it_and_not_across():
    status = TPUJobStatus(restarts=1)
    status.last_failure = Failure(attempt=1, reason="Failed", time="2026-01-01T00:01:00Z")
    account(status, 80).suspend(4)  # 20 s after the failure, before attempt 2 ran
    account(status, 200).resume()
    account(status, 210).began_running(first_attempt=False)
    assert status.goodput is not None
    badput = status.goodput.badput_seconds
    assert (badput["restartDowntime"], badput["suspended"], badput["scheduling"]) == (
        20.0,
        120.0,
        10.0,
    )


def test_a_job_created_suspended_books_its_suspension_not_scheduling():
    status = TPUJobStatus()
    account(status, 0).suspend(4)
    account(status, 300).resume()
    account(status, 305).began_running(first_attempt=True)
    assert status.goodput is not None
    badput = status.goodput.badput_seconds
    assert (badput["suspended"], badput["scheduling"]) == (300.0, 5.0)
