"""A standalone TPUSlice (one no TPUJob owns): its own job of one slice, under the job's
rules.

Its attempt is the one it recorded; created, or resumed after a suspension, it runs the
next one, a new attempt and not a restart, by the job's own rule (``start.resumes``;
created suspended, it runs none until it is resumed, as a job does). A failed attempt
goes through the job's failure policy (``failure.book``): restarted as the next attempt
after the backoff, counted against ``maxRestarts`` or not, or failed for good. A
finished slice stops its pods and stays finished (``finished``, the job's
``lifetime.finished``). Unlike a job's, its restarts always recreate the pods (its
workers run no supervisor). Its status is the slice's own (``TPUSliceStatus``:
``notBefore`` where a job has ``restartAt``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceStatus
from tpu_operator.api.status import TERMINAL_PHASES, Phase, Reason
from tpu_operator.policies.failure import book
from tpu_operator.policies.start import resumes
from tpu_operator.state.gang import WorkerFailure


def attempt(status: TPUSliceStatus, suspend: bool) -> int:
    """The attempt the slice runs (``suspend``: its spec says it is suspended): the job's
    rule (``start.resumes``). Created, or resumed, the next one; created suspended, none
    (0) until it is resumed."""
    if not suspend and resumes(status.attempt, status.phase):
        return status.attempt + 1
    return status.attempt


def finished(phase: str) -> bool:
    """The slice's last attempt succeeded, or failed for good: it stays so, its running
    pods are stopped, and its spec's ``suspend`` changes nothing, as for a finished job
    (``lifetime.finished``). A worker still running when another failed the slice for good
    would otherwise hold its TPU VM for ever."""
    return phase in TERMINAL_PHASES


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
