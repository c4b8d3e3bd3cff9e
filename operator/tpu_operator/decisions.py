"""Failure-policy decisions (pure): restart (counted or not) or fail, the restart
backoff, the restart bookkeeping that TPUJobs and standalone TPUSlices share, and how a
TPUJob's gang restarts (in place or by recreating its pods)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class RestartChoice:
    """How a gang restart brings up the next attempt, and why."""

    kind: RestartKind
    why: str
    recreate: Mapping[int, str] = field(default_factory=dict)
    """``Mixed``: the slices whose pods are recreated (by index), and why each."""


_IN_PLACE_CAUSES = (Reason.WORKER_FAILED, Reason.STALLED)
"""Failures that leave every pod alive: only a training process stopped or hung."""


def _unfit_pod(pod: PodView, not_ready_nodes: frozenset[str]) -> str:
    """Why the supervisor of ``pod`` cannot restart its training process, if it cannot."""
    if not pod.supervised:
        return "does not run the supervisor"
    if pod.deleting:
        return "is being deleted"
    if pod.disruption is not None:
        return f"is disrupted ({pod.disruption})"
    if pod.phase != "Running" or pod.worker_exit is not None:
        return "has no running worker container"
    if pod.node is not None and pod.node in not_ready_nodes:
        return f"is on node {pod.node}, which is not ready"
    return ""


def unfit_slices(
    pods: Sequence[PodView], num_slices: int, hosts: int, not_ready_nodes: frozenset[str]
) -> dict[int, str]:
    """The slices (by index) whose pods cannot all restart in place, and why each: a pod
    missing, or one whose supervisor cannot restart its process (``_unfit_pod``)."""
    by_slice: dict[int, list[PodView]] = {}
    for pod in pods:
        by_slice.setdefault(pod.slice_index, []).append(pod)
    unfit: dict[int, str] = {}
    for index in range(num_slices):
        members = sorted(by_slice.get(index, ()), key=lambda p: p.name)
        if len(members) != hosts:
            unfit[index] = f"{len(members)} of its {hosts} pods exist"
            continue
        for pod in members:
            why = _unfit_pod(pod, not_ready_nodes)
            if why:
                unfit[index] = f"pod {pod.name} {why}"
                break
    return unfit


def restart_kind(
    *,
    supervised: bool,
    mode: str,
    failure: WorkerFailure,
    pods: Sequence[PodView],
    num_slices: int,
    hosts: int,
    not_ready_nodes: frozenset[str] = frozenset(),
    refused: str | None = None,
    worn: Mapping[int, str] | None = None,
) -> RestartChoice:
    """How to restart after ``failure`` ended the attempt whose pods are ``pods``.

    In place, slice by slice: a slice restarts in place when every one of its pods
    exists, runs the supervisor, is Running (its container alive) on a ready node, and is
    neither being deleted nor disrupted; the others are recreated. Every slice in place:
    ``InPlace``; some: ``Mixed`` (a failure confined to some slices costs only their
    pods); none: ``Recreate``. Unsupervised pods, and every failure of an in-place
    restart itself, recreate every pod. ``refused``: why the operator does not supervise
    pods that could be (builders/supervision.py, ``supervision_refused``). ``worn``: slices
    to recreate whatever their pods show (failures repeating on their node pool), and why.
    """
    if not supervised:
        if refused:
            return RestartChoice(RestartKind.RECREATE, refused)
        if mode == "Recreate":
            return RestartChoice(RestartKind.RECREATE, "failurePolicy.restartMode is Recreate")
        return RestartChoice(RestartKind.RECREATE, "the worker container does not run tpu-worker")
    if failure.reason in IN_PLACE_FAILURES:
        return RestartChoice(
            RestartKind.RECREATE, f"the in-place restart failed ({failure.reason})"
        )
    unfit = unfit_slices(pods, num_slices, hosts, not_ready_nodes)
    for index, why in (worn or {}).items():
        unfit.setdefault(index, why)
    if failure.reason not in _IN_PLACE_CAUSES:
        # A pod or node is gone: its slice is recreated, whatever its pods show yet (a
        # pod gone altogether shows as one missing).
        lost = next((p.slice_index for p in pods if p.name == failure.pod), None)
        if lost is not None:
            unfit.setdefault(lost, f"pod {failure.pod}: {failure.reason}")
        elif not unfit:
            return RestartChoice(
                RestartKind.RECREATE, f"a pod or its node is gone ({failure.reason})"
            )
    if not unfit:
        return RestartChoice(
            RestartKind.IN_PLACE, "only training processes stopped; every pod is alive"
        )
    if len(unfit) == num_slices:
        if failure.reason not in _IN_PLACE_CAUSES:
            return RestartChoice(
                RestartKind.RECREATE, f"a pod or its node is gone ({failure.reason})"
            )
        return RestartChoice(RestartKind.RECREATE, unfit[min(unfit)])
    recreate = dict(sorted(unfit.items()))
    kept = [i for i in range(num_slices) if i not in recreate]
    return RestartChoice(
        RestartKind.MIXED,
        f"{_slices(list(recreate))} recreated ("
        + "; ".join(f"slice {i}: {why}" for i, why in list(recreate.items())[:_SHOWN])
        + ("; ..." if len(recreate) > _SHOWN else "")
        + f"), {_slices(kept)} in place",
        recreate,
    )


_SHOWN = 8
"""Slices a restart's message names (the rest are counted)."""


def _slices(indexes: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indexes[:_SHOWN])
    more = f" and {len(indexes) - _SHOWN} more" if len(indexes) > _SHOWN else ""
    return f"slice{'s' if len(indexes) > 1 else ''} {shown}{more}"
