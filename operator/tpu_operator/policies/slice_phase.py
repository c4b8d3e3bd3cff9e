"""The phase of a TPUSlice and its message, from its gang and what holds it back.

One ladder for both kinds of slice, a job's child and a standalone TPUSlice, which
differ in two rungs: a standalone slice that finished stays as it ended (its job's
rule), and pods a standalone slice deletes because it is suspended are not its outcome
(it is Suspended whatever they exit with), while a job's slice keeps a real end. In
order, the first that applies:

0. A standalone slice that succeeded or failed for good keeps its phase and message (a
   finished job stays finished: ``standalone.finished``).
1. The apiserver refused the attempt's pods: ``Failed`` for an invalid template (the
   slice cannot run with it), else ``Pending`` while the slice retries.
2. The attempt ended: ``Succeeded`` or ``Failed``, with the failure that ended it
   recorded (not while the slice is blocked, and not a stopping slice's own deletions).
   A standalone slice's failed attempt then goes through its failure policy
   (``standalone.attempt_failed``), which the reconciler asks.
3. Stopping: ``Suspended`` (``spec.suspend``), or ``Pending`` until the job starts it.
4. Waiting for a pool or a dynamic slice: ``Pending``, saying what for.
5. Otherwise the attempt goes on, and its phase is the job's (``phase.of_attempt``, the
   one rule for jobs and slices): ``Restarting`` while the previous attempt's pods drain
   or the restart backoff runs; ``Pending`` while every pod is still to create;
   ``Starting`` until every worker of the attempt runs (saying a pod the scheduler cannot
   place, or pods no scheduler looked at), ``Running`` from then on: a worker not ready
   for a while does not send a running slice back to ``Starting``.

Pure: the reconciler (``reconcile/slices.py``) gathers ``SliceFacts`` and writes what
``decide`` returns into the slice's status, with the message ``said`` and the three
conditions ``conditions`` derives from the phase.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from tpu_operator.api.common import Failure
from tpu_operator.api.conditions import set_condition, stamp
from tpu_operator.api.status import TERMINAL_PHASES, ConditionType, Phase, Reason
from tpu_operator.policies.phase import of_attempt
from tpu_operator.state.gang import GangState, WorkerFailure, scheduler_wait


@dataclass(frozen=True)
class PodRefusal:
    """Why a slice's last try to create the pods of an attempt did not create them (the
    pods are created after the slice's status is written, so its next status says it)."""

    uid: str
    """The slice's UID (a slice of the same name created later is another slice)."""
    attempt: int
    reason: Reason
    """``InvalidPodTemplate`` (the slice fails), else ``PodsForbidden`` or
    ``PodCreationFailed`` (retried until the cause is gone)."""
    message: str

    @property
    def invalid(self) -> bool:
        return self.reason == Reason.INVALID_POD_TEMPLATE


@dataclass(frozen=True)
class SliceFacts:
    """What the phase of a slice is decided from."""

    gang: GangState
    """The attempt's pods, assessed (``state/gang.assess``)."""
    attempt: int
    """The attempt the slice runs (0: a job's slice its job has not started)."""
    now: dt.datetime
    standalone: bool
    """No TPUJob owns the slice."""
    suspend: bool
    """``spec.suspend``."""
    stopping: bool
    """The slice deletes its pods and creates none (suspended, or not started)."""
    blocked: bool
    """Pods of an older attempt drain, or the restart backoff runs."""
    draining: bool
    """Pods of an older attempt are left in the gang (a cause of ``blocked``)."""
    waiting_for: str = ""
    """What the pods wait for before they can be created (a pool, a dynamic slice)."""
    refusal: PodRefusal | None = None
    """The apiserver's refusal of this attempt's pods, at the last try."""
    previous_phase: Phase = Phase.PENDING
    previous_attempt: int = 0
    previous_message: str = ""
    """The phase, attempt and message of the status as read."""
    scheduler_looked_at: dt.datetime | None = None
    """When the scheduler of the gang's pods that none has looked at last looked at any pod
    of the operator's (``state/gang.scheduler_wait``)."""
    finished: bool = False
    """A standalone slice that succeeded or failed for good: it keeps its phase and
    message, as a finished job does (``standalone.finished``)."""


@dataclass(frozen=True)
class SlicePhase:
    """The phase decided, and what goes with it."""

    phase: Phase
    message: str
    failure: Failure | None = None
    """The failure to record in the status (None: the recorded one stays)."""
    ended: WorkerFailure | None = None
    """A standalone slice's attempt failed on this worker: its failure policy says whether
    it restarts (``standalone.attempt_failed``)."""
    recheck: float | None = None
    """Seconds until the phase may say more (pods no scheduler has looked at yet)."""


def decide(facts: SliceFacts) -> SlicePhase:
    """The slice's phase and message (the ladder of the module's docstring)."""
    state, refusal = facts.gang, facts.refusal
    if facts.finished:
        return SlicePhase(facts.previous_phase, facts.previous_message)
    if refusal is not None and refusal.invalid:
        return SlicePhase(
            Phase.FAILED,
            refusal.message,
            failure=Failure(
                attempt=facts.attempt,
                reason=Reason.INVALID_POD_TEMPLATE,
                message=refusal.message,
                counted=False,
                time=stamp(facts.now),
            ),
        )
    if refusal is not None:
        return SlicePhase(Phase.PENDING, refusal.message)
    if state.outcome in ("Succeeded", "Failed") and not facts.blocked and not _own_stop(facts):
        return _ended(facts)
    if facts.stopping:
        if facts.suspend:
            return SlicePhase(Phase.SUSPENDED, "suspended")
        return SlicePhase(Phase.PENDING, "waiting for the job to start")
    if facts.waiting_for:
        return SlicePhase(Phase.PENDING, facts.waiting_for)
    return _goes_on(facts)


def _goes_on(facts: SliceFacts) -> SlicePhase:
    """An attempt that goes on: its phase is the job's (``phase.of_attempt``, one rule for
    both), the message the slice's own."""
    state = facts.gang
    # Every worker of this attempt has run: a worker that is not ready for a while does
    # not send the slice back to Starting.
    has_run = facts.previous_phase == Phase.RUNNING and facts.previous_attempt == facts.attempt
    draining = facts.blocked and facts.draining
    backing_off = facts.blocked and not facts.draining
    phase = of_attempt(has_run, state.outcome, state, draining, backing_off)
    if phase == Phase.RESTARTING:
        if draining:
            return SlicePhase(phase, "waiting for the previous attempt's pods to stop")
        return SlicePhase(phase, "waiting for the restart backoff")
    if phase == Phase.PENDING:
        return SlicePhase(phase, "creating pods")
    if phase == Phase.STARTING:
        return _starting(facts)
    if state.outcome == "Starting":
        return SlicePhase(phase, f"{state.total} workers running, {state.ready} ready")
    return SlicePhase(phase, f"{state.total} workers running")


def _own_stop(facts: SliceFacts) -> bool:
    """Whether the attempt's end is only the slice's own stopping: pods a standalone slice
    deletes because it is suspended are not its outcome, nor pods a stopping slice deleted
    (a job's slice keeps a real end, such as a worker's exit)."""
    if not facts.stopping:
        return False
    failure = facts.gang.failure
    return facts.standalone or (failure is not None and failure.reason == Reason.POD_DELETED)


def _ended(facts: SliceFacts) -> SlicePhase:
    """The attempt succeeded or failed."""
    state = facts.gang
    message = f"all {state.total} workers exited 0" if state.outcome == "Succeeded" else ""
    cause = state.failure
    if cause is None:
        return SlicePhase(Phase(state.outcome), message)
    failure = Failure(
        attempt=facts.attempt,
        reason=cause.reason,
        message=cause.message,
        pod=cause.pod,
        node=cause.node,
        exit_code=cause.exit_code,
        time=stamp(facts.now),
    )
    ended = cause if facts.standalone and state.outcome == "Failed" else None
    return SlicePhase(Phase(state.outcome), cause.message, failure=failure, ended=ended)


def _starting(facts: SliceFacts) -> SlicePhase:
    """Not every worker of the attempt runs yet."""
    state = facts.gang
    no_scheduler, recheck = scheduler_wait(state.unseen, facts.now, facts.scheduler_looked_at)
    if state.unschedulable:
        pod, why = state.unschedulable
        message = f"pod {pod} cannot be scheduled: {why}"
    elif no_scheduler:
        message = no_scheduler
    else:
        message = f"{state.ready}/{state.total} workers ready"
    return SlicePhase(Phase.STARTING, message, recheck=recheck)


def said(phase: Phase, message: str, conflict: str, provisioning: str) -> str:
    """The status message: ``message`` with a Service conflict the slice has (not once it
    ended), and the state of its ProvisioningRequest while its pods wait for it."""
    if conflict and phase not in TERMINAL_PHASES:
        message = f"{message}; {conflict}" if message else conflict
    if provisioning and phase in (Phase.PENDING, Phase.STARTING):
        message += f"; {provisioning}"
    return message


def conditions(
    previous: list[dict[str, Any]],
    *,
    phase: Phase,
    message: str,
    refused: Reason | None,
    suspend: bool,
    active_pods: int,
    terminating_pods: int,
    now: dt.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The slice's conditions after ``previous`` (wire form): ``Ready`` while Running (its
    reason the refusal that keeps pods from being created, if any, else the phase),
    ``Suspended`` as the spec says, and, once suspended or ended, ``PodsStopped`` until no
    pod is left (a pod not yet marked for deletion or terminating keeps it False)."""
    result = set_condition(
        previous,
        ConditionType.READY,
        phase == Phase.RUNNING,
        refused or phase,
        message,
        at=now,
        generation=generation,
    )
    result = set_condition(
        result,
        ConditionType.SUSPENDED,
        suspend,
        Reason.SUSPENDED if suspend else Reason.ACTIVE,
        "",
        at=now,
        generation=generation,
    )
    if not suspend and phase not in TERMINAL_PHASES:
        return result
    left = active_pods + terminating_pods
    return set_condition(
        result,
        ConditionType.PODS_STOPPED,
        not left,
        Reason.PODS_STOPPING if left else Reason.ALL_PODS_STOPPED,
        f"{active_pods} pods not yet marked for deletion, {terminating_pods} terminating"
        if left
        else "no pod of the slice is left",
        at=now,
        generation=generation,
    )
