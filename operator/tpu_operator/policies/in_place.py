"""In-place restarts (and mixed ones, which also recreate the pods of some slices): one
that cannot stop every process of the previous attempt, or that has not every worker
running within ``failurePolicy.inPlaceTimeoutSeconds``, ends in a failure of the attempt
(the next one recreates the pods: ``decisions.restart_kind``)."""

from __future__ import annotations

import datetime as dt

from tpu_operator.api.conditions import parse
from tpu_operator.api.job import TPUJobStatus
from tpu_operator.api.status import Phase, Reason, RestartKind
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.state.gang import Outcome, WorkerFailure

IN_PLACE_KINDS = frozenset({RestartKind.IN_PLACE, RestartKind.MIXED})
"""Restarts whose supervisors restart training processes in pods the job has (a mixed
one recreates the pods of some slices as well)."""


def restarting_in_place(status: TPUJobStatus) -> bool:
    """The committed attempt comes up in place and is not running yet."""
    return (
        status.restart_kind in IN_PLACE_KINDS
        and status.in_place_since is not None
        and status.running_since is None
        and status.phase in (Phase.RESTARTING, Phase.STARTING, Phase.PENDING)
    )


def failure(
    facts: JobFacts, plan: Plan, world: World, attempt: int, outcome: Outcome
) -> WorkerFailure | None:
    """An in-place restart into ``attempt`` that cannot stop every process of the previous
    one, or that is not running within inPlaceTimeoutSeconds."""
    status = plan.status
    if status.restart_kind not in IN_PLACE_KINDS or status.running_since:
        return None
    fallback = world.in_place_fallback(attempt)
    if fallback is not None:
        return WorkerFailure(Reason.SUPERVISOR_UNREACHABLE, fallback, "", None, None, None)
    since = parse(status.in_place_since)
    if since is None or (outcome == "Running" and world.in_place_started(attempt)):
        return None
    timeout = facts.policy.in_place_timeout_seconds
    bound = dt.timedelta(seconds=timeout)
    if plan.now < since + bound:
        plan.after((since + bound - plan.now).total_seconds())
        return None
    return WorkerFailure(
        Reason.IN_PLACE_TIMEOUT,
        f"the in-place restart into attempt {attempt} did not have every worker "
        f"running within failurePolicy.inPlaceTimeoutSeconds ({timeout})",
        "",
        None,
        None,
        None,
    )


def carried_from(
    *,
    attempt: int,
    moving_in_place: bool,
    recreated: bool,
    slice_attempt: int | None,
    slice_from: int | None,
) -> int | None:
    """``inPlaceFrom`` of a job's slice at ``attempt``: the first attempt whose pods the
    slice carries into ``attempt`` in place (None: none, its pods are the attempt's own).

    The slice's record is the durable word on which attempt its pods belong to (their
    labels keep the attempt they were created for): it is kept for as long as the slice
    keeps its pods, and written once when the slice moves to a new attempt.
    ``slice_attempt`` and ``slice_from``: what the slice says now (None: no slice yet).
    ``moving_in_place``: the job's committed attempt restarts in place (``restarting_in_place``);
    ``recreated``: a mixed restart recreates this slice's pods."""
    if slice_attempt is None:
        return None
    if slice_attempt >= attempt:
        return slice_from  # moved already: written for this attempt
    if not moving_in_place or recreated:
        return None
    return slice_from if slice_from is not None else slice_attempt
