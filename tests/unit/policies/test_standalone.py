"""A standalone TPUSlice under the job's rules (``policies/standalone.py``)."""

from __future__ import annotations

import datetime as dt

import pytest

from tpu_operator.api.common import Failure
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceStatus
from tpu_operator.api.status import Phase, Reason
from tpu_operator.policies import standalone
from tpu_operator.state.gang import WorkerFailure

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("recorded", "suspend", "expected"),
    [
        ({}, False, 1),  # not started: the first attempt
        ({}, True, 0),  # created suspended: none until it is resumed, as a job
        ({"attempt": 0, "phase": "Suspended"}, False, 1),  # then resumed: the first
        ({"attempt": 2, "phase": "Failed"}, False, 2),  # failed for good: stays
        ({"attempt": 2, "phase": "Succeeded"}, False, 2),
        ({"attempt": 3, "phase": "Running"}, False, 3),
        ({"attempt": 3, "phase": "Suspended"}, True, 3),  # still suspended
        ({"attempt": 3, "phase": "Suspended"}, False, 4),  # resumed: a new attempt
        ({"attempt": 3, "phase": "Restarting"}, True, 3),  # suspended from now on
    ],
)
def test_the_attempt_a_standalone_slice_runs(recorded, suspend, expected):
    status = TPUSliceStatus.model_validate(recorded)
    assert standalone.attempt(status, suspend) == expected


def failed(reason: Reason, exit_code: int | None = 1) -> WorkerFailure:
    return WorkerFailure(reason, f"{reason} on s-0", "s-0", "n0", exit_code, None)


@pytest.mark.parametrize(
    ("cause", "policy", "used", "phase", "counted", "attempt", "delay"),
    [
        (failed(Reason.WORKER_FAILED), {}, 0, Phase.RESTARTING, 1, 3, 10.0),
        (failed(Reason.WORKER_FAILED), {"backoffSeconds": 0}, 0, Phase.RESTARTING, 1, 3, 0.0),
        (failed(Reason.WORKER_FAILED), {"maxRestarts": 2}, 2, Phase.FAILED, 2, 2, 0.0),
        # Disruptions are not counted against maxRestarts by default.
        (failed(Reason.EVICTED, None), {"maxRestarts": 0}, 0, Phase.RESTARTING, 0, 3, 10.0),
        (
            failed(Reason.WORKER_FAILED, 3),
            {"rules": [{"action": "FailJob", "values": [3]}]},
            0,
            Phase.FAILED,
            0,
            2,
            0.0,
        ),
    ],
)
def test_a_failed_attempt_restarts_or_fails_under_the_jobs_failure_policy(
    cause, policy, used, phase, counted, attempt, delay
):
    status = TPUSliceStatus.model_validate(
        {"attempt": 2, "countedRestarts": used, "completionTime": "2026-01-01T00:00:00Z"}
    )
    status.failure = Failure(attempt=2, reason=cause.reason, message=cause.message)
    ending = standalone.attempt_failed(status, cause, FailurePolicy.model_validate(policy), NOW, 2)
    assert ending.phase == phase
    assert (status.counted_restarts, status.attempt) == (counted, attempt)
    assert status.failure.counted is (cause.reason == Reason.WORKER_FAILED)
    assert ending.delay == pytest.approx(delay)
    if phase == Phase.RESTARTING:
        assert ending.restart == cause.reason
        assert status.restarts_by_reason == {cause.reason: 1}
        assert status.completion_time is None
        expected = NOW + dt.timedelta(seconds=delay) if delay else None
        assert status.not_before == (expected.strftime("%Y-%m-%dT%H:%M:%SZ") if expected else None)
        assert ending.message.startswith(f"restarting (attempt {attempt}): ")
    else:
        assert ending.restart is None
        assert status.restarts == 0 and status.not_before is None


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (Phase.SUCCEEDED, True),
        (Phase.FAILED, True),
        (Phase.RESTARTING, False),  # a failed attempt that restarts goes on
        (Phase.SUSPENDED, False),
        (Phase.RUNNING, False),
        (Phase.PENDING, False),
    ],
)
def test_a_standalone_slice_is_finished_once_it_succeeded_or_failed_for_good(phase, expected):
    assert standalone.finished(phase) is expected
