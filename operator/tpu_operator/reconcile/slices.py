"""TPUSlice reconciler: one pod per host for the slice's current attempt, and its status.

One reconcile (``SliceRun.reconcile``) observes the slice's pods in the watch caches,
decides its status (its phase and message by the pure ladder of
``policies/slice_phase.py``), writes it (once, guarded by the resourceVersion that was
read), and only then acts on the pods, as the job does: a write that loses to a
concurrent change (409) acts on nothing. What the act meets (pods the apiserver refuses,
a Service that belongs to another object) is said by the next status, which it asks for
at once. So with the capacity the pods consume (``slice_capacity.py``): the
ProvisioningRequest of queued provisioning and the GKE Slice of dynamic slicing are read
while observing, and what the status says of them decided there; they are made,
withdrawn or deleted only after the write.

Rules, applied on every reconcile from the watch caches (level-triggered):

1. Pods of any other attempt are deleted. Pods the job carries into the current attempt
   in place (created for an attempt from ``spec.inPlaceFrom`` on) belong to it: the job
   stops their processes and starts the current attempt's in them.
2. Pods of the current attempt are created only when no pod of an older attempt is left
   anywhere in the gang (every slice of the job, for a job-owned slice), and not before
   the restart backoff ends: no straggler of attempt N ever meets attempt N+1. Pods
   carried in place count as the current attempt's; while the job restarts in place
   (``spec.awaitStart``) the new pods' supervisors start nothing until the job's start
   command, which comes once every carried process stopped.
3. A pod of the current attempt is created once. A pod that disappears after all pods of
   the attempt were seen ends the attempt (it is not silently replaced).
4. A suspended slice (or one whose job is suspended or finished) deletes its running
   pods and creates none.
5. A standalone slice is its own job of one slice, under the job's rules
   (``policies/standalone.py``): the attempt it runs (``start.resumes``), its restarts
   under its failurePolicy (``failure.book``), and its end (a finished slice stops its
   pods and stays as it ended, ``lifetime.finished``); it allocates its own pool and
   makes its own Service. A job-owned slice only reports, and its TPUJob decides. Each
   difference between the two is a method of the slice's role (``slice_roles.py``:
   ``OwnedSlice``, ``StandaloneSlice``), chosen once when the ``SliceRun`` is built; the
   reconcile itself branches on the kind nowhere.
6. A job-owned slice whose TPUJob is gone or being deleted (or is another job of the same
   name: owner references are compared by UID) does nothing: the garbage collector
   removes it and its pods, and a deleted job starts nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from tpu_operator import contract
from tpu_operator.api.conditions import parse, stamp
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceSpec, TPUSliceStatus
from tpu_operator.api.status import TERMINAL_PHASES, ConditionType, Phase, Reason, ResolvedShape
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.supervision import Supervision
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.catalog import CatalogError
from tpu_operator.placement.capacity import (
    CapacityMode,
)
from tpu_operator.placement.provisioning import is_claim
from tpu_operator.policies import slice_phase
from tpu_operator.policies.plan import MIN_REQUEUE_SECONDS
from tpu_operator.policies.slice_phase import PodRefusal
from tpu_operator.reconcile.context import (
    RETRY_AFTER_CONFLICT,
    Context,
    mark_invalid,
    slice_ref,
    write_status,
)
from tpu_operator.reconcile.pools import (
    claim_toleration_value,
    slice_holder,
)
from tpu_operator.reconcile.slice_capacity import SliceCapacity, release_dynamic_slices
from tpu_operator.reconcile.slice_roles import SliceRole, ports_of, role_of
from tpu_operator.runtime.caches import slice_sharing
from tpu_operator.runtime.kube import ApiError, namespaced, send_all
from tpu_operator.state.gang import (
    GangState,
    Member,
    WorkerFailure,
    assess,
    members_of,
    nodes_of,
    stopping_count,
)
from tpu_operator.state.views import PodView, carried_attempt

log = logging.getLogger(__name__)

STUCK_GRACE = dt.timedelta(seconds=15)
"""How long past its deletion deadline a pod on a lost node may linger before it is
force-deleted (its kubelet is gone and will never confirm)."""
BARRIER_RECHECK_SECONDS = 5.0
"""Safety net while pods of an older attempt drain: the slice is also woken by their
deletion events."""
FORBIDDEN_RETRY_SECONDS = 30.0
"""Retry after the apiserver refused the pods as forbidden (quota, admission policy):
the cause is outside the operator and may be lifted at any time."""
BUILD_ERRORS = (TypeError, AttributeError, ValueError, KeyError, IndexError, OverflowError)
"""What building a pod from a template the models accepted must never raise; if it does,
the slice fails with InvalidPodTemplate rather than retrying a traceback."""


class TemplateBuildError(Exception):
    """The worker pod could not be built from the slice's template."""


def refusal_reason(error: ApiError) -> Reason:
    """What the apiserver's refusal of a worker pod means.

    ``PodsForbidden``: an admission plugin or policy refused it (403, or a
    ValidatingAdmissionPolicy's 422 ``... is forbidden: ...``): a missing ServiceAccount
    or PriorityClass, a quota, Pod Security. The cause is outside the spec and may go, so
    the slice retries. ``InvalidPodTemplate``: the pod itself is invalid (400, 422): the
    job cannot run with its template. ``PodCreationFailed``: anything else the apiserver
    answered (an admission webhook it cannot reach, throttling): retried too.
    """
    if error.status == 403 or " is forbidden: " in error.message:
        return Reason.PODS_FORBIDDEN
    if error.invalid:
        return Reason.INVALID_POD_TEMPLATE
    return Reason.POD_CREATION_FAILED


class SliceReconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def __call__(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        ctx = self.ctx
        body = ctx.caches.slice(namespace, name)
        if body is None:
            ctx.caches.tombstones.forget_slice(namespace, name)
            ctx.created_pods.forget(key)
            ctx.refused_pods.pop(key, None)
            ctx.refused_dynamic_slices.pop(key, None)
            ctx.reservations.release(slice_holder(namespace, name))
            return await release_dynamic_slices(ctx, namespace, name)
        if body["metadata"].get("deletionTimestamp"):
            return None
        try:
            spec = TPUSliceSpec.model_validate(body.get("spec") or {})
            shape = spec.resolve()
        except (ValidationError, CatalogError) as exc:
            await mark_invalid(self.ctx, body, contract.SLICE_PLURAL, exc)
            return None
        role = role_of(ctx, body, spec, shape)
        if role is None:  # its job is gone or being deleted
            return None
        return await SliceRun(ctx, body, spec, role).reconcile()


class SliceRun:
    """One reconcile of one slice."""

    def __init__(
        self, ctx: Context, body: dict[str, Any], spec: TPUSliceSpec, role: SliceRole
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.spec = spec
        self.shape = role.shape
        self.role = role
        """What differs between a job's slice and a standalone one (``slice_roles.py``)."""
        self.namespace = self.role.namespace
        self.name = self.role.name
        self.status = TPUSliceStatus.model_validate(body.get("status") or {})
        self.now = ctx.clock()
        self.requeue: float | None = None
        self.create_reason: Reason | None = None
        """Why the last try could not create pods it should have (then retried)."""
        self.after_commit: list[Callable[[], None]] = []
        self.pool_wait = ""
        """Why the slice has no node pool yet ("": it has one, or needs none)."""
        self.capacity = SliceCapacity(ctx, body, spec, role, self.status, self._after)
        """Its ProvisioningRequest and GKE Slices (``slice_capacity.py``)."""

    def _after(self, seconds: float) -> None:
        seconds = max(seconds, MIN_REQUEUE_SECONDS)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    @property
    def holder(self) -> str:
        return slice_holder(self.namespace, self.name)

    async def reconcile(self) -> float | None:
        """Observe, decide the status, commit it, then act on the pods (as the job does):
        a status write that loses to a concurrent change (409) acts on nothing."""
        ctx, spec, status, role = self.ctx, self.spec, self.status, self.role
        target, not_before = role.target_and_not_before(status)

        pods = ctx.caches.pods_of_slice(self.namespace, self.name)
        barrier = any(attempt < target for attempt in role.gang_attempts(pods))
        created = (
            frozenset({spec.slice_index})
            if target and status.created_attempt >= target
            else frozenset()
        )
        tombstones = ctx.caches.tombstones.of_slice(self.namespace, self.name, target)
        state = assess(
            attempt=target,
            members=members_of(self.name, spec.slice_index, self.shape.hosts),
            pods=pods,
            created_slices=created,
            tombstones=tombstones,
            not_ready_nodes=ctx.caches.not_ready_nodes(nodes_of(pods, tombstones)),
        )
        finished = role.finished(status.phase)
        stopping = spec.suspend or target == 0 or finished

        pool = role.pool(status, stopping)
        node_pool, waiting_for = pool.name, pool.waiting_for
        self.pool_wait = waiting_for
        if pool.retry_after is not None:
            self._after(pool.retry_after)

        mode = self.capacity.mode()
        request = await self.capacity.read_request(mode, target, node_pool, stopping, state, pods)
        capacity = replace(mode, provisioning_request=request.consume)

        blocked = barrier or (not_before is not None and self.now < not_before)
        if not_before is not None and self.now < not_before:
            self._after((not_before - self.now).total_seconds())
        if barrier:
            self._after(BARRIER_RECHECK_SECONDS)
        can_create = (
            not stopping
            and not blocked
            and not waiting_for
            and state.outcome in ("Creating",)
            and (node_pool or not role.needs_pool)
        )
        to_create = self._not_awaited(state, pods, target)
        gke_slice, dynamic_plan = None, None
        if self.shape.dynamic is not None:
            ctx.caches.dynamic_slicing_seen = True
            forming = can_create and bool(to_create)
            release = stopping or state.outcome == "Succeeded"
            if forming or release:
                dynamic_plan = await self.capacity.read_dynamic_slice(target, release, forming)
                gke_slice, waiting_for = dynamic_plan.gke_slice, dynamic_plan.waiting_for
                can_create = can_create and gke_slice is not None
        creating = can_create and bool(to_create)
        refusal = self._refusal(target) if creating else None

        # decide
        new = self._status(
            state,
            pods,
            target,
            stopping,
            blocked,
            barrier,
            node_pool,
            waiting_for,
            refusal,
            finished,
        )

        # commit
        if not await self._commit(new, stopping):
            return RETRY_AFTER_CONFLICT

        # act
        await self.capacity.act_on_request(request, target, node_pool, mode)
        if dynamic_plan is not None:
            await self.capacity.act_on_dynamic_slices(dynamic_plan, target)
        if await role.ensure_service(ports_of(spec)):
            self._after(MIN_REQUEUE_SECONDS)  # the next status says the conflict
        await self._delete_stale(state)
        if stopping or role.finished(new["phase"]):
            await self._stop_active(state, pods)
        if creating:
            await self._create_pods(to_create, target, node_pool, capacity, gke_slice, refusal)
        return self.requeue

    async def _commit(self, new: dict[str, Any], stopping: bool) -> bool:
        """Write the status (once, unless only counters moved); on success post the
        events of this reconcile. False: the write lost to a concurrent change."""
        ctx = self.ctx
        if not self.after_commit:
            # The job's status carries this slice's ready count: its slices share the
            # job's pace of counter writes (pacing.py).
            hold = ctx.pacer.hold(
                self.body["metadata"]["uid"],
                self.body.get("status") or {},
                new,
                sharing=slice_sharing(self.body),
            )
            if hold:
                self._after(hold)
                return True
        if not await write_status(ctx.kube, contract.SLICE_PLURAL, self.body, new, ctx.pacer):
            return False
        if stopping or new.get("phase") in TERMINAL_PHASES:
            # Its record no longer holds a pool; its pods do, until they are gone.
            ctx.reservations.release(self.holder)
        for action in self.after_commit:
            action()
        self._events(self.status.phase, new)
        return True

    def _refusal(self, target: int) -> PodRefusal | None:
        """Why the last try to create this attempt's pods failed, if it did."""
        refusal = self.ctx.refused_pods.get((self.namespace, self.name))
        if refusal is None or refusal.uid != self.body["metadata"]["uid"]:
            return None
        return refusal if refusal.attempt == target else None

    async def _delete_stale(self, state: GangState) -> None:
        """Delete the pods of earlier attempts (not those the job carries in place,
        ``spec.inPlaceFrom``, whatever the cache shows yet): one DELETE per pod, all at
        once (bounded by the client's concurrency), each guarded by the pod's UID. The
        apiserver works through a collection DELETE one pod at a time; separate DELETEs
        let it use all its workers (at 256 hosts the old pods were gone in 60 % of the
        time)."""
        deleted = self.ctx.deleted_pods
        spec = self.spec
        carried_from = self.role.in_place_from
        doomed = [
            p
            for p in state.stale
            if not p.deleting
            and not deleted.awaited(p.uid)
            and carried_attempt(p.attempt, spec.attempt, carried_from) != spec.attempt
        ]
        await send_all(self._delete(p) for p in doomed)
        await self._force_stuck([p for p in state.stale if p.deleting])

    async def _delete(self, pod: PodView) -> None:
        path = namespaced(self.namespace, "pods", pod.name)
        await self.ctx.kube.delete(path, uid=pod.uid)
        self.ctx.deleted_pods.requested(pod.uid)

    async def _stop_active(self, state: GangState, pods: list[PodView]) -> None:
        """Delete the running pods of a stopping slice, one DELETE per pod guarded by its
        UID (as ``_delete_stale``): a collection DELETE by label would also take pods that
        only carry the slice's labels (``runtime/ownership.py``). A pod the gang counts as
        failed but that still runs (on a node lost to the slice, such as a cube GKE marked
        unhealthy) is deleted too: nothing else would stop it."""
        deleted = self.ctx.deleted_pods
        running = [
            p for p in pods if p.attempt == state.attempt and p.phase not in ("Succeeded", "Failed")
        ]
        doomed = [p for p in running if not p.deleting and not deleted.awaited(p.uid)]
        await send_all(self._delete(p) for p in doomed)
        await self._force_stuck([p for p in running if p.deleting])

    async def _force_stuck(self, deleting: list[PodView]) -> None:
        """Force-delete pods whose node is gone or not ready, past their deletion deadline."""
        lost = self.ctx.caches.not_ready_nodes(p.node for p in deleting)
        for pod in deleting:
            deadline = parse(pod.deletion_deadline)
            if not (pod.node is None or pod.node in lost) or deadline is None:
                continue
            if self.now < deadline + STUCK_GRACE:
                self._after((deadline + STUCK_GRACE - self.now).total_seconds())
                continue
            log.warning(
                "force-deleting pod %s/%s: node %s is not ready and cannot confirm it stopped",
                self.namespace,
                pod.name,
                pod.node,
            )
            await self.ctx.kube.delete(
                namespaced(self.namespace, "pods", pod.name), grace_seconds=0, uid=pod.uid
            )

    def _not_awaited(self, state: GangState, pods: list[PodView], target: int) -> list[Member]:
        """The members to create, less those created already but not yet in the cache."""
        key = (self.namespace, self.name)
        expected = self.ctx.created_pods
        expected.observe(key, ((p.name, p.attempt) for p in pods))
        missing = [m for m in state.to_create if not expected.awaited(key, m.name, target)]
        if len(missing) < len(state.to_create):
            self._after(expected.ttl)  # in case the cache never shows them
        return missing

    async def _create_pods(
        self,
        members: list[Member],
        target: int,
        node_pool: str | None,
        capacity: CapacityMode,
        gke_slice: str | None,
        reported: PodRefusal | None,
    ) -> None:
        """Create ``members``' pods; what the apiserver refused is remembered for the
        slice's next status (``reported``: the refusal this reconcile's status said)."""
        spec = self.spec
        meta = self.body["metadata"]
        owner = Owner(contract.API_VERSION, contract.SLICE_KIND, self.name, meta["uid"])
        placement = spec.placement
        failure_policy = spec.failure_policy or FailurePolicy()
        node_placement = NodePlacement(
            node_pool=None if is_claim(node_pool) else node_pool,
            slice_pool=claim_toleration_value(self.ctx, node_pool),
            spot=placement.spot if placement else None,
            reservation=placement.reservation if placement else None,
            extra_selector=dict(placement.node_selector or {}) if placement else {},
            not_ready_timeout_seconds=failure_policy.node_not_ready_timeout_seconds,
            dynamic_slice=gke_slice,
            capacity=capacity,
        )
        template = (self.body.get("spec") or {}).get("template") or {}
        job_name = self.role.job_name
        ports = ports_of(spec)
        path = namespaced(self.namespace, "pods")
        secret = self.role.control_secret
        key_id = spec.control_key_id
        supervised = (
            Supervision(secret, key_id, await_start=spec.await_start) if secret and key_id else None
        )
        in_flight = self.ctx.pods_in_flight
        holder = self.role.pool_holder

        async def create(member: Member) -> None:
            wiring = PodWiring(
                job_name=job_name,
                service=spec.service or self.name,
                slice_name=self.name,
                shape=self.shape,
                num_slices=spec.num_slices,
                slice_index=spec.slice_index,
                worker_index=member.worker_index,
                attempt=target,
                ports=ports,
                slice_names=self.role.pod_slice_names,
                world=tuple(spec.world_slices or ()),
            )
            try:
                pod = worker_pod(
                    namespace=self.namespace,
                    wiring=wiring,
                    template=template,
                    owner=owner,
                    placement=node_placement,
                    supervision=supervised,
                )
            except BUILD_ERRORS as exc:
                log.warning("cannot build pod %s from spec.template: %r", member.name, exc)
                raise TemplateBuildError(repr(exc)) from None
            started = time.monotonic()
            if node_pool:  # it holds the pool from now on (reconcile/pools.py, rule 3)
                in_flight.created(node_pool, holder, self.namespace, member.name, target)
            try:
                if await self.ctx.kube.create(path, pod):
                    self.ctx.metrics.pod_created(time.monotonic() - started)
            except ApiError:
                if node_pool:
                    in_flight.failed(node_pool, self.namespace, member.name, target)
                raise
            self.ctx.created_pods.created((self.namespace, self.name), member.name, target)

        results = await asyncio.gather(*(create(m) for m in members), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        key = (self.namespace, self.name)
        if not errors:
            self.ctx.refused_pods.pop(key, None)
            return
        refusal = self._refusal_of(errors, target)
        self.ctx.refused_pods[key] = refusal
        if not refusal.invalid:
            self._after(FORBIDDEN_RETRY_SECONDS)
        if reported is None or (reported.reason, reported.message) != (
            refusal.reason,
            refusal.message,
        ):
            self._after(MIN_REQUEUE_SECONDS)  # the next status says it

    def _refusal_of(self, errors: list[BaseException], target: int) -> PodRefusal:
        """What the errors of a try to create pods mean for the slice (raised again when
        it was the connection, not the apiserver's answer: the key backs off)."""
        uid = self.body["metadata"]["uid"]
        unbuildable = [e for e in errors if isinstance(e, TemplateBuildError)]
        if unbuildable:
            return PodRefusal(
                uid,
                target,
                Reason.INVALID_POD_TEMPLATE,
                f"spec.template: the worker pod cannot be built from it ({unbuildable[0]}); "
                "fix spec.template (the job cannot run with it)",
            )
        unexpected = [e for e in errors if not isinstance(e, ApiError)]
        if unexpected:
            raise unexpected[0]
        refusals = {refusal_reason(e): e for e in errors if isinstance(e, ApiError)}
        invalid = refusals.get(Reason.INVALID_POD_TEMPLATE)
        if invalid is not None:
            return PodRefusal(
                uid,
                target,
                Reason.INVALID_POD_TEMPLATE,
                f"the apiserver rejected the worker pod: {invalid.message}; fix "
                "spec.template (the job cannot run with it)",
            )
        reason = Reason.PODS_FORBIDDEN
        refused = refusals.get(reason)
        if refused is None:
            reason, refused = next(iter(refusals.items()))
        return PodRefusal(
            uid,
            target,
            reason,
            f"pods cannot be created, retrying every {FORBIDDEN_RETRY_SECONDS:.0f} s until "
            f"the cause is gone: {refused.message}",
        )

    def _status(
        self,
        state: GangState,
        pods: list[PodView],
        target: int,
        stopping: bool,
        blocked: bool,
        draining: bool,
        node_pool: str | None,
        waiting_for: str,
        refusal: PodRefusal | None,
        finished: bool,
    ) -> dict[str, Any]:
        spec, old = self.spec, self.status
        if refusal is not None and not refusal.invalid:
            self.create_reason = refusal.reason
        # A second validation of what was read, not ``old.model_copy(deep=True)``: the
        # same independent copy, in a tenth of the time (pydantic's deep copy walks
        # every condition and failure through ``copy.deepcopy``: a third of a slice
        # reconcile that had nothing to do).
        status = TPUSliceStatus.model_validate(self.body.get("status") or {})
        status.observed_generation = self.body["metadata"].get("generation")
        status.shape = ResolvedShape.of(self.shape)
        status.attempt = target
        status.workers = state.total
        status.ready_workers = state.ready
        status.ready = f"{state.ready}/{state.total}"
        status.active_pods, status.terminating_pods = stopping_count(pods)
        released = stopping and not self.role.reports_pool_when_stopping
        status.node_pool = None if released else node_pool
        if self.capacity.provisioning is not None:
            request, tries, words = self.capacity.provisioning
            status.provisioning_request, status.provisioning_tries = request, tries
            status.provisioning_state = words
        elif status.attempt != old.attempt or self.capacity.withdrawn:
            status.provisioning_request, status.provisioning_tries = None, 0
            status.provisioning_state = ""
        if target and not stopping and not state.to_create and state.outcome != "Creating":
            status.created_attempt = max(status.created_attempt, target)
        if status.start_time is None and state.total and not state.to_create:
            status.start_time = stamp(self.now)
        decided = slice_phase.decide(
            slice_phase.SliceFacts(
                gang=state,
                attempt=target,
                now=self.now,
                standalone=self.role.standalone,
                suspend=spec.suspend,
                stopping=stopping,
                blocked=blocked,
                draining=draining,
                waiting_for=waiting_for,
                refusal=refusal,
                previous_phase=old.phase,
                previous_attempt=old.attempt,
                finished=finished,
                previous_message=old.message,
                scheduler_looked_at=(
                    self.ctx.caches.schedulers.looked_at(state.unseen.scheduler)
                    if state.unseen is not None
                    else None
                ),
            )
        )
        if decided.failure is not None:
            status.failure = decided.failure
        if decided.recheck is not None:
            self._after(decided.recheck)
        phase, message = decided.phase, decided.message
        if decided.ended is not None:
            phase, message = self._attempt_failed(status, decided.ended, target)
        if phase in TERMINAL_PHASES and status.completion_time is None:
            status.completion_time = stamp(self.now)
        provisioning = ""
        if self.capacity.provisioning is not None:
            request, _, words = self.capacity.provisioning
            provisioning = f"ProvisioningRequest {request}: {words}"
        message = slice_phase.said(phase, message, self.role.service_conflict(), provisioning)
        status.phase = phase
        status.message = message
        conditions = slice_phase.conditions(
            [c.wire() for c in status.conditions],
            phase=phase,
            message=message,
            refused=self.create_reason,
            suspend=spec.suspend and not finished,  # a finished slice is not suspended
            active_pods=status.active_pods,
            terminating_pods=status.terminating_pods,
            now=self.now,
            generation=self.body["metadata"].get("generation"),
        )
        result = status.wire()
        result["conditions"] = conditions
        return result

    def _attempt_failed(
        self, status: TPUSliceStatus, failure: WorkerFailure, target: int
    ) -> tuple[Phase, str]:
        """The slice's attempt failed: what its role decides follows (a standalone
        slice's failure policy; ``status`` is updated in place)."""
        ending = self.role.attempt_failed(status, failure, target, self.now)
        reason = ending.restart
        if reason is not None:
            # Counted once the decision is committed (a lost write is decided again).
            self.after_commit.append(lambda: self.ctx.metrics.restart(contract.SLICE_KIND, reason))
            self._after(ending.delay)
        return ending.phase, ending.message

    def _events(self, previous: str, new: dict[str, Any]) -> None:
        phase = new["phase"]
        ref = slice_ref(self.body)
        message = new.get("message", "")
        for kind, reason, words in self.capacity.events:
            self.ctx.events.emit(ref, kind, reason, words)
        if self.role.posts_job_events:
            # As a job says them (``start.wait_for_pools``, ``start.start``).
            if self.pool_wait and self.pool_wait not in self.status.message:
                self.ctx.events.emit(ref, "Normal", Reason.WAITING_FOR_NODE_POOLS, self.pool_wait)
            if previous == Phase.SUSPENDED and new.get("attempt", 0) > self.status.attempt:
                words = f"resumed as attempt {new['attempt']}"
                self.ctx.events.emit(ref, "Normal", Reason.RESUMED, words)
        conflict = self.role.service_conflict()
        if conflict and conflict in message and conflict not in self.status.message:
            self.ctx.events.emit(ref, "Warning", Reason.SERVICE_CONFLICT, conflict)
        ready_before = next(
            (c.reason for c in self.status.conditions if c.type == ConditionType.READY), ""
        )
        if self.create_reason and self.create_reason != ready_before:
            self.ctx.events.emit(ref, "Warning", self.create_reason, message)
        if phase == previous:
            return
        if phase in (Phase.FAILED, Phase.RESTARTING):
            self.ctx.events.emit(ref, "Warning", phase, message)
        elif phase in (Phase.RUNNING, Phase.SUCCEEDED, Phase.SUSPENDED):
            self.ctx.events.emit(ref, "Normal", phase, message)
