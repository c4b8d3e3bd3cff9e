"""Whether the running attempt failed, succeeded or goes on: one decider over every source.

In order (the first that speaks decides):

1. a slice whose pods the apiserver rejected as invalid: the job fails
   (``InvalidPodTemplate``; no restart can help);
2. ``activeDeadlineSeconds`` passed: the job fails (``DeadlineExceeded``);
3. the gang's own outcome (``state/gang.assess``: a worker failed, was evicted or lost its
   node; every worker done);
4. a stall, when ``stallAction: Restart`` (``stalls``), of an attempt that runs;
5. an in-place restart that cannot finish (``in_place``);
6. a failure's echo: a worker that ended because a peer died is given a moment for the
   peer's own report (``CAUSE_SETTLE_SECONDS``), so the cause recorded is the first;
7. while the previous attempt's pods drain, nothing about this attempt (none of its pods
   exist yet) is a failure of it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from tpu_operator.api.conditions import parse
from tpu_operator.api.status import Reason
from tpu_operator.policies import in_place, lifetime, stalls
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.state.gang import FOLLOW_ON_EXIT_CODES, GangState, Outcome, WorkerFailure

CAUSE_SETTLE_SECONDS = 3.0
"""How long an echo failure (exit 75/134: a peer died) waits for the peer's own report."""

Kind = Literal["job-failed", "attempt-failed", "succeeded", "goes-on"]


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    outcome: Outcome
    """The gang's outcome as the verdict reads it (for an attempt that goes on)."""
    draining: bool = False
    """Pods of the previous attempt are still to go."""
    backing_off: bool = False
    """The restart backoff has not ended."""
    failure: WorkerFailure | None = None
    """What ended the attempt (``attempt-failed``)."""
    reason: Reason | None = None
    """Why the job fails with no restart (``job-failed``)."""
    message: str = ""


def rejected_template(facts: JobFacts, attempt: int) -> str:
    """The apiserver's reason if a slice could not create this attempt's pods."""
    for body in facts.slices.values():
        failure = (body.get("status") or {}).get("failure") or {}
        if (
            failure.get("reason") == Reason.INVALID_POD_TEMPLATE
            and failure.get("attempt") == attempt
        ):
            return str(failure.get("message", ""))
    return ""


def settling(facts: JobFacts, plan: Plan, failure: WorkerFailure) -> bool:
    """A worker that ended because a peer died (exit 75 or 134) was noticed first: give
    the peer's own failure a moment to be reported (a supervised pod's exit shows through
    a readiness probe, up to a period later), so the recorded cause is the first failure,
    not its echo."""
    if failure.exit_code not in FOLLOW_ON_EXIT_CODES or facts.total_workers < 2:
        return False
    if not any(p.name == failure.pod and p.process_stopped for p in facts.pods):
        return False  # a container's exit: the kubelet reports every one at once
    at = parse(failure.time)
    if at is None:
        return False
    wait = (at + dt.timedelta(seconds=CAUSE_SETTLE_SECONDS) - plan.now).total_seconds()
    if wait <= 0:
        return False
    plan.after(wait)
    return True


def decide(facts: JobFacts, plan: Plan, world: World, attempt: int, state: GangState) -> Verdict:
    """The verdict on the running ``attempt`` (whose gang is ``state``)."""
    status = plan.status
    draining = bool(state.stale)
    restart_at = parse(status.restart_at)
    backing_off = restart_at is not None and plan.now < restart_at
    if backing_off and restart_at is not None:
        plan.after((restart_at - plan.now).total_seconds())
    rejected = rejected_template(facts, attempt)
    if rejected:
        return Verdict("job-failed", "Failed", reason=Reason.INVALID_POD_TEMPLATE, message=rejected)
    if lifetime.deadline_passed(facts, plan):
        message = (
            f"the job was active longer than activeDeadlineSeconds "
            f"({facts.spec.active_deadline_seconds})"
        )
        return Verdict("job-failed", "Failed", reason=Reason.DEADLINE_EXCEEDED, message=message)
    outcome: Outcome = state.outcome
    failure = state.failure
    if not draining and outcome in ("Starting", "Running"):
        stall = stalls.stall(facts, plan)
        if stall is not None and facts.monitoring.stall_action == "Restart":
            outcome, failure = "Failed", stall
    if outcome != "Failed":
        stuck = in_place.failure(facts, plan, world, attempt, outcome)
        if stuck is not None:
            outcome, failure, draining = "Failed", stuck, False
    elif failure is not None and not draining and settling(facts, plan, failure):
        outcome = "Running" if status.running_since else "Starting"
    if outcome == "Failed" and failure is not None and not draining:
        return Verdict("attempt-failed", outcome, failure=failure)
    if outcome == "Succeeded":
        return Verdict("succeeded", outcome)
    return Verdict("goes-on", outcome, draining=draining, backing_off=backing_off)
