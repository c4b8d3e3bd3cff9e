"""Failure-policy decisions (pure): restart (counted or not) or fail, the restart
backoff, the restart bookkeeping that TPUJobs and standalone TPUSlices share, and how a
TPUJob's gang restarts (in place or by recreating its pods)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tpu_operator import contract
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.status import Reason, RestartKind
from tpu_operator.state.gang import WorkerFailure
from tpu_operator.state.views import PodView

IN_PLACE_FAILURES = frozenset({Reason.SUPERVISOR_UNREACHABLE, Reason.IN_PLACE_TIMEOUT})
"""Failures of an in-place restart itself: the next attempt recreates the pods."""


@dataclass(frozen=True)
class Decision:
    restart: bool
    counted: bool
    reason: Reason
    """Restart reason (the failure's) or, when not restarting, why the job fails."""
    message: str


def _rule_action(policy: FailurePolicy, exit_code: int) -> str | None:
    for rule in policy.rules:
        listed = exit_code in rule.values
        if listed == (rule.operator == "In"):
            return rule.action
    return None


def decide(
    failure: WorkerFailure,
    policy: FailurePolicy,
    counted_restarts: int,
    *,
    count_stalls: bool = True,
) -> Decision:
    """What to do after ``failure`` ended an attempt."""
    counted = True
    if failure.disruption:
        counted = policy.count_disruptions
    elif failure.reason in IN_PLACE_FAILURES:
        counted = False  # the restart that failed was counted; its fallback is not
    elif failure.reason == Reason.STALLED:
        counted = count_stalls
    elif failure.exit_code is not None:
        action = _rule_action(policy, failure.exit_code)
        if action == "FailJob":
            return Decision(
                False,
                True,
                Reason.FATAL_EXIT_CODE,
                f"{failure.message}; exit code {failure.exit_code} is fatal under "
                "failurePolicy.rules",
            )
        if action == "RestartNotCounted":
            counted = False
        if action is None and failure.exit_code == contract.EXIT_CONFIG_ERROR:
            return Decision(
                False,
                True,
                Reason.WORKER_CONFIG_ERROR,
                f"{failure.message}; exit code {failure.exit_code} means the worker's "
                "settings or pod env are invalid, which a restart cannot fix (see its log)",
            )
    if counted and counted_restarts >= policy.max_restarts:
        return Decision(
            False,
            True,
            Reason.MAX_RESTARTS_EXCEEDED,
            f"{failure.message}; failurePolicy.maxRestarts ({policy.max_restarts}) reached",
        )
    note = "" if counted else " (not counted against maxRestarts)"
    if failure.exit_code == contract.EXIT_RETRYABLE:
        note += " (the worker asked to be retried)"
    return Decision(True, counted, failure.reason, failure.message + note)


def backoff_seconds(policy: FailurePolicy, restart_number: int) -> float:
    """Delay before restart number ``restart_number`` (1 for the first restart)."""
    if restart_number < 1 or policy.backoff_seconds == 0:
        return 0.0
    delay = policy.backoff_seconds * 2 ** min(restart_number - 1, 30)
    return float(min(delay, policy.max_backoff_seconds))


class RestartCounters(Protocol):
    """The restart counters of a TPUJob's or a standalone TPUSlice's status."""

    restarts: int
    counted_restarts: int
    restarts_by_reason: dict[str, int]


def book_restart(counters: RestartCounters, decision: Decision, policy: FailurePolicy) -> float:
    """Count a restart ``decision`` in ``counters``; the backoff (s) before its attempt."""
    counters.restarts += 1
    counters.counted_restarts += int(decision.counted)
    reason = str(decision.reason)
    counters.restarts_by_reason[reason] = counters.restarts_by_reason.get(reason, 0) + 1
    return backoff_seconds(policy, counters.restarts)


def restart_kind(
    *,
    supervised: bool,
    mode: str,
    failure: WorkerFailure,
    pods: Sequence[PodView],
    workers: int,
    not_ready_nodes: frozenset[str] = frozenset(),
    refused: str | None = None,
) -> tuple[RestartKind, str]:
    """How to restart after ``failure`` ended the attempt whose pods are ``pods``, and why.

    In place only when nothing but training processes failed: every pod of the attempt
    exists, runs the supervisor, is Running (its container alive) on a ready node, and is
    neither being deleted nor disrupted. Anything else, and every failure of an in-place
    restart itself, recreates the pods. ``refused``: why the operator does not supervise
    pods that could be (builders/supervision.py, ``supervision_refused``).
    """
    if not supervised:
        if refused:
            return RestartKind.RECREATE, refused
        if mode == "Recreate":
            return RestartKind.RECREATE, "failurePolicy.restartMode is Recreate"
        return RestartKind.RECREATE, "the worker container does not run tpu-worker"
    if failure.reason in IN_PLACE_FAILURES:
        return RestartKind.RECREATE, f"the in-place restart failed ({failure.reason})"
    if failure.reason not in (Reason.WORKER_FAILED, Reason.STALLED):
        return RestartKind.RECREATE, f"a pod or its node is gone ({failure.reason})"
    if len(pods) != workers:
        return RestartKind.RECREATE, f"{len(pods)} of {workers} pods of the attempt exist"
    for pod in sorted(pods, key=lambda p: p.name):
        why = ""
        if not pod.supervised:
            why = "does not run the supervisor"
        elif pod.deleting:
            why = "is being deleted"
        elif pod.disruption is not None:
            why = f"is disrupted ({pod.disruption})"
        elif pod.phase != "Running" or pod.worker_exit is not None:
            why = "has no running worker container"
        elif pod.node is not None and pod.node in not_ready_nodes:
            why = f"is on node {pod.node}, which is not ready"
        if why:
            return RestartKind.RECREATE, f"pod {pod.name} {why}"
    return RestartKind.IN_PLACE, "only training processes stopped; every pod is alive"
