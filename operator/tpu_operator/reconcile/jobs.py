"""TPUJob reconciler: slices, Service, node pools, gang restarts, status and events.

The job owns the attempt number. It starts an attempt by assigning node pools (all or
nothing) and writing the attempt into its status, then creates or updates one TPUSlice
per slice with that attempt; the slices create the pods. It assesses the attempt over all
pods of all slices; when a worker fails, the failure policy decides, the decision is
committed to the job's status first (guarded by resourceVersion, so a decision is never
made twice from stale data), and only then are the slices moved to the next attempt
(whose pods wait until every pod of the old attempt is gone).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from tpu_operator import contract
from tpu_operator.api.common import Failure
from tpu_operator.api.job import SliceSummary, TPUJobSpec, TPUJobStatus
from tpu_operator.api.monitoring import Monitoring, seconds
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.status import TERMINAL_PHASES, ResolvedShape
from tpu_operator.builders.pods import Owner
from tpu_operator.builders.service import headless_service
from tpu_operator.builders.slices import job_slice, slice_patch
from tpu_operator.builders.wiring import Ports
from tpu_operator.catalog import CatalogError, SliceShape
from tpu_operator.decisions import REASON_STALLED, backoff_seconds, decide
from tpu_operator.placement.pools import Request, allocate, pools_from_nodes
from tpu_operator.progress import report
from tpu_operator.reconcile.conditions import parse, set_condition, stamp
from tpu_operator.reconcile.context import Context, job_ref, mark_invalid, write_status
from tpu_operator.reconcile.slices import (
    INVALID_POD_TEMPLATE,
    held_pools,
    members_of,
    resolved_shape,
)
from tpu_operator.runtime.kube import ApiError, namespaced
from tpu_operator.state.gang import GangState, WorkerFailure, assess

log = logging.getLogger(__name__)
POOL_RETRY_SECONDS = 15.0


def _slices_path(namespace: str, name: str | None = None) -> str:
    return namespaced(
        namespace, contract.SLICE_PLURAL, name, group=contract.GROUP, version=contract.VERSION
    )


class JobReconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def __call__(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        body = self.ctx.caches.job(namespace, name)
        if body is None:
            self.ctx.reservations.release(f"{namespace}/{name}")
            return None
        if body["metadata"].get("deletionTimestamp"):
            return None
        try:
            spec = TPUJobSpec.model_validate(body.get("spec") or {})
            shape = spec.slice.resolve()
        except (ValidationError, CatalogError) as exc:
            await mark_invalid(self.ctx, body, contract.JOB_PLURAL, exc)
            return None
        return await JobRun(self.ctx, body, spec, shape).reconcile()


class JobRun:
    """One reconcile of one job."""

    def __init__(
        self, ctx: Context, body: dict[str, Any], spec: TPUJobSpec, shape: SliceShape
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.raw_spec: dict[str, Any] = body.get("spec") or {}
        self.spec = spec
        self.shape = shape
        meta = body["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.generation = meta.get("generation")
        self.status = TPUJobStatus.model_validate(body.get("status") or {})
        self.previous_phase = self.status.phase
        self.policy = spec.failure_policy or FailurePolicy()
        self.now = ctx.clock()
        self.requeue: float | None = None
        self.slices = {
            int((s.get("spec") or {}).get("sliceIndex", 0)): s
            for s in ctx.caches.slices_of_job(self.namespace, self.name)
        }
        self.pods = ctx.caches.pods_of_job(self.namespace, self.name)
        self.conditions = [c.wire() for c in self.status.conditions]
        self.pending_events: list[tuple[str, str, str]] = []
        self.after_commit: list[Callable[[], None]] = []
        self.monitoring = spec.monitoring or Monitoring()
        sampler = ctx.progress
        self.track = (
            sampler.track(self.namespace, self.name)
            if sampler is not None and self.monitoring.enabled
            else None
        )
        if self.track is not None and self.track.attempt != self.status.attempt:
            self.track = None
        self.created = parse(meta.get("creationTimestamp")) or self.now

    # helpers
    @property
    def holder(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _after(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def _condition(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.conditions = set_condition(
            self.conditions,
            type_,
            status,
            reason,
            message,
            at=self.now,
            generation=self.generation,
        )

    def _event(self, type_: str, reason: str, message: str) -> None:
        self.pending_events.append((type_, reason, message))

    def _owner(self) -> Owner:
        return Owner(
            contract.API_VERSION, contract.JOB_KIND, self.name, self.body["metadata"]["uid"]
        )

    def _extra_labels(self) -> dict[str, str]:
        labels = self.body["metadata"].get("labels") or {}
        queue = labels.get(contract.LABEL_KUEUE_QUEUE)
        return {contract.LABEL_KUEUE_QUEUE: queue} if queue else {}

    async def _commit(self) -> bool:
        """Write the status; on success post the events of this reconcile."""
        status = self.status
        status.observed_generation = self.generation
        status.shape = ResolvedShape.model_validate(resolved_shape(self.shape))
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

    # the reconcile
    async def reconcile(self) -> float | None:
        status = self.status
        attempt = max(
            [status.attempt]
            + [int((s.get("spec") or {}).get("attempt", 0)) for s in self.slices.values()]
        )
        if status.phase in TERMINAL_PHASES:
            await self._finished()
            return self.requeue
        if self.spec.suspend:
            await self._suspend()
            return self.requeue
        if attempt == 0 or status.phase == "Suspended":
            attempt = await self._start(attempt)
            if attempt is None:
                return self.requeue
        await self._ensure_children(attempt)
        await self._assess(attempt)
        return self.requeue

    async def _finished(self) -> None:
        await self._patch_slices({"suspend": True}, only_if=lambda s: not s.get("suspend"))
        self.ctx.reservations.release(self.holder)
        ttl = self.spec.ttl_seconds_after_finished
        finished = parse(self.status.completion_time)
        if ttl is None or finished is None:
            return
        due = finished + dt.timedelta(seconds=ttl)
        if self.now < due:
            self._after((due - self.now).total_seconds())
            return
        log.info("deleting %s: finished %s s ago (ttlSecondsAfterFinished)", self.holder, ttl)
        path = namespaced(
            self.namespace,
            contract.JOB_PLURAL,
            self.name,
            group=contract.GROUP,
            version=contract.VERSION,
        )
        await self.ctx.kube.delete(path, propagation="Background")

    async def _suspend(self) -> None:
        status = self.status
        if status.phase != "Suspended":
            self._event("Normal", "Suspended", "suspended: deleting the workers' pods")
        status.phase = "Suspended"
        status.node_pools = None
        status.restart_at = None
        active = [p for p in self.pods if p.active]
        status.message = f"suspended; {len(active)} pods still stopping" if active else "suspended"
        status.ready_workers = 0
        status.ready = f"0/{self.spec.num_slices * self.shape.hosts}"
        self._condition("Suspended", True, "Suspended", "spec.suspend is true")
        self._condition("Running", False, "Suspended")
        if not await self._commit():
            self._after(0.2)
            return
        self.ctx.reservations.release(self.holder)
        await self._patch_slices({"suspend": True}, only_if=lambda s: not s.get("suspend"))

    async def _start(self, attempt: int) -> int | None:
        """Begin the next attempt (first run or resume); None while waiting for pools."""
        status = self.status
        resuming = status.phase == "Suspended"
        if self.shape.multi_host and not status.node_pools:
            pools = self._allocate()
            if pools is None:
                if not await self._commit():
                    self._after(0.2)
                return None
            status.node_pools = pools
            mapping = ", ".join(f"slice {i} -> {p}" for i, p in enumerate(pools))
            self._event("Normal", "NodePoolsAssigned", mapping)
        attempt += 1
        status.attempt = attempt
        status.phase = "Pending"
        status.message = f"attempt {attempt}: creating slices"
        if status.start_time is None or resuming:
            status.start_time = stamp(self.now)
        status.restart_at = None
        if resuming:
            self._event("Normal", "Resumed", f"resumed as attempt {attempt}")
        self._condition("Suspended", False, "Resumed" if resuming else "NotSuspended")
        if not await self._commit():
            self.ctx.reservations.release(self.holder)
            self._after(0.2)
            return None
        return attempt

    def _allocate(self) -> list[str] | None:
        placement = self.spec.placement
        pins = placement.node_pools if placement and placement.node_pools else None
        requests = [
            Request(
                self.shape,
                spot=placement.spot if placement else None,
                reservation=placement.reservation if placement else None,
                pinned=pins[i] if pins else None,
            )
            for i in range(self.spec.num_slices)
        ]
        allocation = allocate(
            requests,
            pools_from_nodes(self.ctx.caches.tpu_nodes()),
            held_pools(self.ctx, exclude=self.holder),
        )
        if allocation.pools is None:
            if self.status.message != allocation.message:
                self._event("Normal", "WaitingForNodePools", allocation.message)
            self.status.phase = "Pending"
            self.status.message = allocation.message
            self._condition("PodsScheduled", False, "WaitingForNodePools", allocation.message)
            self._after(POOL_RETRY_SECONDS)
            return None
        self.ctx.reservations.reserve(self.holder, allocation.pools)
        return allocation.pools

    async def _ensure_children(self, attempt: int) -> None:
        ports = self.spec.ports
        service = headless_service(
            name=self.name,
            namespace=self.namespace,
            selector={contract.LABEL_JOB_NAME: self.name},
            owner=self._owner(),
            ports=Ports(ports.coordinator, ports.megascale, ports.metrics) if ports else Ports(),
        )
        await self.ctx.ensure_service(self.namespace, service)
        pools = self.status.node_pools or []
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
            )
            current = self.slices.get(index)
            if current is None:
                await self.ctx.kube.create(_slices_path(self.namespace), desired)
                continue
            patch = slice_patch(desired, current)
            if patch:
                await self.ctx.kube.merge_patch(
                    _slices_path(self.namespace, desired["metadata"]["name"]), patch
                )

    async def _patch_slices(self, fields: dict[str, Any], only_if=lambda spec: True) -> None:
        for body in self.slices.values():
            spec = body.get("spec") or {}
            if only_if(spec):
                try:
                    await self.ctx.kube.merge_patch(
                        _slices_path(self.namespace, body["metadata"]["name"]), {"spec": fields}
                    )
                except ApiError as exc:
                    if not exc.not_found:
                        raise

    async def _assess(self, attempt: int) -> None:
        status = self.status
        hosts = self.shape.hosts
        members = [
            m
            for i in range(self.spec.num_slices)
            for m in members_of(contract.slice_name(self.name, i), i, hosts)
        ]
        created = frozenset(
            i
            for i, s in self.slices.items()
            if int((s.get("spec") or {}).get("attempt", 0)) == attempt
            and int((s.get("status") or {}).get("createdAttempt", 0)) >= attempt
        )
        tombstones: dict[str, Any] = {}
        for i in range(self.spec.num_slices):
            tombstones.update(
                self.ctx.caches.tombstones.of_slice(
                    self.namespace, contract.slice_name(self.name, i), attempt
                )
            )
        state = assess(
            attempt=attempt,
            members=members,
            pods=self.pods,
            created_slices=created,
            tombstones=tombstones,
            not_ready_nodes=self.ctx.caches.not_ready_nodes(p.node for p in self.pods),
            success_policy=self.spec.success_policy,
        )
        self._summaries(state)
        draining = bool(state.stale)
        restart_at = parse(status.restart_at)
        backing_off = restart_at is not None and self.now < restart_at
        if backing_off and restart_at is not None:
            self._after((restart_at - self.now).total_seconds())

        rejected = self._rejected_template(attempt)
        if rejected:
            await self._fail(INVALID_POD_TEMPLATE, rejected, None)
            return
        if self._deadline_exceeded():
            await self._fail(
                "DeadlineExceeded",
                f"the job was active longer than activeDeadlineSeconds "
                f"({self.spec.active_deadline_seconds})",
                None,
            )
            return
        if not draining and state.outcome in ("Starting", "Running"):
            stall = self._stall(state)
            if stall is not None and self.monitoring.stall_action == "Restart":
                state.outcome, state.failure = "Failed", stall
        if state.outcome == "Failed" and state.failure is not None and not draining:
            await self._on_failure(state, attempt)
            return
        if state.outcome == "Succeeded":
            await self._succeed(state)
            return
        self._progress(state, attempt, draining, backing_off)
        if not await self._commit():
            self._after(0.2)

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
                    phase=slice_status.get("phase", "Pending"),
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
            if failure.get("reason") == INVALID_POD_TEMPLATE and failure.get("attempt") == attempt:
                return str(failure.get("message", ""))
        return ""

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

    async def _on_failure(self, state: GangState, attempt: int) -> None:
        failure = state.failure
        assert failure is not None
        status = self.status
        decision = decide(
            failure,
            self.policy,
            status.counted_restarts,
            count_stalls=self.monitoring.count_stall_restarts,
        )
        failed_at = self.now
        if failure.reason == REASON_STALLED and self.track and self.track.advanced_at:
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
            await self._fail(decision.reason, decision.message, record)
            return
        self._close_attempt()
        status.restarts += 1
        status.counted_restarts += int(decision.counted)
        status.restarts_by_reason[decision.reason] = (
            status.restarts_by_reason.get(decision.reason, 0) + 1
        )
        delay = backoff_seconds(self.policy, status.restarts)
        status.restart_at = stamp(self.now + dt.timedelta(seconds=delay)) if delay else None
        status.attempt = attempt + 1
        status.phase = "Restarting"
        budget = f"{status.counted_restarts} of {self.policy.max_restarts} counted restarts used"
        status.message = f"restarting as attempt {attempt + 1} in {delay:.0f} s: {decision.message}"
        self._condition("Restarting", True, decision.reason, status.message)
        self._condition("Running", False, "Restarting")
        self._event("Warning", "Restarting", f"{status.message} ({budget})")
        self.after_commit.append(
            lambda: self.ctx.metrics.restart(contract.JOB_KIND, decision.reason)
        )
        if not await self._commit():
            self._after(0.2)
            return
        await self._patch_slices(
            {"attempt": attempt + 1, "notBefore": status.restart_at},
        )
        if delay:
            self._after(delay)

    async def _fail(self, reason: str, message: str, record: Failure | None) -> None:
        status = self.status
        self._close_attempt()
        status.phase = "Failed"
        status.message = message
        status.completion_time = stamp(self.now)
        status.restart_at = None
        status.node_pools = None
        if record is not None:
            status.last_failure = record
        self._condition("Failed", True, reason, message)
        self._condition("Running", False, reason)
        self._condition("Restarting", False, reason)
        self._event("Warning", "Failed", message)
        if not await self._commit():
            self._after(0.2)
            return
        self.ctx.reservations.release(self.holder)
        await self._patch_slices({"suspend": True}, only_if=lambda s: not s.get("suspend"))

    async def _succeed(self, state: GangState) -> None:
        status = self.status
        self._close_attempt()
        status.phase = "Succeeded"
        policy = self.spec.success_policy
        status.message = (
            f"all {state.total} workers exited 0"
            if policy == "AllWorkers"
            else "worker 0 of slice 0 exited 0 (successPolicy LeaderWorker)"
        )
        status.completion_time = stamp(self.now)
        status.restart_at = None
        status.node_pools = None
        self._condition("Succeeded", True, policy, status.message)
        self._condition("Running", False, "Succeeded")
        self._condition("Restarting", False, "Succeeded")
        self._event("Normal", "Succeeded", status.message)
        if not await self._commit():
            self._after(0.2)
            return
        self.ctx.reservations.release(self.holder)
        await self._patch_slices({"suspend": True}, only_if=lambda s: not s.get("suspend"))

    def _progress(self, state: GangState, attempt: int, draining: bool, backing_off: bool):
        status = self.status
        if draining or backing_off:
            phase = "Restarting"
            status.message = (
                f"attempt {attempt}: waiting for {len(state.stale)} pods of the previous "
                "attempt to stop"
                if draining
                else f"attempt {attempt}: restart backoff until {status.restart_at}"
            )
        elif state.outcome == "Creating" and len(state.to_create) == state.total:
            phase = "Pending"
            status.message = f"attempt {attempt}: creating {state.total} pods"
        elif state.outcome in ("Creating", "Starting"):
            phase = "Starting"
            status.message = f"attempt {attempt}: {state.ready}/{state.total} workers ready"
        else:
            phase = "Running"
            status.message = f"attempt {attempt}: all {state.total} workers running"
        if phase == "Running" and status.running_since is None:
            self._began_running(attempt)
        if phase == "Running" and self.previous_phase != "Running":
            self._event("Normal", "Running", status.message)
            if attempt == 1 and status.restarts == 0:
                elapsed = (self.now - self.created).total_seconds()
                self.after_commit.append(lambda: self.ctx.metrics.time_to_running(elapsed))
        if phase != "Restarting" and status.restart_at is not None and not backing_off:
            status.restart_at = None
        status.phase = phase  # type: ignore[assignment]
        self._condition("Running", phase == "Running", phase, status.message)
        self._condition(
            "Restarting", phase == "Restarting", "Restarting" if phase == "Restarting" else phase
        )
        if state.unschedulable:
            pod, why = state.unschedulable
            message = f"pod {pod} cannot be scheduled: {why}"
            if status.message != message:
                status.message = f"attempt {attempt}: {message}"
            if self._condition_changed("PodsScheduled", False):
                self._event("Warning", "Unschedulable", message)
            self._condition("PodsScheduled", False, "Unschedulable", message)
        elif phase in ("Starting", "Running"):
            self._condition("PodsScheduled", True, "Scheduled")
        self._publish_progress(phase, state)

    def _condition_changed(self, type_: str, value: bool) -> bool:
        wanted = "True" if value else "False"
        return not any(
            c.get("type") == type_ and c.get("status") == wanted for c in self.conditions
        )

    # progress, stalls, stragglers, goodput
    def _carried(self) -> dict[str, float]:
        return dict(self.status.goodput.finished_attempts) if self.status.goodput else {}

    def _set_goodput(
        self,
        carried: dict[str, float],
        waiting: tuple[float, str] | None,
        *,
        current_attempt: bool = True,
    ) -> None:
        leader = self.track.leader() if self.track and current_attempt else None
        self.status.goodput = report.goodput(
            created=self.created.timestamp(),
            now=self.now.timestamp(),
            carried=carried,
            current=leader.latest if leader else None,
            waiting_since=waiting[0] if waiting else None,
            waiting_kind=waiting[1] if waiting else "other",
        )

    def _close_attempt(self) -> None:
        """An attempt ended: its last progress into status, its time into goodput."""
        leader = self.track.leader() if self.track else None
        if self.track is not None and leader is not None:
            self.status.progress = report.progress(
                self.track, self.spec.num_slices * self.shape.hosts
            )
        carried = report.carry_over(self._carried(), leader.latest if leader else None)
        self.status.running_since = None
        self._set_goodput(carried, None, current_attempt=False)

    def _began_running(self, attempt: int) -> None:
        status = self.status
        status.running_since = stamp(self.now)
        carried = self._carried()
        failed_at = parse(status.last_failure.time) if status.last_failure else None
        if attempt == 1 and status.restarts == 0:
            carried["scheduling"] = (self.now - self.created).total_seconds()
        elif failed_at is not None:
            carried["restartDowntime"] = (
                carried.get("restartDowntime", 0.0) + (self.now - failed_at).total_seconds()
            )
        self._set_goodput(carried, None)

    def _waiting(self) -> tuple[float, str] | None:
        """An ongoing scheduling wait or restart downtime, not yet carried."""
        status = self.status
        if status.running_since is not None:
            return None
        if status.restarts == 0:
            return self.created.timestamp(), "scheduling"
        failed_at = parse(status.last_failure.time) if status.last_failure else None
        return (failed_at.timestamp(), "restartDowntime") if failed_at else None

    def _publish_progress(self, phase: str, state: GangState) -> None:
        track, status = self.track, self.status
        if track is None or track.leader() is None:
            if status.goodput is None or phase != "Running":
                self._set_goodput(self._carried(), self._waiting())
            return
        carried = report.account_resume(self._carried(), track.resumed_from)
        sampler = self.ctx.progress
        interval = sampler.publish_interval if sampler is not None else 30.0
        published = parse(status.progress.sampled_time) if status.progress else None
        fresh = report.progress(track, state.total)
        due = (
            published is None
            or (self.now - published).total_seconds() >= interval
            or (status.progress.step is None and fresh.step is not None)
        )
        if due or carried != self._carried():
            status.progress = fresh
            self._set_goodput(carried, self._waiting())
        self._stragglers()
        if not any(
            c.get("type") == "Stalled" and c.get("status") == "True" for c in self.conditions
        ):
            self._condition("Stalled", False, "Progressing")

    def _stall(self, state: GangState) -> WorkerFailure | None:
        track = self.track
        if track is None:
            return None
        stalled_for = track.stalled_for(self.now.timestamp())
        timeout = seconds(self.monitoring.stall_timeout)
        if stalled_for is None or stalled_for <= timeout:
            if track.step is not None:
                self._condition("Stalled", False, "Progressing", f"at step {int(track.step)}")
            return None
        leader = track.leader()
        pod = leader.pod if leader else ""
        message = (
            f"no training step for {stalled_for:.0f} s (stallTimeout "
            f"{self.monitoring.stall_timeout}) at step {int(track.step or 0)}"
        )
        if self._condition_changed("Stalled", True):
            self._event("Warning", "Stalled", message)
        self._condition("Stalled", True, REASON_STALLED, message)
        return WorkerFailure(
            REASON_STALLED, message, pod, leader.node if leader else None, None, None
        )

    def _stragglers(self) -> None:
        assert self.track is not None
        found = self.track.stragglers(self.monitoring.straggler_threshold)
        if not found:
            self._condition("Straggler", False, "NoStraggler")
            return
        message = "; ".join(s.describe() for s in found)
        if self._condition_changed("Straggler", True):
            self._event("Warning", "Straggler", message)
        self._condition("Straggler", True, "Straggler", message)
