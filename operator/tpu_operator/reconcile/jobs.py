"""TPUJob reconciler: slices, Service, node pools, gang restarts, status and events.

The job owns the attempt number. One reconcile runs in three steps (docs/design.md):

1. **decide** (no I/O): from the watch caches, work out the job's new status: start an
   attempt (node pools chosen for all slices at once), assess the running attempt over all
   pods of all slices, apply the failure policy, suspend, finish. Events are collected.
2. **commit**: write the status once, guarded by the resourceVersion that was read, so a
   decision made on stale data is never acted on (409: decide again on fresh data).
   Events are posted only after the write succeeds.
3. **act**: bring the children in line with the committed status: create or patch one
   TPUSlice per slice for the committed attempt (the slices create the pods, and pods of
   a new attempt wait until every pod of the old one is gone), stop the slices of a
   suspended or finished job, delete a job whose TTL ran out.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from enum import Enum, auto
from typing import Any

from pydantic import ValidationError

from tpu_operator import contract, supervision
from tpu_operator.api.common import Failure
from tpu_operator.api.conditions import parse, set_condition, stamp
from tpu_operator.api.job import QueueStatus, SliceSummary, TPUJobSpec, TPUJobStatus
from tpu_operator.api.monitoring import Monitoring, seconds
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.status import (
    TERMINAL_PHASES,
    ConditionType,
    Phase,
    Reason,
    ResolvedShape,
    RestartKind,
)
from tpu_operator.builders.pods import Owner
from tpu_operator.builders.service import headless_service
from tpu_operator.builders.slices import job_slice, slice_patch
from tpu_operator.builders.supervision import (
    key_secret,
    key_secret_name,
    runs_supervisor,
    stop_grace,
    supervision_refused,
)
from tpu_operator.builders.wiring import Ports
from tpu_operator.builders.workload import apply_assignment, queue_name, reclaimable_pods
from tpu_operator.catalog import CatalogError, SliceShape, chips_per_host_choices
from tpu_operator.decisions import book_restart, decide, restart_kind
from tpu_operator.placement.pools import shape_words
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL, claim_of, is_claim
from tpu_operator.progress.account import Account
from tpu_operator.reconcile.context import (
    RETRY_AFTER_CONFLICT,
    Context,
    SliceRefusal,
    job_ref,
    mark_invalid,
    write_status,
)
from tpu_operator.reconcile.gangs import GangParts, JobGang
from tpu_operator.reconcile.pools import (
    MIN_REQUEUE_SECONDS,
    POOL_RETRY_SECONDS,
    choose_pools,
    job_holder,
    machine_for,
    renew_vanished_pools,
    requests_for,
    resolve_claims,
    slice_pool_values,
)
from tpu_operator.reconcile.queueing import Queueing
from tpu_operator.runtime.kube import ApiError, namespaced, send_all
from tpu_operator.runtime.ownership import slice_job
from tpu_operator.state.gang import (
    FOLLOW_ON_EXIT_CODES,
    GangState,
    Outcome,
    ProcessReport,
    WorkerFailure,
    assess,
    members_of,
    nodes_of,
    scheduler_wait,
    stopping_count,
)
from tpu_operator.state.views import PodView

log = logging.getLogger(__name__)

DEFAULT_PUBLISH_SECONDS = 30.0
"""Progress publish interval when no sampler is configured (unit tests)."""
CAUSE_SETTLE_SECONDS = 3.0
"""How long an echo failure (exit 75/134: a peer died) waits for the peer's own report."""
MAX_NOTICES = 32
"""Disruption notices remembered in status (each asks for one checkpoint)."""
SLICE_RETRY_SECONDS = 30.0
"""Retry after the apiserver refused the job's TPUSlices (an admission policy, a quota):
the cause is outside the operator and may be lifted at any time."""
IN_PLACE_RECHECK_SECONDS = 1.0
"""Safety net while an in-place restart runs (pod events wake the job too)."""


class Act(Enum):
    """What a reconcile does to the job's children once its status is committed."""

    NOTHING = auto()
    RUN = auto()
    """Create or patch the Service and one TPUSlice per slice for the committed attempt."""
    STOP = auto()
    """Suspend the existing slices (their pods are deleted)."""
    DELETE = auto()
    """Delete the job (ttlSecondsAfterFinished)."""


def _slices_path(namespace: str, name: str | None = None) -> str:
    return namespaced(
        namespace, contract.SLICE_PLURAL, name, group=contract.GROUP, version=contract.VERSION
    )


class JobReconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.gangs = GangParts()
        """The slices' parts of each running job's assessment (``reconcile/gangs.py``)."""

    async def __call__(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        body = self.ctx.caches.job(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.gangs.forget(namespace, name)
            if body is None:
                self.ctx.reservations.release(job_holder(namespace, name))
                self.ctx.refused_slices.pop(key, None)
            return None
        try:
            spec = TPUJobSpec.model_validate(body.get("spec") or {})
            shape = spec.slice.resolve()
        except (ValidationError, CatalogError) as exc:
            await mark_invalid(self.ctx, body, contract.JOB_PLURAL, exc)
            return None
        status = body.get("status") or {}
        # The machine type of a shape that fits two is decided once, for the first attempt.
        recorded = status.get("shape") if status.get("attempt") else None
        holder = job_holder(namespace, name)
        shape, note = machine_for(self.ctx, holder, spec.slice, shape, spec.placement, recorded)
        return await JobRun(
            self.ctx, body, spec, shape, machine_note=note, gangs=self.gangs
        ).reconcile()


class JobRun:
    """One reconcile of one job."""

    def __init__(
        self,
        ctx: Context,
        body: dict[str, Any],
        spec: TPUJobSpec,
        shape: SliceShape,
        machine_note: str = "",
        gangs: GangParts | None = None,
    ) -> None:
        self.ctx = ctx
        self.gangs = gangs if gangs is not None else GangParts()
        self.gang: JobGang | None = None
        """The attempt assessed slice by slice (None: every pod is walked instead)."""
        self.body = body
        self.raw_spec: dict[str, Any] = body.get("spec") or {}
        self.spec = spec
        self.shape = shape
        self.machine_note = machine_note
        """Why this machine type, when the operator chose it (a shape that fits two)."""
        self.provisioning: list[str] = []
        """Slices whose pools GKE is still to create, and why they are not there yet."""
        self.pools_gone: list[str] = []
        """Recorded pools with no nodes left, and what the slice does about it."""
        fields = self.raw_spec.get("slice") or {}
        choices = chips_per_host_choices(shape.generation, shape.topology)
        if "chipsPerHost" not in fields and len(choices) > 1:
            # The slices run on the machine type chosen here, whatever the default.
            slice_fields = {**fields, "chipsPerHost": shape.chips_per_host}
            self.raw_spec = {**self.raw_spec, "slice": slice_fields}
        meta = body["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.generation = meta.get("generation")
        self.status = TPUJobStatus.model_validate(body.get("status") or {})
        self.previous_phase = self.status.phase
        self.policy = spec.failure_policy or FailurePolicy()
        self.now = ctx.clock()
        self.requeue: float | None = None
        uid = meta["uid"]
        self.slices = {
            int((s.get("spec") or {}).get("sliceIndex", 0)): s
            for s in ctx.caches.slices_of_job(self.namespace, self.name)
            if slice_job(s) == (self.name, uid)  # a slice belongs to a job by UID
        }
        self.conditions = [c.wire() for c in self.status.conditions]
        self.pending_events: list[tuple[str, str, str]] = []
        self.after_commit: list[Callable[[], None]] = []
        self.act = Act.NOTHING
        self.monitoring = spec.monitoring or Monitoring()
        sampler = ctx.progress
        track = (
            sampler.track(self.namespace, self.name)
            if sampler is not None and self.monitoring.enabled
            else None
        )
        # A track of another attempt has nothing to say about this one.
        self.track = track if track is not None and track.attempt == self.status.attempt else None
        self.created = parse(meta.get("creationTimestamp")) or self.now
        self.queueing = (
            Queueing(ctx, body, shape, spec.num_slices)
            if ctx.caches.kueue and queue_name(meta)
            else None
        )
        """Kueue's side of a job labelled kueue.x-k8s.io/queue-name (reconcile/queueing.py)."""
        template = self.raw_spec.get("template") or {}
        runs = ctx.supervisors is not None and runs_supervisor(template, self.policy.restart_mode)
        self.supervision_refused = (
            supervision_refused(template, self.namespace, ctx.control_network_policy)
            if runs
            else None
        )
        """Why the workers, which could run the supervisor, do not (or None)."""
        self.supervised = runs and self.supervision_refused is None
        """Restarts may run in place: the workers run the supervisor (failurePolicy)."""
        self.reports: dict[str, ProcessReport] = {}
        """Supervisors' reports on stopped training processes, by pod name."""
        self.checkpoint_for: list[str] = []
        """New disruption notices: the workers are asked to checkpoint (after commit)."""
        self.account = Account(
            self.status,
            created=self.created,
            now=self.now,
            track=self.track,
            publish_interval=(
                sampler.publish_interval if sampler is not None else DEFAULT_PUBLISH_SECONDS
            ),
        )

    # helpers
    @functools.cached_property
    def pods(self) -> list[PodView]:
        """Every pod of the job, any attempt (copied out of the cache only if asked for:
        a running job's reconcile reads its slices' parts instead, ``_gang``)."""
        return self.ctx.caches.pods_of_job(self.namespace, self.name)

    @property
    def holder(self) -> str:
        return job_holder(self.namespace, self.name)

    @property
    def total_workers(self) -> int:
        return self.spec.num_slices * self.shape.hosts

    def _after(self, seconds: float) -> None:
        seconds = max(seconds, MIN_REQUEUE_SECONDS)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def _condition(
        self, type_: ConditionType, status: bool, reason: str, message: str = ""
    ) -> None:
        self.conditions = set_condition(
            self.conditions,
            type_,
            status,
            reason,
            message,
            at=self.now,
            generation=self.generation,
        )

    def _condition_is(self, type_: ConditionType, value: bool) -> bool:
        wanted = "True" if value else "False"
        return any(c.get("type") == type_ and c.get("status") == wanted for c in self.conditions)

    def _event(self, type_: str, reason: Reason, message: str) -> None:
        self.pending_events.append((type_, reason, message))

    def _owner(self) -> Owner:
        return Owner(
            contract.API_VERSION, contract.JOB_KIND, self.name, self.body["metadata"]["uid"]
        )

    def _extra_labels(self) -> dict[str, str]:
        labels = self.body["metadata"].get("labels") or {}
        queue = labels.get(contract.LABEL_KUEUE_QUEUE)
        return {contract.LABEL_KUEUE_QUEUE: queue} if queue else {}

    # the reconcile: decide, commit, act
    async def reconcile(self) -> float | None:
        await self._observe_supervisors()
        if self.queueing is not None:
            await self.queueing.load_flavors()  # a new admission's ResourceFlavors
        self.decide()
        if not await self._commit():
            # What this reconcile reserved stays reserved until the job's next write: the
            # write may have lost to the job's own earlier one, which recorded pools the
            # cache does not show yet (context.Reservations).
            return RETRY_AFTER_CONFLICT
        if self.status.phase in TERMINAL_PHASES or self.status.phase in (
            Phase.SUSPENDED,
            Phase.QUEUED,
        ):
            # The pods hold the pools from now on, until they are gone (reconcile/pools.py).
            self.ctx.reservations.release(self.holder)
        else:
            self.ctx.reservations.hold(self.holder, list(self.status.node_pools or []))
        await self._act()
        if self.queueing is not None:
            await self.queueing.act(stamp(self.now))
        return self.requeue

    async def _observe_supervisors(self) -> None:
        """Ask the supervisors of pods whose training process stopped what happened (the
        only I/O before deciding; answers are remembered per readiness transition)."""
        supervisors = self.ctx.supervisors
        if supervisors is None or self.status.phase in TERMINAL_PHASES:
            return
        # Pods of older attempts are being stopped by an in-place restart: nothing to ask.
        current = [p for p in self.pods if p.attempt >= self.status.attempt]
        if not any(p.process_stopped for p in current):
            return
        self.reports, retry = await supervisors.observe(self.body["metadata"]["uid"], current)
        if retry is not None:
            self._after(retry)

    def decide(self) -> None:
        """Work out the new status, events and the act to follow (no I/O)."""
        status = self.status
        attempt = max(
            [status.attempt]
            + [int((s.get("spec") or {}).get("attempt", 0)) for s in self.slices.values()]
        )
        self._gang(attempt)
        self._count_pods()
        if status.phase in TERMINAL_PHASES:
            self._finished()
        elif self.spec.suspend:
            self._suspend()
        elif self._queue_holds():
            pass  # Kueue has not admitted the job (or evicted it): no pods, like suspend
        elif (
            attempt == 0
            or status.phase in (Phase.SUSPENDED, Phase.QUEUED)
            or (self.shape.multi_host and not status.node_pools)
        ):
            # Not started, resumed, or resumed and still waiting for node pools: a
            # multi-host attempt never runs without its pools recorded.
            self._start(attempt)
        elif (refused := self._slice_refusal()) is not None and refused.invalid:
            message = (
                f"the apiserver rejected the job's TPUSlice: {refused.message}; fix the spec "
                "(the job cannot run with it)"
            )
            self._fail(Reason.INVALID_SPEC, message, None)
        else:
            self.act = Act.RUN
            self._resolve_claims()
            self._assess(attempt)
            self._renew_vanished_pools()  # a restart decided now: new pools before its pods
        if self.queueing is not None:
            report = self.queueing.report
            report.suspended = self.spec.suspend and status.phase not in TERMINAL_PHASES
            if status.phase in TERMINAL_PHASES:
                report.finished = (status.phase == Phase.SUCCEEDED, status.message)
            elif self.spec.suspend:
                # The quota goes back once the pods are gone (Kueue evicts the deactivated
                # Workload; the operator clears the admission, as after any eviction).
                report.release = self._condition_is(ConditionType.PODS_STOPPED, True)
            elif self.queueing.state.admitted:
                report.pods_ready = status.phase == Phase.RUNNING
                report.reclaimable = reclaimable_pods(
                    self.pods, status.attempt, self.shape.hosts, self.spec.num_slices
                )

    async def _commit(self) -> bool:
        """Write the status (once); on success post the events of this reconcile."""
        status = self.status
        status.observed_generation = self.generation
        status.shape = ResolvedShape.of(self.shape)
        wire = status.wire()
        wire["conditions"] = self.conditions
        if not self.pending_events and not self.after_commit:
            current = self.body.get("status") or {}
            hold = self.ctx.pacer.hold(self.body["metadata"]["uid"], current, wire)
            if hold:  # only counters moved: written with the next change or after `hold`
                self._after(hold)
                return True
        pacer = self.ctx.pacer
        if not await write_status(self.ctx.kube, contract.JOB_PLURAL, self.body, wire, pacer):
            return False
        ref = job_ref(self.body)
        for type_, reason, message in self.pending_events:
            self.ctx.events.emit(ref, type_, reason, message)
        self.pending_events.clear()
        for action in self.after_commit:
            action()
        self.after_commit.clear()
        return True

    async def _act(self) -> None:
        if self.act is Act.RUN:
            await self._run_children(self.status.attempt)
            if self._restarting_in_place():
                await self._restart_in_place(self.status.attempt)
            if self.checkpoint_for and self.ctx.supervisors is not None:
                asked = await self.ctx.supervisors.checkpoint(
                    job_uid=self.body["metadata"]["uid"],
                    pods=self.pods,
                    attempt=self.status.attempt,
                    request_id=hashlib.sha256(self.checkpoint_for[-1].encode()).hexdigest()[:16],
                )
                log.info(
                    "%s: asked %d workers to checkpoint (%s)",
                    self.holder,
                    asked,
                    "; ".join(self.checkpoint_for),
                )
        elif self.act is Act.STOP:
            await self._stop_children()
        elif self.act is Act.DELETE:
            log.info(
                "deleting %s: finished %s s ago (ttlSecondsAfterFinished)",
                self.holder,
                self.spec.ttl_seconds_after_finished,
            )
            path = namespaced(
                self.namespace,
                contract.JOB_PLURAL,
                self.name,
                group=contract.GROUP,
                version=contract.VERSION,
            )
            await self.ctx.kube.delete(path, propagation="Background")

    # decisions
    def _gang(self, attempt: int) -> None:
        """Assess a running attempt by slices (``reconcile/gangs.py``); a job that runs
        none (finished, suspended, not started) keeps no parts."""
        status = self.status
        if attempt == 0 or self.spec.suspend or status.phase in TERMINAL_PHASES:
            self.gangs.forget(self.namespace, self.name)
            return
        self.gang = self.gangs.assess(
            self.ctx.caches,
            namespace=self.namespace,
            job=self.name,
            attempt=attempt,
            num_slices=self.spec.num_slices,
            hosts=self.shape.hosts,
            created=self._created(attempt),
            success_policy=self.spec.success_policy,
            reports=self.reports,
        )

    def _created(self, attempt: int) -> frozenset[int]:
        """Slices that have created every pod of ``attempt`` once (a pod missing from
        them has vanished, rather than waiting to be created)."""
        return frozenset(
            i
            for i, s in self.slices.items()
            if int((s.get("spec") or {}).get("attempt", 0)) == attempt
            and int((s.get("status") or {}).get("createdAttempt", 0)) >= attempt
        )

    def _count_pods(self) -> None:
        status = self.status
        if self.gang is not None:
            status.active_pods = self.gang.active_pods
            status.terminating_pods = self.gang.terminating_pods
        else:
            status.active_pods, status.terminating_pods = stopping_count(self.pods)

    def _stopped(self) -> None:
        """A suspended or finished job: say whether its pods (and so its pools) are gone."""
        status = self.status
        active, terminating = status.active_pods, status.terminating_pods
        if active or terminating:
            self._condition(
                ConditionType.PODS_STOPPED,
                False,
                Reason.PODS_STOPPING,
                f"{active} pods not yet marked for deletion, {terminating} terminating",
            )
        else:
            self._condition(
                ConditionType.PODS_STOPPED,
                True,
                Reason.ALL_PODS_STOPPED,
                "no pod of the job is left: its node pools and chips are free",
            )

    def _finished(self) -> None:
        self.act = Act.STOP
        for summary in self.status.slices:
            # The slices report their own end after the job's: keep the summary current.
            slice_status = (self.slices.get(summary.index) or {}).get("status") or {}
            summary.phase = slice_status.get("phase", summary.phase)
        self._stopped()
        ttl = self.spec.ttl_seconds_after_finished
        finished = parse(self.status.completion_time)
        if ttl is None or finished is None:
            return
        due = finished + dt.timedelta(seconds=ttl)
        if self.now < due:
            self._after((due - self.now).total_seconds())
            return
        self.act = Act.DELETE

    def _suspend(self) -> None:
        status = self.status
        self.act = Act.STOP
        if status.phase != Phase.SUSPENDED:
            self._event("Normal", Reason.SUSPENDED, "suspended: deleting the workers' pods")
        self.account.suspend(self.total_workers)  # the attempt ends; its clock stops
        status.phase = Phase.SUSPENDED
        status.node_pools = None
        status.restart_at = None
        stopping = status.active_pods + status.terminating_pods
        status.message = f"suspended; {stopping} pods still stopping" if stopping else "suspended"
        status.ready_workers = 0
        status.ready = f"0/{self.total_workers}"
        self._condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, "spec.suspend is true")
        self._condition(ConditionType.RUNNING, False, Reason.SUSPENDED)
        self._stopped()

    def _queue_holds(self) -> bool:
        """A Kueue-managed job: held (no pods) until Kueue admits its Workload, stopped
        when Kueue evicts it; the quota goes back once its pods are gone (PodsStopped)."""
        if self.queueing is None:
            return False
        status = self.status
        state = self.queueing.state
        previous = status.queue or QueueStatus()
        assignment = state.assignment
        status.queue = QueueStatus(
            workload=self.queueing.workload_name,
            local_queue=queue_name(self.body["metadata"]) or "",
            cluster_queue=assignment.cluster_queue if assignment else previous.cluster_queue,
            state=state.state,
            reason=state.reason,
            message=state.message,
            flavors=(assignment.flavors or None) if assignment else previous.flavors,
            admissions=previous.admissions + int(state.admitted and previous.state != "Admitted"),
        )
        if state.admitted and state.conflict and previous.state != "Admitted":
            # Judged when an admission starts the job, as Kueue does (a running job keeps
            # its pods). The Workload is marked Finished, which frees the quota.
            message = f"cannot run on Kueue's admission: {state.conflict}"
            self._event("Warning", Reason.ADMISSION_CONFLICT, message)
            self._fail(Reason.ADMISSION_CONFLICT, message, None)
            return True
        if state.admitted and assignment is not None:
            where = f"ClusterQueue {assignment.cluster_queue}"
            if assignment.flavors:
                where += " (" + ", ".join(f"{k}: {v}" for k, v in assignment.flavors.items()) + ")"
            if previous.state != "Admitted":
                self._event("Normal", Reason.ADMITTED, f"admitted by Kueue to {where}")
            self._condition(ConditionType.ADMITTED, True, Reason.ADMITTED, f"admitted to {where}")
            self._condition(ConditionType.QUEUED, False, Reason.ADMITTED, where)
            if any(c.get("type") == ConditionType.EVICTED for c in self.conditions):
                self._condition(ConditionType.EVICTED, False, Reason.ADMITTED)
            template = apply_assignment(self.raw_spec.get("template") or {}, assignment)
            self.raw_spec = {**self.raw_spec, "template": template}
            return False
        self.act = Act.STOP
        entering = status.phase != Phase.QUEUED
        if status.attempt > 0:
            # Evicted (or queued again after running): the attempt ends, and the time until
            # Kueue admits the job again is booked as suspended.
            self.account.suspend(self.total_workers)
        status.phase = Phase.QUEUED
        status.node_pools = None
        status.restart_at = None
        status.ready_workers = 0
        status.ready = f"0/{self.total_workers}"
        stopping = status.active_pods + status.terminating_pods
        if state.state == "Evicted":
            if not self._condition_is(ConditionType.EVICTED, True):
                self._event(
                    "Warning",
                    Reason.WORKLOAD_EVICTED,
                    f"evicted by Kueue ({state.reason}): stopping the workers; {state.message}",
                )
            self._condition(ConditionType.EVICTED, True, state.reason, state.message)
            status.message = f"evicted by Kueue ({state.reason})"
        else:
            status.message = f"queued in {status.queue.local_queue}: {state.message}"
        if stopping:
            status.message += f"; {stopping} pods still stopping"
        self._condition(ConditionType.QUEUED, True, state.reason, state.message)
        self._condition(ConditionType.ADMITTED, False, state.reason, state.message)
        self._condition(ConditionType.RUNNING, False, Reason.QUEUED)
        self._stopped()
        if state.state == "Evicted" and self._condition_is(ConditionType.PODS_STOPPED, True):
            # The job is no longer active: Kueue may give its quota to others now.
            self.queueing.report.release = True
        if entering:
            self._event("Normal", Reason.QUEUED, status.message)
        return True

    def _queue_pools(self) -> list[str] | None:
        """Node pool per slice from Kueue's topology assignment, if it made one."""
        state = self.queueing.state if self.queueing is not None else None
        if state is None or state.assignment is None or not state.assignment.node_pools:
            return None
        return list(state.assignment.node_pools)

    def _start(self, attempt: int) -> None:
        """Begin the next attempt (first run or resume), or wait for node pools."""
        status = self.status
        # The Suspended condition stays True until the resumed attempt starts (a resumed
        # job may first wait for node pools, in phase Pending).
        resuming = self._condition_is(ConditionType.SUSPENDED, True)
        self.account.resume()  # a suspended or evicted job: its wait is scheduling again
        creating = ""
        if self.shape.multi_host and not status.node_pools:
            pools = self._queue_pools() or self._allocate()
            if pools is None:
                return
            status.node_pools = pools
            self._assigned(pools, self.machine_note)
            asked = [i for i, p in enumerate(pools) if is_claim(p)]
            if asked:
                creating = "; GKE is to create the node pools of slices " + ", ".join(
                    str(i) for i in asked
                )
        attempt += 1
        status.attempt = attempt
        status.phase = Phase.PENDING
        status.running_since = None  # each attempt runs once all of its own workers do
        status.message = f"attempt {attempt}: creating slices{creating}"
        if self.machine_note and not self.shape.multi_host:
            status.message += f"; {self.machine_note}"
        if status.start_time is None or resuming:
            status.start_time = stamp(self.now)
        status.restart_at = None
        if resuming:
            self._event("Normal", Reason.RESUMED, f"resumed as attempt {attempt}")
            if any(c.get("type") == ConditionType.PODS_STOPPED for c in self.conditions):
                self._condition(ConditionType.PODS_STOPPED, False, Reason.RESUMED)
        self._condition(
            ConditionType.SUSPENDED,
            False,
            Reason.RESUMED if resuming else Reason.NOT_SUSPENDED,
        )
        # The slices are created (or moved to the attempt) once this status is committed;
        # the attempt is assessed from their events on.
        self.act = Act.RUN

    def _assigned(self, pools: list[str], note: str) -> None:
        """Events for the pools of a starting attempt: those taken, those asked of GKE."""
        named = [f"slice {i} -> {p}" for i, p in enumerate(pools) if not is_claim(p)]
        if named:
            self._event(
                "Normal",
                Reason.NODE_POOLS_ASSIGNED,
                ", ".join(named) + (f" ({note})" if note else ""),
            )
        for index, ref in enumerate(pools):
            value = claim_of(ref)
            if value is not None:
                self._event(
                    "Normal",
                    Reason.WAITING_FOR_NODE_POOLS,
                    f"slice {index}: no free node pool of {shape_words(self.shape)}; its pods "
                    f"ask GKE to create one (node selector and toleration "
                    f"{SLICE_POOL_LABEL}={value})",
                )

    def _renew_vanished_pools(self) -> None:
        """A recorded pool with no nodes left: ask GKE for a new one, or say it has none."""
        attempt = self.status.attempt
        created = [
            i
            for i, s in self.slices.items()
            if int((s.get("status") or {}).get("createdAttempt", 0)) >= attempt
        ]
        refs, gone = renew_vanished_pools(
            self.ctx,
            self.body["metadata"],
            self.status.node_pools or [],
            self.spec.placement,
            created,
            attempt,
        )
        self.pools_gone = [g.message for g in gone]
        if any(g.reclaim for g in gone):
            self.status.node_pools = refs
            for g in gone:
                if g.reclaim:
                    self._event("Warning", Reason.NODE_POOL_GONE, g.message)

    def _resolve_claims(self) -> None:
        """Record the pools GKE created for the slices' claims, once their nodes are there."""
        self._renew_vanished_pools()
        pools = self.status.node_pools or []
        if not any(is_claim(p) for p in pools):
            return
        refs, resolved, self.provisioning = resolve_claims(self.ctx, pools, self.shape)
        if resolved:
            self.status.node_pools = refs
            mapping = ", ".join(f"slice {i} -> {p}" for i, p in resolved.items())
            self._event("Normal", Reason.NODE_POOLS_ASSIGNED, f"{mapping} (created by GKE)")

    def _allocate(self) -> list[str] | None:
        count = self.spec.num_slices
        claims = slice_pool_values(self.body["metadata"], count)
        requests = requests_for(self.shape, self.spec.placement, count, claims)
        allocation = choose_pools(self.ctx, self.holder, requests)
        if allocation.pools is None:
            if self.status.message != allocation.message:
                self._event("Normal", Reason.WAITING_FOR_NODE_POOLS, allocation.message)
            self.status.phase = Phase.PENDING
            self.status.message = allocation.message
            self._condition(
                ConditionType.PODS_SCHEDULED,
                False,
                Reason.WAITING_FOR_NODE_POOLS,
                allocation.message,
            )
            self._after(POOL_RETRY_SECONDS)
            return None
        return allocation.pools

    def _assess_all(self, attempt: int) -> GangState:
        """The attempt assessed over every pod of the job at once (when ``_gang`` could
        not assess it by slices)."""
        hosts = self.shape.hosts
        members = [
            m
            for i in range(self.spec.num_slices)
            for m in members_of(contract.slice_name(self.name, i), i, hosts)
        ]
        tombstones: dict[str, Any] = {}
        for i in range(self.spec.num_slices):
            tombstones.update(
                self.ctx.caches.tombstones.of_slice(
                    self.namespace, contract.slice_name(self.name, i), attempt
                )
            )
        return assess(
            attempt=attempt,
            members=members,
            pods=self.pods,
            created_slices=self._created(attempt),
            tombstones=tombstones,
            not_ready_nodes=self.ctx.caches.not_ready_nodes(nodes_of(self.pods, tombstones)),
            success_policy=self.spec.success_policy,
            reports=self.reports,
        )

    def _assess(self, attempt: int) -> None:
        status = self.status
        state = self.gang.state if self.gang is not None else self._assess_all(attempt)
        self._summaries(state)
        self._pods_allowed(attempt, state)
        draining = bool(state.stale)
        restart_at = parse(status.restart_at)
        backing_off = restart_at is not None and self.now < restart_at
        if backing_off and restart_at is not None:
            self._after((restart_at - self.now).total_seconds())

        rejected = self._rejected_template(attempt)
        if rejected:
            self._fail(Reason.INVALID_POD_TEMPLATE, rejected, None)
            return
        if self._deadline_exceeded():
            self._fail(
                Reason.DEADLINE_EXCEEDED,
                f"the job was active longer than activeDeadlineSeconds "
                f"({self.spec.active_deadline_seconds})",
                None,
            )
            return
        outcome: Outcome = state.outcome
        failure = state.failure
        if not draining and outcome in ("Starting", "Running"):
            stall = self._stall()
            if stall is not None and self.monitoring.stall_action == "Restart":
                outcome, failure = "Failed", stall
        if outcome != "Failed":
            in_place = self._in_place_failure(attempt, outcome)
            if in_place is not None:
                outcome, failure, draining = "Failed", in_place, False
        elif failure is not None and not draining and self._settling(failure):
            outcome = "Running" if status.running_since else "Starting"
        # While the previous attempt's pods drain, what happens to this attempt's pods
        # (none exist yet) cannot be a failure of it.
        if outcome == "Failed" and failure is not None and not draining:
            self._on_failure(failure, attempt)
            return
        if outcome == "Succeeded":
            self._succeed(state)
            return
        self._progress(state, outcome, attempt, draining, backing_off)

    def _summaries(self, state: GangState) -> None:
        status = self.status
        status.workers = state.total
        status.ready_workers = state.ready
        status.ready = f"{state.ready}/{state.total}"
        summaries = []
        ready_slices = 0
        for index in range(self.spec.num_slices):
            count = state.slices.get(index)
            body = self.slices.get(index) or {}
            slice_status = body.get("status") or {}
            total = count.total if count else self.shape.hosts
            ready = count.ready if count else 0
            ready_slices += int(ready == total and total > 0)
            summaries.append(
                SliceSummary(
                    index=index,
                    name=contract.slice_name(self.name, index),
                    phase=slice_status.get("phase", Phase.PENDING),
                    workers=total,
                    ready_workers=ready,
                    node_pool=(body.get("spec") or {}).get("nodePool"),
                )
            )
        status.slices = summaries
        status.slices_ready = f"{ready_slices}/{self.spec.num_slices}"

    def _rejected_template(self, attempt: int) -> str:
        """The apiserver's reason if a slice could not create this attempt's pods."""
        for body in self.slices.values():
            failure = (body.get("status") or {}).get("failure") or {}
            if (
                failure.get("reason") == Reason.INVALID_POD_TEMPLATE
                and failure.get("attempt") == attempt
            ):
                return str(failure.get("message", ""))
        return ""

    def _pods_allowed(self, attempt: int, state: GangState) -> None:
        """Once every pod the apiserver refused exists, PodsScheduled stops saying it
        refuses them (pods that then run to the end never pass through _progress)."""
        refused = (Reason.PODS_FORBIDDEN, Reason.POD_CREATION_FAILED)
        stale = any(
            c.get("type") == ConditionType.PODS_SCHEDULED and c.get("reason") in refused
            for c in self.conditions
        )
        if stale and self._refused_pods(attempt, state) is None:
            self._condition(ConditionType.PODS_SCHEDULED, True, Reason.SCHEDULED)

    def _refused_pods(self, attempt: int, state: GangState) -> tuple[Reason, str] | None:
        """Why a slice cannot create this attempt's pods (the apiserver refuses them and
        the slice retries), as its Ready condition says. None once every pod of the
        attempt exists: the slice's status that says so can reach this job after the pods
        themselves have run to the end."""
        if not state.to_create:
            return None
        retried = (Reason.PODS_FORBIDDEN, Reason.POD_CREATION_FAILED)
        for _, body in sorted(self.slices.items()):
            status = body.get("status") or {}
            if status.get("attempt") != attempt:
                continue
            for condition in status.get("conditions") or []:
                if (
                    condition.get("type") == ConditionType.READY
                    and condition.get("reason") in retried
                ):
                    return Reason(condition["reason"]), str(condition.get("message", ""))
        return None

    def _slice_refusal(self) -> SliceRefusal | None:
        """What the apiserver said when it last refused this job's TPUSlices."""
        refusal = self.ctx.refused_slices.get((self.namespace, self.name))
        return (
            refusal if refusal is not None and refusal.uid == self.body["metadata"]["uid"] else None
        )

    def _refused_slices(self) -> tuple[Reason, str] | None:
        """Why the job's TPUSlices cannot be written (retried until the cause is gone)."""
        refusal = self._slice_refusal()
        if refusal is None:
            return None
        return Reason.SLICE_CREATION_FAILED, (
            f"the apiserver refuses the job's TPUSlices, retrying every "
            f"{SLICE_RETRY_SECONDS:.0f} s until the cause is gone: {refusal.message}"
        )

    def _no_scheduler(self, state: GangState) -> tuple[Reason, str] | None:
        """Pods no scheduler has looked at for a while (``state/gang.scheduler_wait``)."""
        message, recheck = scheduler_wait(state.unseen, self.now)
        if recheck is not None:
            self._after(recheck)
        return (Reason.NO_SCHEDULER, message) if message else None

    def _deadline_exceeded(self) -> bool:
        deadline = self.spec.active_deadline_seconds
        started = parse(self.status.start_time)
        if deadline is None or started is None:
            return False
        remaining = started + dt.timedelta(seconds=deadline) - self.now
        if remaining.total_seconds() > 0:
            self._after(remaining.total_seconds())
            return False
        return True

    def _settling(self, failure: WorkerFailure) -> bool:
        """A worker that ended because a peer died (exit 75 or 134) was noticed first:
        give the peer's own failure a moment to be reported (a supervised pod's exit shows
        through a readiness probe, up to a period later), so the recorded cause is the
        first failure, not its echo."""
        if failure.exit_code not in FOLLOW_ON_EXIT_CODES or self.total_workers < 2:
            return False
        if not any(p.name == failure.pod and p.process_stopped for p in self.pods):
            return False  # a container's exit: the kubelet reports every one at once
        at = parse(failure.time)
        if at is None:
            return False
        wait = (at + dt.timedelta(seconds=CAUSE_SETTLE_SECONDS) - self.now).total_seconds()
        if wait <= 0:
            return False
        self._after(wait)
        return True

    def _in_place_failure(self, attempt: int, outcome: Outcome) -> WorkerFailure | None:
        """An in-place restart into ``attempt`` that cannot stop every process of the
        previous one, or that is not running within inPlaceTimeoutSeconds."""
        status = self.status
        if status.restart_kind != RestartKind.IN_PLACE or self.status.running_since:
            return None
        supervisors = self.ctx.supervisors
        fallback = (
            supervisors.fallback(self.body["metadata"]["uid"], attempt) if supervisors else None
        )
        if fallback is not None:
            return WorkerFailure(Reason.SUPERVISOR_UNREACHABLE, fallback, "", None, None, None)
        since = parse(status.in_place_since)
        if since is None or outcome == "Running":
            return None
        bound = dt.timedelta(seconds=self.policy.in_place_timeout_seconds)
        if self.now < since + bound:
            self._after((since + bound - self.now).total_seconds())
            return None
        return WorkerFailure(
            Reason.IN_PLACE_TIMEOUT,
            f"the in-place restart into attempt {attempt} did not have every worker "
            f"running within failurePolicy.inPlaceTimeoutSeconds "
            f"({self.policy.in_place_timeout_seconds})",
            "",
            None,
            None,
            None,
        )

    def _on_failure(self, failure: WorkerFailure, attempt: int) -> None:
        status = self.status
        decision = decide(
            failure,
            self.policy,
            status.counted_restarts,
            count_stalls=self.monitoring.count_stall_restarts,
        )
        failed_at = self.now
        if failure.reason == Reason.STALLED and self.track and self.track.advanced_at:
            # The attempt stopped being useful at its last step, not when that was noticed.
            failed_at = dt.datetime.fromtimestamp(self.track.advanced_at, dt.UTC)
        record = Failure(
            attempt=attempt,
            reason=failure.reason,
            message=failure.message,
            pod=failure.pod,
            node=failure.node,
            exit_code=failure.exit_code,
            counted=decision.counted,
            time=stamp(failed_at),
        )
        status.last_failure = record
        if not decision.restart:
            self._fail(decision.reason, decision.message, record)
            return
        self.account.close_attempt(self.total_workers)
        delay = book_restart(status, decision, self.policy)
        status.restart_at = stamp(self.now + dt.timedelta(seconds=delay)) if delay else None
        status.attempt = attempt + 1
        status.phase = Phase.RESTARTING
        kind, why = restart_kind(
            supervised=self.supervised,
            refused=self.supervision_refused,
            mode=self.policy.restart_mode,
            failure=failure,
            pods=[p for p in self.pods if p.attempt == attempt],
            workers=self.total_workers,
            not_ready_nodes=self.ctx.caches.not_ready_nodes(p.node for p in self.pods),
        )
        status.restart_kind = kind
        status.in_place_since = stamp(self.now) if kind == RestartKind.IN_PLACE else None
        status.in_place_restarts += int(kind == RestartKind.IN_PLACE)
        how = "in place" if kind == RestartKind.IN_PLACE else "by recreating the pods"
        budget = f"{status.counted_restarts} of {self.policy.max_restarts} counted restarts used"
        status.message = (
            f"restarting {how} ({why}) as attempt {attempt + 1} in {delay:.0f} s: "
            f"{decision.message}"
        )
        self._condition(ConditionType.RESTARTING, True, decision.reason, status.message)
        self._condition(ConditionType.RUNNING, False, Reason.RESTARTING)
        self._event("Warning", Reason.RESTARTING, f"{status.message} ({budget})")
        self.after_commit.append(
            lambda: self.ctx.metrics.restart(contract.JOB_KIND, decision.reason)
        )
        # Committed first, then the slices move to the next attempt (Act.RUN).
        if delay:
            self._after(delay)

    def _fail(self, reason: Reason, message: str, record: Failure | None) -> None:
        status = self.status
        self.act = Act.STOP
        self.account.close_attempt(self.total_workers)
        status.phase = Phase.FAILED
        status.message = message
        status.completion_time = stamp(self.now)
        status.restart_at = None
        status.node_pools = None
        if record is not None:
            status.last_failure = record
        self._condition(ConditionType.FAILED, True, reason, message)
        self._condition(ConditionType.RUNNING, False, reason)
        self._condition(ConditionType.RESTARTING, False, reason)
        self._event("Warning", Reason.FAILED, message)
        self._stopped()

    def _succeed(self, state: GangState) -> None:
        status = self.status
        self.act = Act.STOP
        self.account.close_attempt(self.total_workers)
        status.phase = Phase.SUCCEEDED
        policy = self.spec.success_policy
        status.message = (
            f"all {state.total} workers exited 0"
            if policy == "AllWorkers"
            else "worker 0 of slice 0 exited 0 (successPolicy LeaderWorker)"
        )
        status.completion_time = stamp(self.now)
        status.restart_at = None
        status.node_pools = None
        self._condition(ConditionType.SUCCEEDED, True, policy, status.message)
        self._condition(ConditionType.RUNNING, False, Reason.SUCCEEDED)
        self._condition(ConditionType.RESTARTING, False, Reason.SUCCEEDED)
        self._event("Normal", Reason.SUCCEEDED, status.message)
        self._stopped()

    def _progress(
        self, state: GangState, outcome: Outcome, attempt: int, draining: bool, backing_off: bool
    ) -> None:
        status = self.status
        if draining or backing_off:
            phase = Phase.RESTARTING
            status.message = (
                f"attempt {attempt}: waiting for {len(state.stale)} pods of the previous "
                "attempt to stop"
                if draining
                else f"attempt {attempt}: restart backoff until {status.restart_at}"
            )
            if draining and self._restarting_in_place():
                status.message = (
                    f"attempt {attempt}: restarting in place; the training processes of "
                    f"{len(state.stale)} pods are being stopped"
                )
        elif outcome == "Creating" and len(state.to_create) == state.total:
            phase = Phase.PENDING
            status.message = f"attempt {attempt}: creating {state.total} pods"
        elif outcome == "Starting" and status.running_since is not None:
            # Every worker of this attempt has run: a worker whose readiness probe fails
            # for a while (a long compilation or checkpoint on a busy host) does not send
            # the job back to Starting. Only a failure ends the attempt.
            phase = Phase.RUNNING
            status.message = (
                f"attempt {attempt}: all {state.total} workers running, "
                f"{state.ready + state.succeeded} ready or done"
            )
        elif outcome in ("Creating", "Starting"):
            phase = Phase.STARTING
            status.message = f"attempt {attempt}: {state.ready}/{state.total} workers ready"
        else:
            phase = Phase.RUNNING
            status.message = f"attempt {attempt}: all {state.total} workers running"
        if phase == Phase.RUNNING:
            status.in_place_since = None  # an in-place restart is over once running
        if phase == Phase.RUNNING and status.running_since is None:
            self.account.began_running(first_attempt=attempt == 1 and status.restarts == 0)
        if phase == Phase.RUNNING and self.previous_phase != Phase.RUNNING:
            self._event("Normal", Reason.RUNNING, status.message)
            if attempt == 1 and status.restarts == 0 and self.supervision_refused:
                self._event("Warning", Reason.IN_PLACE_REFUSED, self.supervision_refused)
            if attempt == 1 and status.restarts == 0:
                elapsed = (self.now - self.created).total_seconds()
                self.after_commit.append(lambda: self.ctx.metrics.time_to_running(elapsed))
        if phase != Phase.RESTARTING and status.restart_at is not None and not backing_off:
            status.restart_at = None
        status.phase = phase
        self._condition(ConditionType.RUNNING, phase == Phase.RUNNING, phase, status.message)
        self._condition(
            ConditionType.RESTARTING,
            phase == Phase.RESTARTING,
            Reason.RESTARTING if phase == Phase.RESTARTING else phase,
        )
        conflict = self.ctx.service_conflict(
            self.namespace, self.name, self.body["metadata"]["uid"]
        )
        if conflict:
            status.message = f"attempt {attempt}: {conflict}"
            if conflict not in (self.body.get("status") or {}).get("message", ""):
                self._event("Warning", Reason.SERVICE_CONFLICT, conflict)
        if state.unschedulable and self.provisioning:
            # Expected: the pods wait for the pools GKE creates for them.
            pod, why = state.unschedulable
            message = (
                f"waiting for GKE to create node pools: {'; '.join(self.provisioning)} "
                f"(pod {pod}: {why})"
            ) + "".join(f"; {gone}" for gone in self.pools_gone)
            status.message = f"attempt {attempt}: {message}"
            self._condition(
                ConditionType.PODS_SCHEDULED, False, Reason.WAITING_FOR_NODE_POOLS, message
            )
        elif state.unschedulable:
            pod, why = state.unschedulable
            message = f"pod {pod} cannot be scheduled: {why}"
            message += "".join(f"; {gone}" for gone in self.pools_gone)
            message += self._others_on_pools()
            status.message = f"attempt {attempt}: {message}"
            if not self._condition_is(ConditionType.PODS_SCHEDULED, False):
                self._event("Warning", Reason.UNSCHEDULABLE, message)
            self._condition(ConditionType.PODS_SCHEDULED, False, Reason.UNSCHEDULABLE, message)
        elif refused := (
            self._refused_pods(attempt, state)
            or self._refused_slices()
            or self._no_scheduler(state)
        ):
            reason, message = refused
            status.message = f"attempt {attempt}: {message}"
            if not any(
                c.get("type") == ConditionType.PODS_SCHEDULED and c.get("reason") == reason
                for c in self.conditions
            ):
                self._event("Warning", reason, message)
            self._condition(ConditionType.PODS_SCHEDULED, False, reason, message)
        elif phase in (Phase.STARTING, Phase.RUNNING):
            self._condition(ConditionType.PODS_SCHEDULED, True, Reason.SCHEDULED)
        if phase == Phase.RUNNING and self.supervised:
            self._disruption_notices(attempt)
        self.account.publish(phase, state.total)
        if self.track is not None and self.track.leader() is not None:
            self._stragglers()
            if not self._condition_is(ConditionType.STALLED, True):
                self._condition(ConditionType.STALLED, False, Reason.PROGRESSING)

    def _others_on_pools(self) -> str:
        """Pods with the operator's labels that are not its workers, on the job's pools
        (pinned to one or on one of its nodes): they compete for the chips like any pod,
        and may be why the workers do not schedule (``runtime/ownership.py``)."""
        pools = [p for p in self.status.node_pools or [] if not is_claim(p)]
        if not pools:
            return ""
        caches = self.ctx.caches
        nodes_by_pool: dict[str, list[str]] = {}
        for node in caches.tpu_nodes():
            if node.pool in pools:
                nodes_by_pool.setdefault(node.pool, []).append(node.name)
        found = [
            f"{p.namespace}/{p.name}" + (f" on node {p.node}" if p.node else f" pinned to {pool}")
            for pool in pools
            for p in caches.foreign_pods(pool, nodes_by_pool.get(pool, ()))
            if not p.terminal
        ]
        if not found:
            return ""
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        return f"; pods that are not this job's workers are on its node pools: {shown}"

    def _disruption_notices(self, attempt: int) -> None:
        """GKE's notices of maintenance or termination of the nodes of a running attempt:
        each new one asks the workers to checkpoint now, once (docs/api.md), as soon as
        they are training."""
        status = self.status
        if self.monitoring.enabled and (self.track is None or self.track.step is None):
            # Not training yet (importing, rendezvous, compiling): a request now would reach
            # processes that cannot take it. The notice is handled once steps are seen.
            return
        seen = set(status.disruption_notices)
        new: list[str] = []
        caches = self.ctx.caches
        # From the few noticed nodes to their pods, not from every pod of the job to its
        # node: this runs on each reconcile of a running job of up to 12,736 pods.
        for node, notice in sorted(caches.noticed_nodes().items()):
            key = f"node {node}: {notice}"
            if key in seen:
                continue
            if any(
                p.job_owned
                and p.attempt == attempt
                and p.namespace == self.namespace
                and p.job_name == self.name
                for p in caches.pods_on_node(node)
            ):
                seen.add(key)
                new.append(key)
        if not new:
            return
        status.disruption_notices = [*status.disruption_notices, *new][-MAX_NOTICES:]
        status.checkpoint_requests += 1
        self.checkpoint_for = new
        self._event(
            "Normal",
            Reason.CHECKPOINT_REQUESTED,
            f"asking the {self.total_workers} workers to checkpoint now: " + "; ".join(new),
        )

    # stalls and stragglers
    def _stall(self) -> WorkerFailure | None:
        track = self.track
        if track is None:
            return None
        stalled_for = track.stalled_for(self.now.timestamp())
        timeout = seconds(self.monitoring.stall_timeout)
        if stalled_for is None or stalled_for <= timeout:
            if track.step is not None:
                self._condition(
                    ConditionType.STALLED,
                    False,
                    Reason.PROGRESSING,
                    f"at step {int(track.step)}",
                )
            return None
        leader = track.leader()
        pod = leader.pod if leader else ""
        message = (
            f"no training step for {stalled_for:.0f} s (stallTimeout "
            f"{self.monitoring.stall_timeout}) at step {int(track.step or 0)}"
        )
        if not self._condition_is(ConditionType.STALLED, True):
            self._event("Warning", Reason.STALLED, message)
        self._condition(ConditionType.STALLED, True, Reason.STALLED, message)
        return WorkerFailure(
            Reason.STALLED, message, pod, leader.node if leader else None, None, None
        )

    def _stragglers(self) -> None:
        assert self.track is not None
        found = self.track.stragglers(self.monitoring.straggler_threshold)
        if not found:
            self._condition(ConditionType.STRAGGLER, False, Reason.NO_STRAGGLER)
            return
        message = "; ".join(s.describe() for s in found)
        if not self._condition_is(ConditionType.STRAGGLER, True):
            self._event("Warning", Reason.STRAGGLER, message)
        self._condition(ConditionType.STRAGGLER, True, Reason.STRAGGLER, message)

    # acts
    def _restarting_in_place(self) -> bool:
        """The committed attempt comes up in place and is not running yet."""
        status = self.status
        return (
            status.restart_kind == RestartKind.IN_PLACE
            and status.in_place_since is not None
            and status.running_since is None
            and status.phase in (Phase.RESTARTING, Phase.STARTING, Phase.PENDING)
        )

    async def _restart_in_place(self, attempt: int) -> None:
        """Stop and move every pod of the previous attempt, then start this one (each
        pass idempotent; reconcile/supervisors.py)."""
        supervisors = self.ctx.supervisors
        if supervisors is None:
            return
        restart_at = parse(self.status.restart_at)
        template_spec = (self.raw_spec.get("template") or {}).get("spec") or {}
        done = await supervisors.restart_in_place(
            job_uid=self.body["metadata"]["uid"],
            namespace=self.namespace,
            pods=self.pods,
            attempt=attempt,
            grace_seconds=stop_grace(template_spec),
            may_start=restart_at is None or self.now >= restart_at,
        )
        if not done:
            self._after(IN_PLACE_RECHECK_SECONDS)

    async def _ensure_control_key(self) -> tuple[str, str] | None:
        """The job's control-key Secret and the key's id (created once; the key derives
        from the job's UID, so the Secret is never read back).

        Its name carries the key's id, which only the operator can compute, and it is
        created before any slice names it: nobody can have made it first. A 409 is this
        operator's own earlier create (another replica, or before a restart); and should
        someone delete the Secret and make another of that name, its key cannot have the
        id the pods carry, and their supervisors refuse to use it."""
        supervisors = self.ctx.supervisors
        if supervisors is None:
            return None
        key = supervisors.channel.key_for(self.body["metadata"]["uid"])
        key_id = supervision.key_id(key)
        name = key_secret_name(self.name, key_id)
        if (self.namespace, name) in self.ctx.control_keys:
            return name, key_id
        secret = key_secret(
            name=name,
            namespace=self.namespace,
            job_name=self.name,
            owner=self._owner().reference(),
            key=key,
        )
        await self.ctx.kube.create(namespaced(self.namespace, "secrets"), secret)
        self.ctx.control_keys.add((self.namespace, name))
        return name, key_id

    async def _run_children(self, attempt: int) -> None:
        ports = self.spec.ports
        service = headless_service(
            name=self.name,
            namespace=self.namespace,
            selector={contract.LABEL_JOB_NAME: self.name},
            owner=self._owner(),
            ports=Ports(ports.coordinator, ports.megascale, ports.metrics) if ports else Ports(),
        )
        await self.ctx.ensure_service(self.namespace, service)
        control = await self._ensure_control_key() if self.supervised else None
        secret, key_id = control if control is not None else (None, None)
        in_place_from = attempt - 1 if self._restarting_in_place() else None
        pools = self.status.node_pools or []
        # All slices at once, not one after the other: each slice's pods are created as
        # soon as the slice is, and one slice POST at a time would wait behind the pods
        # of the slices before it in the client's queue, leaving it idle between slices.
        writes: list[Awaitable[Any]] = []
        for index in range(self.spec.num_slices):
            desired = job_slice(
                job_name=self.name,
                namespace=self.namespace,
                job_spec=self.raw_spec,
                index=index,
                attempt=attempt,
                owner=self._owner(),
                node_pool=pools[index] if index < len(pools) else None,
                not_before=self.status.restart_at,
                suspend=False,
                extra_labels=self._extra_labels(),
                in_place_from=in_place_from,
                control_key_secret=secret,
                control_key_id=key_id,
            )
            current = self.slices.get(index)
            if current is None:
                writes.append(self.ctx.kube.create(_slices_path(self.namespace), desired))
                continue
            patch = slice_patch(desired, current)
            if patch:
                path = _slices_path(self.namespace, desired["metadata"]["name"])
                writes.append(self.ctx.kube.merge_patch(path, patch))
        key = (self.namespace, self.name)
        try:
            await send_all(writes)
        except ApiError as exc:
            if exc.status == 429 or exc.status >= 500 or exc.not_found:
                raise  # the apiserver's own trouble, or a slice just deleted: back off
            # Its next status says why (the status was committed before this act).
            invalid = exc.invalid and " is forbidden: " not in exc.message
            self.ctx.refused_slices[key] = SliceRefusal(
                self.body["metadata"]["uid"], invalid, exc.message
            )
            log.warning("%s: the apiserver refused its TPUSlices: %s", self.holder, exc.message)
            self._after(MIN_REQUEUE_SECONDS if invalid else SLICE_RETRY_SECONDS)
            return
        self.ctx.refused_slices.pop(key, None)

    async def _stop_children(self) -> None:
        await send_all(
            self._suspend_slice(body["metadata"]["name"])
            for body in self.slices.values()
            if not (body.get("spec") or {}).get("suspend")
        )

    async def _suspend_slice(self, slice_name: str) -> None:
        try:
            await self.ctx.kube.merge_patch(
                _slices_path(self.namespace, slice_name), {"spec": {"suspend": True}}
            )
        except ApiError as exc:
            if not exc.not_found:
                raise
