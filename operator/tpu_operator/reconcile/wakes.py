"""Which reconciles a watch event asks for, and how soon (the gang's rules for waking).

A pod event wakes its slice and, for a job's pod, its job; a node event the slices and
jobs of its pods; pods and nodes that may free or add a pool whoever waits for one. An
event that may end the gang's attempt, or that makes the last pod of its attempt ready, is
urgent; any other is routine progress (``runtime/workqueue.WorkQueue.settle``), and so are
the stops and deletions of an attempt the job has left, but for its last pod, whose
deletion lifts the gang's barrier for every slice of the job: urgent for the slices that
create pods, routine for those a mixed restart keeps (they create none; at 4,096 hosts
their 63 reconciles queued ahead of the one slice it recreates). The event that makes the
last pod of one slice of a job ready is not routine for that slice: it moves the slice's
phase. In a mixed restart, the event that makes the last pod of a recreated slice run
(its supervisor waiting for the start, so not ready) is urgent for the job, and waits
for no spacing: it may lift the in-place barrier, after which the job starts every
process of the attempt. Owners that are gone or being deleted are not woken: while a
deleted job's thousands of pods go, each of their events would otherwise be a reconcile.

``pod_wake`` and ``node_wake`` decide from the caches; the runtime enqueues what they say.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_operator.api.status import Phase, RestartKind
from tpu_operator.runtime.caches import Caches
from tpu_operator.state.gang import may_end_attempt
from tpu_operator.state.views import NodeView, PodView

Key = tuple[str, str]


@dataclass(frozen=True)
class Ask:
    """One reconcile asked for: its key, and whether it is urgent or routine, or waits
    for no spacing (``runtime/workqueue.WorkQueue.add``)."""

    key: Key
    urgent: bool = False
    routine: bool = False
    at_once: bool = False


@dataclass
class Wake:
    """What a watch event asks for."""

    slices: list[Ask] = field(default_factory=list)
    jobs: list[Ask] = field(default_factory=list)
    waiting: bool = False
    """Everything that waits for a node pool looks again (``waiting_for_pools``)."""


def live(body: dict[str, Any] | None) -> bool:
    """Whether a cached TPUJob or TPUSlice exists and is not being deleted."""
    return body is not None and not (body.get("metadata") or {}).get("deletionTimestamp")


def _none_left(unready: int | None) -> bool:
    """An unready count of zero, or none kept (unit tests' plain indexes): the pod just
    seen ready may be the last."""
    return unready is None or unready == 0


def _left_behind(caches: Caches, view: PodView) -> bool:
    """Whether ``view`` is a pod of an attempt its job has already left: while a gang
    restart drains the old attempt, each of its pods' stops and deletions is routine."""
    if not view.job_owned:
        return False
    job = caches.job(view.namespace, view.job_name)
    current = ((job or {}).get("status") or {}).get("attempt")
    return isinstance(current, int) and view.attempt < current


def _attempt_gone(caches: Caches, view: PodView) -> bool:
    """Whether no cached pod of ``view``'s job belongs to ``view``'s attempt."""
    return view.attempt not in caches.attempts_of_job(view.namespace, view.job_name)


def _completes(caches: Caches, view: PodView) -> bool:
    """Whether ``view`` is ready and no other pod of its gang's attempt is left not ready:
    its job (or slice) may now be Running, and says so without waiting."""
    return view.ready and _none_left(
        caches.unready_pods(view.namespace, view.job_name, view.attempt)
    )


def _completes_slice(caches: Caches, view: PodView) -> bool:
    """Whether ``view``, a pod of a job, is ready and no other pod of its slice's attempt is
    left not ready: the slice may now be Running."""
    return view.ready and _none_left(
        caches.unready_in_slice(view.namespace, view.slice_name, view.attempt)
    )


def _lifts_in_place_barrier(caches: Caches, view: PodView) -> bool:
    """Whether ``view`` runs, not ready, and is the last pod of its slice to run, where its
    job's mixed restart recreates that slice for ``view``'s attempt and has not reached
    Running: the job may start the attempt's processes now (``reconcile/supervisors.py``),
    though no pod turned ready (the new pods' supervisors wait for that start)."""
    if not view.addressed or view.deleting or view.ready:
        return False
    if not _none_left(caches.unstarted_in_slice(view.namespace, view.slice_name, view.attempt)):
        return False
    status = (caches.job(view.namespace, view.job_name) or {}).get("status") or {}
    recreated = _mixed_recreates(status)
    return (
        status.get("attempt") == view.attempt
        and status.get("phase") != Phase.RUNNING
        and recreated is not None
        and view.slice_index in recreated
    )


def _mixed_recreates(status: dict[str, Any]) -> Collection[Any] | None:
    """The indexes of the slices a job's mixed restart recreates (every other slice keeps
    its pods, carrying them into the attempt in place); None unless its status says a
    mixed restart. The job commits its status before it writes its slices."""
    if status.get("restartKind") != RestartKind.MIXED:
        return None
    return status.get("recreatedSlices") or ()


def routine(wake: Wake) -> Wake:
    """``wake`` with every reconcile it asks for taken as routine progress."""
    return Wake(
        slices=[Ask(ask.key, routine=True) for ask in wake.slices],
        jobs=[Ask(ask.key, routine=True) for ask in wake.jobs],
        waiting=wake.waiting,
    )


def _owners(
    caches: Caches, pod: PodView, *, urgent: bool, routine: bool, slice_routine: bool
) -> Wake:
    """A worker pod's slice and, for a job's pod, its job, if they are live."""
    wake = Wake()
    if live(caches.slice(pod.namespace, pod.slice_name)):
        wake.slices.append(Ask((pod.namespace, pod.slice_name), urgent, slice_routine))
    if pod.job_owned and live(caches.job(pod.namespace, pod.job_name)):
        wake.jobs.append(Ask((pod.namespace, pod.job_name), urgent, routine))
    return wake


def _pool_freed(caches: Caches, type: str | None, view: PodView) -> bool:
    """A pool changes hands when the last pod on it is gone."""
    freed = view.pool and (type == "DELETED" or view.terminal)
    return bool(freed) and not any(p.active for p in caches.pods_in_pool(view.pool or ""))


def pod_wake(caches: Caches, type: str | None, view: PodView) -> Wake:
    """What a worker pod's event (``type`` None: listed) asks for."""
    if not view.own:
        # Not the operator's worker (``runtime/ownership.py``): it wakes nothing, but the
        # last orphan leaving a pool frees it.
        return Wake(waiting=view.ownership == "orphan" and _pool_freed(caches, type, view))
    # The last pod of its attempt in its job went (a pod still cached never is).
    last = type == "DELETED" and view.job_owned and _attempt_gone(caches, view)
    urgent = type == "DELETED" or may_end_attempt(view) or _completes(caches, view)
    if urgent and not last and _left_behind(caches, view):
        urgent = False
    # Once per recreated slice and restart: the job starts the attempt's processes now,
    # not after a large job's reconcile spacing (0.41 s at 4,096 pods). Whether or not
    # the event is urgent anyway: a new pod whose supervisor waits for the start is not
    # ready since its container started (to the second), as a stopped process's is.
    lifts = view.job_owned and type is not None and _lifts_in_place_barrier(caches, view)
    urgent = urgent or lifts
    # The last pod of one slice of a multislice job became ready: the slice says it is
    # Running now, not after a slice of an N-slice job's longer settle time (up to 10 s);
    # its job, still waiting for other slices, takes it as routine progress.
    prompt = not urgent and view.job_owned and _completes_slice(caches, view)
    wake = _owners(
        caches, view, urgent=urgent, routine=not urgent, slice_routine=not (urgent or prompt)
    )
    if lifts:
        wake.jobs = [replace(ask, at_once=True) for ask in wake.jobs]
    job = caches.job(view.namespace, view.job_name) if last else None
    if last and live(job):
        # The gang's barrier may have lifted: every slice of the job creates the next
        # attempt's pods once no pod of an older one is left (reconcile/slices.py). A
        # slice a mixed restart keeps carries its pods into the attempt in place and
        # creates none: what it has to say (no longer waiting for that drain) is routine
        # progress, and its reconcile must not queue ahead of those that create pods.
        recreated = _mixed_recreates((job or {}).get("status") or {})
        for body in caches.slices_of_job(view.namespace, view.job_name):
            name = (body.get("metadata") or {}).get("name")
            if isinstance(name, str) and live(body):
                index = (body.get("spec") or {}).get("sliceIndex", 0)
                carries = recreated is not None and index not in recreated
                wake.slices.append(Ask((view.namespace, name), not carries, carries))
    wake.waiting = _pool_freed(caches, type, view)
    return wake


def node_wake(caches: Caches, type: str | None, view: NodeView) -> Wake:
    """What a TPU node's event asks for: its pods' slices and jobs (urgent when it is lost
    or noticed for maintenance), and whatever waits for a pool."""
    lost = type == "DELETED" or not view.ready or view.disruption_notice is not None
    wake = Wake(waiting=True)
    for pod in caches.pods_on_node(view.name):
        found = _owners(caches, pod, urgent=lost, routine=False, slice_routine=False)
        wake.slices += found.slices
        wake.jobs += found.jobs
    return wake


def waiting_for_pools(caches: Caches) -> Iterator[tuple[str, Key]]:
    """The jobs and standalone slices that may wait for a node pool: ("jobs" or "slices",
    key)."""
    for job in caches.jobs():
        if (job.get("status") or {}).get("phase") in (None, Phase.PENDING):
            meta = job["metadata"]
            yield "jobs", (meta["namespace"], meta["name"])
    for body in caches.all_slices():
        status = body.get("status") or {}
        if status.get("phase") in (None, Phase.PENDING) and not status.get("nodePool"):
            meta = body["metadata"]
            yield "slices", (meta["namespace"], meta["name"])
