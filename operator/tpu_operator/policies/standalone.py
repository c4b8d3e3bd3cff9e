"""A standalone TPUSlice (one no TPUJob owns): its own job of one slice, under the job's
rules.

Its attempt is the one it recorded (the first, at least); resumed after a suspension, it
runs the next one, a new attempt and not a restart, as a resumed job does
(``start.start``). A failed attempt goes through the job's failure policy
(``failure.book``): restarted as the next attempt after the backoff, counted against
``maxRestarts`` or not, or failed for good. Unlike a job's, its restarts always recreate
the pods (its workers run no supervisor). Its status is the slice's own
(``TPUSliceStatus``: ``notBefore`` where a job has ``restartAt``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceStatus
from tpu_operator.api.status import Phase, Reason
from tpu_operator.policies.failure import book
from tpu_operator.state.gang import WorkerFailure


def attempt(status: TPUSliceStatus, suspend: bool) -> int:
    """The attempt the slice runs (``suspend``: its spec says it is suspended)."""
    if status.phase == Phase.SUSPENDED and not suspend:
        return status.attempt + 1  # resumed: a new attempt
    return max(status.attempt, 1)


@dataclass(frozen=True)
class Ending:
    """What follows a failed attempt of a standalone slice."""

    phase: Phase
    """Restarting, or Failed for good."""
    message: str
    restart: Reason | None = None
    """Why it restarts (the restart metric's reason); None: it failed for good."""
    delay: float = 0.0
    """The backoff before the next attempt creates pods (s)."""


def attempt_failed(
    status: TPUSliceStatus,
    failure: WorkerFailure,
    policy: FailurePolicy,
    now: dt.datetime,
    attempt: int,
) -> Ending:
    """``attempt`` failed with ``failure`` (recorded in ``status.failure``): restart as
    the failure policy says, or fail. ``status`` is updated in place: the restart
    counters, whether the failure counted, the next attempt and when it may start."""
    booked = book(failure, policy, status, now)
    decision = booked.decision
    if status.failure is not None:
        status.failure.counted = decision.counted
    if not decision.restart:
        return Ending(Phase.FAILED, decision.message)
    status.not_before = booked.not_before
    status.attempt = attempt + 1
    status.completion_time = None
    return Ending(
        Phase.RESTARTING,
        f"restarting (attempt {attempt + 1}): {decision.message}",
        decision.reason,
        booked.delay,
    )
