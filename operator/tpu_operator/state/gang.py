"""Assess one attempt of a gang (a job's or a standalone slice's pods): pure.

Gang semantics: any worker failing, being deleted or evicted, or losing its node ends the
attempt for the whole gang. When several workers fail, a disruption anywhere in the gang
(eviction, preemption, node loss) is taken as the cause, since the other failures usually
follow from it (a peer vanished); otherwise the earliest failure is the cause. Pod finish
times have one-second resolution, so failures in the same second are ordered by what
their exit codes say: a worker that ended because a peer died (75 after a failed
collective, 134 when JAX's coordination service aborted it) follows from the other one.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tpu_operator import contract
from tpu_operator.api.status import DISRUPTION_REASONS, Reason
from tpu_operator.state.views import DEFAULT_SCHEDULER, LostNodes, PodView
from tpu_operator.timestamps import parse

Outcome = Literal["Creating", "Starting", "Running", "Succeeded", "Failed"]
SuccessPolicy = Literal["AllWorkers", "LeaderWorker"]

# DisruptionTarget reasons (and kubelet reasons) by the cause a user cares about.
NODE_LOSS = {"DeletionByTaintManager", "DeletionByPodGC", "NodeLost", "Shutdown", "Terminated"}


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """What ended an attempt, seen on one worker."""

    reason: Reason
    message: str
    pod: str
    node: str | None
    exit_code: int | None
    time: str | None

    @property
    def disruption(self) -> bool:
        return self.reason in DISRUPTION_REASONS


@dataclass(frozen=True, slots=True)
class ProcessReport:
    """What a supervisor said about the training process of a pod whose readiness turned
    False (``reconcile/supervisors.py``): its exit, or that it did not answer."""

    attempt: int
    """The attempt of the process it reports on (or of the pod, when unreachable)."""
    exit_code: int | None = None
    reason: str | None = None
    time: str | None = None
    unreachable: str | None = None
    """Why the supervisor could not be asked (refused, timed out, bad answer)."""
    running: bool = False
    """The process runs (the readiness probe failed for another reason)."""


@dataclass(frozen=True, slots=True)
class Member:
    """A pod the attempt should have."""

    slice_index: int
    worker_index: int
    name: str


@functools.lru_cache(maxsize=1024)
def members_of(slice_name: str, slice_index: int, hosts: int) -> tuple[Member, ...]:
    """The pods a slice should have (cached: every reconcile of every slice needs them)."""
    return tuple(Member(slice_index, w, contract.pod_name(slice_name, w)) for w in range(hosts))


@dataclass
class SliceCount:
    total: int = 0
    existing: int = 0
    ready: int = 0
    succeeded: int = 0


@dataclass(frozen=True, slots=True)
class Unseen:
    """A pod no scheduler has looked at: its name, its ``schedulerName`` and when it was
    created."""

    pod: str
    scheduler: str
    created: str | None


SCHEDULER_GRACE_SECONDS = 30.0
"""How long the pods of an attempt may wait, while their scheduler looks at no pod of the
operator's either, before the job says that no scheduler has looked at any of them."""


def scheduler_wait(
    unseen: Unseen | None, now: dt.datetime, looked_at: dt.datetime | None = None
) -> tuple[str | None, float | None]:
    """What to say of pods no scheduler has looked at: (message, None) once they have
    waited ``SCHEDULER_GRACE_SECONDS``; (None, seconds until then) before; (None, None)
    when a scheduler has looked at the attempt's pods, or has looked at other pods of the
    operator's since these were made.

    ``looked_at``: when the scheduler they name last looked at any pod of the operator's
    (``runtime/caches.Schedulers``). A scheduler working through a backlog of thousands
    of pods (a thousand jobs applied at once) reaches an attempt's pods minutes after they
    were made; while it keeps placing others, it runs, and the wait is counted from its
    last placement instead: "check that such a scheduler runs" would send people looking
    for a fault that is none (and cost a status write per object). Nor does each waiting
    object look again every ``SCHEDULER_GRACE_SECONDS`` while the scheduler works (at
    1,000 jobs, 1.3 more reconciles per job and 3.2 per slice): the runtime wakes the
    owners of the pods awaiting a scheduler once it has been quiet that long
    (``Schedulers.gone_quiet``)."""
    if unseen is None:
        return None, None
    created = parse(unseen.created)
    looked_since = looked_at is not None and created is not None and looked_at > created
    since = looked_at if looked_since else created
    quiet = (now - since).total_seconds() if since is not None else 0.0
    if quiet < SCHEDULER_GRACE_SECONDS:
        if looked_since:  # woken when the scheduler goes quiet, not on a timer of its own
            return None, None
        return None, SCHEDULER_GRACE_SECONDS - quiet
    waited = (now - created).total_seconds() if created is not None else quiet
    which = (
        "the cluster's kube-scheduler (schedulerName default-scheduler)"
        if unseen.scheduler == DEFAULT_SCHEDULER
        else f"a scheduler named {unseen.scheduler!r} (spec.template.spec.schedulerName)"
    )
    stopped = (
        f" (which last looked at a pod of the operator's {quiet:.0f} s ago)" if looked_since else ""
    )
    return (
        f"no scheduler has looked at pod {unseen.pod} (or any other pod of this attempt) in "
        f"{waited:.0f} s: it waits for {which}{stopped}; check that such a scheduler runs, "
        "or set schedulerName to one that does",
        None,
    )


@dataclass
class GangState:
    attempt: int
    outcome: Outcome
    total: int
    ready: int = 0
    succeeded: int = 0
    to_create: list[Member] = field(default_factory=list)
    failure: WorkerFailure | None = None
    unschedulable: tuple[str, str] | None = None
    """(pod, scheduler message) of a pod the scheduler cannot place."""
    unseen: Unseen | None = None
    """The first pod of the attempt that no scheduler has looked at, while no scheduler
    has looked at any (a scheduler that works through a backlog has looked at some)."""
    slices: dict[int, SliceCount] = field(default_factory=dict)
    stale: list[PodView] = field(default_factory=list)
    """Pods of other attempts (to delete; the next attempt waits until they are gone)."""
    active: list[PodView] = field(default_factory=list)
    """Pods of this attempt that still run or wait to run."""
    failures: list[WorkerFailure] = field(default_factory=list)
    """Every failure seen (``failure`` is the one taken as the cause)."""
    leader_succeeded: bool = False
    """Worker 0 of slice 0 exited 0 (successPolicy LeaderWorker)."""
    scheduler_seen: bool = False
    """Some pod of the attempt was looked at by a scheduler (or runs on a node)."""


def may_end_attempt(pod: PodView) -> bool:
    """Whether an event on ``pod`` may end its gang's attempt (what ``_classify`` looks
    for): it is disrupted or being deleted, its worker finished, or its supervised
    training process stopped. Such an event is not held back by a large job's reconcile
    pacing (``reconcile/pacing.py``)."""
    return (
        pod.disruption is not None
        or pod.deleting
        or pod.outcome_phase in ("Succeeded", "Failed")
        or pod.process_stopped
    )


def stopping_count(pods: Iterable[PodView]) -> tuple[int, int]:
    """(active, terminating): unfinished pods not yet marked for deletion, and marked ones."""
    active = terminating = 0
    for pod in pods:
        if pod.terminal:
            continue
        if pod.deleting:
            terminating += 1
        else:
            active += 1
    return active, terminating


def nodes_of(pods: Iterable[PodView], tombstones: Mapping[str, PodView]) -> Iterator[str | None]:
    """The nodes of a gang's pods and of its deleted pods (``assess``'s tombstones): the
    ones among them that are not Ready or gone are what ``not_ready_nodes`` is asked."""
    for pod in pods:
        yield pod.node
    for pod in tombstones.values():
        yield pod.node


def _where(pod: PodView) -> str:
    return f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")


def _process_failure(pod: PodView, report: ProcessReport | None) -> WorkerFailure | None:
    """A supervised pod whose training process stopped, as its supervisor reports it."""
    if report is None or not pod.process_stopped or report.attempt != pod.attempt:
        return None
    where = _where(pod)
    if report.unreachable is not None:
        return WorkerFailure(
            Reason.SUPERVISOR_UNREACHABLE,
            f"{where}: the training process stopped and its supervisor does not answer "
            f"({report.unreachable})",
            pod.name,
            pod.node,
            None,
            report.time,
        )
    if report.running:
        return None
    code = report.exit_code
    detail = f"exited with code {code}" if code is not None else "ended"
    if report.reason and report.reason not in ("Exited", "Error", "Completed"):
        detail += f" ({report.reason})"
    return WorkerFailure(
        Reason.WORKER_FAILED,
        f"{where}: the training process {detail}",
        pod.name,
        pod.node,
        code,
        report.time,
    )


def _classify(
    pod: PodView, not_ready_nodes: frozenset[str], report: ProcessReport | None = None
) -> WorkerFailure | None:
    """Why ``pod`` ended the attempt, or None while it is healthy (or succeeded).

    Called for every pod of a gang on every reconcile (12,736 of them in the largest
    jobs), so the healthy path builds nothing."""
    if pod.disruption is not None:
        reason = Reason.NODE_LOST if pod.disruption in NODE_LOSS else Reason.EVICTED
        return WorkerFailure(
            reason,
            f"{_where(pod)} was disrupted ({pod.disruption})",
            pod.name,
            pod.node,
            pod.exit_code,
            pod.finished,
        )
    phase = pod.outcome_phase
    ended = phase == "Succeeded" or phase == "Failed"
    if not ended and pod.node and pod.node in not_ready_nodes:
        why = not_ready_nodes.why if isinstance(not_ready_nodes, LostNodes) else {}
        return WorkerFailure(
            Reason.NODE_LOST,
            f"{_where(pod)}: {why.get(pod.node) or 'the node is not ready'}",
            pod.name,
            pod.node,
            None,
            None,
        )
    if phase == "Failed":
        code = pod.exit_code
        detail = f"exited with code {code}" if code is not None else "failed"
        if pod.exit_reason and pod.exit_reason not in ("Error", "Completed"):
            detail += f" ({pod.exit_reason})"
        return WorkerFailure(
            Reason.WORKER_FAILED, f"{_where(pod)} {detail}", pod.name, pod.node, code, pod.finished
        )
    if not ended and pod.deleting:
        return WorkerFailure(
            Reason.POD_DELETED,
            f"{_where(pod)} was deleted while running",
            pod.name,
            pod.node,
            None,
            None,
        )
    if report is None:
        return None
    return _process_failure(pod, report)


def _vanished(
    member: Member, tombstone: PodView | None, not_ready: frozenset[str]
) -> WorkerFailure | None:
    if tombstone is not None:
        found = _classify(tombstone, not_ready)
        if found is not None:
            return found
        if tombstone.outcome_phase == "Succeeded":
            return None
    return WorkerFailure(
        Reason.POD_DELETED,
        f"pod {member.name} disappeared after it was created",
        member.name,
        tombstone.node if tombstone else None,
        None,
        None,
    )


FOLLOW_ON_EXIT_CODES = frozenset({contract.EXIT_RETRYABLE, contract.EXIT_ABORTED_BY_JAX})


def _cause(failures: list[WorkerFailure]) -> WorkerFailure:
    disruptions = [f for f in failures if f.disruption]
    pool = disruptions or failures
    return min(pool, key=lambda f: (f.time or "9999", f.exit_code in FOLLOW_ON_EXIT_CODES, f.pod))


def assess(
    *,
    attempt: int,
    members: Iterable[Member],
    pods: Iterable[PodView],
    created_slices: frozenset[int] = frozenset(),
    tombstones: Mapping[str, PodView] | None = None,
    not_ready_nodes: frozenset[str] = frozenset(),
    success_policy: SuccessPolicy = "AllWorkers",
    reports: Mapping[str, ProcessReport] | None = None,
    leader_slice: int = 0,
) -> GangState:
    """The state of ``attempt`` given the pods that exist now.

    ``leader_slice``: the slice whose worker 0 is the leader (``LeaderWorker``): the
    first slice the attempt runs on.

    ``created_slices`` are slices whose pods of this attempt were all seen created once: a
    member missing from them has vanished (a failure) rather than waiting to be created.
    ``tombstones`` are the last seen states of deleted pods of this attempt, by name.
    ``reports`` are supervisors' reports on stopped training processes, by pod name.
    """
    tombstones = tombstones or {}
    reports = reports or {}
    by_name: dict[str, PodView] = {}
    stale: list[PodView] = []
    for seen in pods:
        if seen.attempt == attempt:
            by_name[seen.name] = seen
        else:
            stale.append(seen)
    state = GangState(attempt=attempt, outcome="Creating", total=0, stale=stale)
    failures: list[WorkerFailure] = []
    leader_succeeded = False
    slices = state.slices
    count = SliceCount()
    counted_slice = None
    for member in members:
        if member.slice_index != counted_slice:  # members come slice by slice
            counted_slice = member.slice_index
            count = slices.setdefault(counted_slice, SliceCount())
        count.total += 1
        pod = by_name.get(member.name)
        if pod is None:
            if member.slice_index in created_slices or member.name in tombstones:
                vanished = _vanished(member, tombstones.get(member.name), not_ready_nodes)
                if vanished is not None:
                    failures.append(vanished)
                else:
                    count.succeeded += 1
            else:
                state.to_create.append(member)
            continue
        count.existing += 1
        failure = _classify(pod, not_ready_nodes, reports.get(pod.name) if reports else None)
        if failure is not None:
            failures.append(failure)
        elif pod.outcome_phase == "Succeeded":
            count.succeeded += 1
            if member.slice_index == leader_slice and member.worker_index == 0:
                leader_succeeded = True
        else:
            state.active.append(pod)
            if pod.awaiting_scheduler is None:
                state.scheduler_seen = True
            elif state.unseen is None:
                state.unseen = Unseen(pod.name, pod.awaiting_scheduler, pod.created)
            if pod.ready and pod.phase == "Running":
                count.ready += 1
            elif pod.unschedulable and state.unschedulable is None:
                state.unschedulable = (pod.name, pod.unschedulable)
    if state.scheduler_seen:
        state.unseen = None
    state.failures = failures
    state.leader_succeeded = leader_succeeded
    return _conclude(state, success_policy)


def combine(
    attempt: int, parts: Iterable[GangState], success_policy: SuccessPolicy = "AllWorkers"
) -> GangState:
    """The state of a gang from the states of its slices, each assessed on its own (the
    members and pods of one slice): the same state ``assess`` gives over all of them, but
    each slice's part can be kept until its pods change (``reconcile/gangs.py``)."""
    state = GangState(attempt=attempt, outcome="Creating", total=0)
    for part in parts:
        state.slices.update(part.slices)
        state.to_create.extend(part.to_create)
        state.stale.extend(part.stale)
        state.active.extend(part.active)
        state.failures.extend(part.failures)
        state.leader_succeeded = state.leader_succeeded or part.leader_succeeded
        if state.unschedulable is None:  # the first in member order, as ``assess`` finds it
            state.unschedulable = part.unschedulable
        state.scheduler_seen = state.scheduler_seen or part.scheduler_seen
        if state.unseen is None:
            state.unseen = part.unseen
    if state.scheduler_seen:
        state.unseen = None
    return _conclude(state, success_policy)


def _conclude(state: GangState, success_policy: SuccessPolicy) -> GangState:
    """Add up the slices' counts and decide the outcome."""
    state.total = state.ready = state.succeeded = 0
    for counted in state.slices.values():
        state.total += counted.total
        state.ready += counted.ready
        state.succeeded += counted.succeeded
    if state.failures:
        state.outcome = "Failed"
        state.failure = _cause(state.failures)
    elif state.total and (
        state.succeeded == state.total
        or (success_policy == "LeaderWorker" and state.leader_succeeded)
    ):
        state.outcome = "Succeeded"
    elif state.to_create:
        state.outcome = "Creating"
    elif state.ready + state.succeeded == state.total:
        state.outcome = "Running"
    else:
        state.outcome = "Starting"
    return state
