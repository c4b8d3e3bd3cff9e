"""TPUJob reconciler: a driver over the job's policies (``policies/``).

One reconcile (``JobRun.reconcile``) reads as a table of contents:

1. **observe**: what the job shows, from the watch caches only (``JobFacts``), and the
   only I/O before deciding: the supervisors of pods whose training process stopped are
   asked what happened, and the job's admission reads what it needs;
2. **decide**: each policy contributes to one ``Plan`` (no I/O; ``JobRun.decide``);
3. **commit**: the plan's status is written once, guarded by the resourceVersion that was
   read, so a decision made on stale data is never acted on (409: decide again on fresh
   data); its events and metrics follow the write;
4. **act**: the children are brought in line with the committed status: one TPUSlice per
   slice for the committed attempt (the slices create the pods, and pods of a new attempt
   wait until every pod of the old one is gone), the slices of a suspended or finished
   job stopped, a job whose TTL ran out deleted; then the admission is told.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from tpu_operator import contract, supervision
from tpu_operator.api.job import TPUJobSpec
from tpu_operator.api.monitoring import Monitoring
from tpu_operator.api.policy import FailurePolicy, Placement
from tpu_operator.api.status import TERMINAL_PHASES, Phase, Reason, ResolvedShape
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
from tpu_operator.builders.workload import queue_name
from tpu_operator.catalog import CatalogError, SliceShape, chips_per_host_choices
from tpu_operator.placement.pools import (
    Allocation,
    MachineChoice,
    PoolGone,
    Request,
    job_spares,
)
from tpu_operator.policies import (
    elastic,
    failure,
    fallback,
    lifetime,
    patience,
    phase,
    pools,
    start,
    success,
    suspend,
    verdict,
    waiting,
    waits,
)
from tpu_operator.policies.admission import Admission
from tpu_operator.policies.in_place import carried_from, restarting_in_place
from tpu_operator.policies.plan import (
    MIN_REQUEUE_SECONDS,
    Act,
    JobFacts,
    Metrics,
    Plan,
    SliceRefusal,
)
from tpu_operator.reconcile import slice_check
from tpu_operator.reconcile.context import (
    RETRY_AFTER_CONFLICT,
    Context,
    job_ref,
    mark_invalid,
    write_status,
)
from tpu_operator.reconcile.gangs import GangParts, JobGang
from tpu_operator.reconcile.pools import (
    choose_pools,
    job_holder,
    machine_for,
    resolve_claims,
    slice_pool_values,
    tpu_pools,
    unhealthy,
    vanished,
)
from tpu_operator.reconcile.queueing import admission_of
from tpu_operator.runtime.kube import ApiError, namespaced, send_all
from tpu_operator.runtime.ownership import slice_job
from tpu_operator.state.gang import GangState, assess, members_of, nodes_of, stopping_count
from tpu_operator.state.views import PodView
from tpu_operator.timestamps import parse

log = logging.getLogger(__name__)

DEFAULT_PUBLISH_SECONDS = 30.0
"""Progress publish interval when no sampler is configured (unit tests)."""
IN_PLACE_RECHECK_SECONDS = 1.0
"""Safety net while an in-place restart runs (pod events wake the job too)."""


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
            if body is not None and self.ctx.supervisors is not None:
                self.ctx.supervisors.forget_job(body["metadata"]["uid"])
            if body is None:
                self.ctx.reservations.release(job_holder(namespace, name))
                self.ctx.refused_slices.pop(key, None)
                await slice_check.release(self.ctx, namespace, name)
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
        step = (status.get("fallback") or {}).get("step", 0)
        placement = spec.placement.step(step) if spec.placement is not None else None
        choice = machine_for(self.ctx, holder, spec.slice, shape, placement, recorded)
        return await JobRun(self.ctx, body, spec, choice, self.gangs).reconcile()


class CachedWorld:
    """The policies' ``World`` for one job, over the operator's caches."""

    def __init__(self, ctx: Context, body: dict[str, Any], spec: TPUJobSpec, shape: SliceShape):
        self.ctx = ctx
        self.metrics: Metrics = ctx.metrics
        self.meta = body["metadata"]
        self.spec = spec
        self.shape = shape
        self.holder = job_holder(self.meta["namespace"], self.meta["name"])
        self.status_spares: list[str] = (body.get("status") or {}).get("spareNodePools") or []
        """Pools the job holds as spares in place of spares its slices took (recorded)."""

    def allocate(self, requests: list[Request]) -> Allocation:
        own = job_spares(self.spec.placement, self.status_spares)
        if own:
            requests = [replace(r, spares=r.spares | own) for r in requests]
        return choose_pools(self.ctx, self.holder, requests)

    def claims(self, slices: int, renewal: int | None = None) -> list[str]:
        return slice_pool_values(self.meta, slices, renewal)

    def resolve_claims(self, refs: list[str]) -> tuple[list[str], dict[int, str], list[str]]:
        return resolve_claims(self.ctx, refs, self.shape)

    def vanished_pools(
        self, refs: list[str], created: Iterable[int], placement: Placement | None
    ) -> list[PoolGone]:
        return vanished(self.ctx, refs, placement, created)

    def unhealthy_pools(self, refs: list[str]) -> dict[int, str]:
        return unhealthy(self.ctx, refs, self.shape.hosts)

    def not_ready_nodes(self, names: Iterable[str | None]) -> frozenset[str]:
        return self.ctx.caches.not_ready_nodes(names)

    def noticed_nodes(self) -> Mapping[str, str]:
        return self.ctx.caches.noticed_nodes()

    def terminating_nodes(self, before: float) -> Mapping[str, float]:
        return self.ctx.caches.terminating_nodes(before)

    def pools_end(self, pools: list[str]) -> float | None:
        known = tpu_pools(self.ctx)
        found = [e for p in pools if p in known and (e := known[p].ends) is not None]
        return min(found) if found else None

    def pods_on_node(self, node: str) -> list[PodView]:
        return self.ctx.caches.pods_on_node(node)

    def others_on_pools(self, pools: list[str]) -> list[PodView]:
        caches = self.ctx.caches
        known = tpu_pools(self.ctx)
        nodes: dict[str, list[str]] = {}
        for node in caches.tpu_nodes():
            if node.pool in pools and node.pool in known:
                nodes.setdefault(node.pool, []).append(node.name)
        return [p for pool in pools for p in caches.foreign_pods(pool, nodes.get(pool, ()))]

    def in_place_fallback(self, attempt: int) -> str | None:
        supervisors = self.ctx.supervisors
        return supervisors.fallback(self.meta["uid"], attempt) if supervisors else None

    def in_place_started(self, attempt: int) -> bool:
        supervisors = self.ctx.supervisors
        return supervisors.restarted(self.meta["uid"], attempt) if supervisors else True

    def service_conflict(self) -> str:
        return self.ctx.service_conflict(
            self.meta["namespace"], self.meta["name"], self.meta["uid"]
        )

    def slice_refusal(self) -> SliceRefusal | None:
        refusal = self.ctx.refused_slices.get((self.meta["namespace"], self.meta["name"]))
        return refusal if refusal is not None and refusal.uid == self.meta["uid"] else None

    def scheduler_looked_at(self, name: str) -> dt.datetime | None:
        return self.ctx.caches.schedulers.looked_at(name)


class JobRun:
    """One reconcile of one job: observe, decide, commit, act."""

    def __init__(
        self,
        ctx: Context,
        body: dict[str, Any],
        spec: TPUJobSpec,
        choice: MachineChoice,
        gangs: GangParts | None = None,
    ) -> None:
        shape = choice.shape
        self.ctx = ctx
        self.body = body
        self.gangs = gangs if gangs is not None else GangParts()
        self.gang: JobGang | None = None
        """The attempt assessed slice by slice (None: every pod is walked instead)."""
        self.facts = self._observe(body, spec, choice)
        sampler = ctx.progress
        self.plan = Plan.of(
            self.facts,
            sampler.publish_interval if sampler is not None else DEFAULT_PUBLISH_SECONDS,
        )
        self.world = CachedWorld(ctx, body, spec, shape)
        self.admission: Admission = admission_of(ctx, body, shape, spec.num_slices)

    def _observe(self, body: dict[str, Any], spec: TPUJobSpec, choice: MachineChoice) -> JobFacts:
        """What the job shows in the caches."""
        shape = choice.shape
        ctx = self.ctx
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        raw_spec: dict[str, Any] = body.get("spec") or {}
        fields = raw_spec.get("slice") or {}
        if (
            "chipsPerHost" not in fields
            and len(chips_per_host_choices(shape.generation, shape.topology)) > 1
        ):
            # The slices run on the machine type chosen here, whatever the default.
            raw_spec = {**raw_spec, "slice": {**fields, "chipsPerHost": shape.chips_per_host}}
        recorded = body.get("status") or {}
        now = ctx.clock()
        monitoring_on = (spec.monitoring or Monitoring()).enabled
        sampler = ctx.progress
        track = sampler.track(namespace, name) if sampler is not None and monitoring_on else None
        if track is not None and track.attempt != recorded.get("attempt", 0):
            track = None  # a track of another attempt has nothing to say about this one
        template = raw_spec.get("template") or {}
        mode = (spec.failure_policy or FailurePolicy()).restart_mode
        runs = ctx.supervisors is not None and runs_supervisor(template, mode)
        refused = (
            supervision_refused(template, namespace, ctx.control_network_policy) if runs else None
        )
        return JobFacts(
            namespace=namespace,
            name=name,
            uid=uid,
            generation=meta.get("generation"),
            created=parse(meta.get("creationTimestamp")) or now,
            now=now,
            spec=spec,
            raw_spec=raw_spec,
            shape=shape,
            slices={
                int((s.get("spec") or {}).get("sliceIndex", 0)): s
                for s in ctx.caches.slices_of_job(namespace, name)
                if slice_job(s) == (name, uid)  # a slice belongs to a job by UID
            },
            recorded=recorded,
            load_pods=lambda: ctx.caches.pods_of_job(namespace, name),
            track=track,
            supervised=runs and refused is None,
            supervision_refused=refused,
            machine_note=choice.note,
            machine_wait=choice.waiting,
            kueue=bool(ctx.caches.kueue and queue_name(meta)),
        )

    # the reconcile
    async def reconcile(self) -> float | None:
        await self._ask_supervisors()
        await self.admission.observe()
        self.decide()
        if not await self._commit():
            # What this reconcile reserved stays reserved until the job's next write: the
            # write may have lost to the job's own earlier one, which recorded pools the
            # cache does not show yet (context.Reservations).
            return RETRY_AFTER_CONFLICT
        self._hold_pools()
        if self.plan.status.phase in TERMINAL_PHASES and self.ctx.supervisors is not None:
            self.ctx.supervisors.forget_job(self.facts.uid)
        await self._act()
        await self.admission.act(self.plan)
        return self.plan.requeue

    def decide(self) -> None:
        """The new status, events and the act to follow, from the policies (no I/O)."""
        facts, plan, world = self.facts, self.plan, self.world
        status = plan.status
        attempt = max(
            [status.attempt]
            + [int((s.get("spec") or {}).get("attempt", 0)) for s in facts.slices.values()]
        )
        state = self._gang(attempt)
        self._count_pods()
        refusal = world.slice_refusal()
        if status.phase in TERMINAL_PHASES:
            lifetime.finished(facts, plan)
        elif facts.spec.suspend:
            suspend.suspend(facts, plan)
        elif self.admission.holds(facts, plan):
            pass  # not admitted (or evicted): no pods, as when suspended
        elif start.should_start(facts, plan, attempt):
            fallback.check(facts, plan)
            start.start(facts, plan, world, attempt, self.admission.pools())
        elif refusal is not None and refusal.invalid:
            message = (
                f"the apiserver rejected the job's TPUSlice: {refusal.message}; fix the spec "
                "(the job cannot run with it)"
            )
            failure.fail(facts, plan, Reason.INVALID_SPEC, message, None)
        elif fallback.check(facts, plan):
            start.replace(facts, plan, world, attempt)
        else:
            plan.act = Act.RUN
            self._run_attempt(attempt, state or self._assess_all(attempt))
        patience.check(facts, plan)
        self.admission.report(facts, plan)
        waits.ended(facts, plan, world)

    def _run_attempt(self, attempt: int, state: GangState) -> None:
        """The running attempt: its pools, then the verdict and what follows from it."""
        facts, plan, world = self.facts, self.plan, self.world
        pools.check(facts, plan, world)
        phase.summaries(facts, plan, state)
        waiting.pods_allowed(facts, plan, attempt, state)
        found = verdict.decide(facts, plan, world, attempt, state)
        if found.kind == "job-failed":
            assert found.reason is not None
            failure.fail(facts, plan, found.reason, found.message, None)
        elif found.kind == "attempt-failed":
            assert found.failure is not None
            failure.attempt_failed(facts, plan, world, found.failure, attempt)
        elif found.kind == "succeeded":
            success.succeed(facts, plan, state)
        else:
            phase.goes_on(
                facts, plan, world, state, found.outcome, attempt, found.draining, found.backing_off
            )
            elastic.grow(facts, plan, world, attempt)

    # observing
    async def _ask_supervisors(self) -> None:
        """Ask the supervisors of pods whose training process stopped what happened (the
        only I/O before deciding; answers are remembered per readiness transition)."""
        supervisors = self.ctx.supervisors
        recorded = self.facts.recorded
        if supervisors is None or recorded.get("phase") in TERMINAL_PHASES:
            return
        # Pods of older attempts are being stopped by an in-place restart: nothing to ask.
        attempt = recorded.get("attempt", 0)
        current = [p for p in self.facts.pods if p.attempt >= attempt]
        if not any(p.process_stopped for p in current):
            return
        reports, retry = await supervisors.observe(self.facts.uid, current)
        self.facts.reports = reports
        if retry is not None:
            self.plan.after(retry)

    def _gang(self, attempt: int) -> GangState | None:
        """The attempt assessed by slices (``reconcile/gangs.py``); a job that runs none
        (finished, suspended, not started) keeps no parts."""
        facts, status = self.facts, self.plan.status
        if attempt == 0 or facts.spec.suspend or status.phase in TERMINAL_PHASES:
            self.gangs.forget(facts.namespace, facts.name)
            self.gang = None
            return None
        gang = self.gang = self.gangs.assess(
            self.ctx.caches,
            namespace=facts.namespace,
            job=facts.name,
            attempt=attempt,
            num_slices=facts.spec.num_slices,
            hosts=facts.shape.hosts,
            created=self._created(attempt),
            dropped=self._dropped(),
            success_policy=facts.spec.success_policy,
            reports=facts.reports,
        )
        return gang.state if gang is not None else None

    def _dropped(self) -> frozenset[int]:
        """Slices the attempt runs without (an elastic job's ``droppedSlices``)."""
        return frozenset(d.index for d in self.plan.status.dropped_slices)

    def _created(self, attempt: int) -> frozenset[int]:
        """Slices that have created every pod of ``attempt`` once (a pod missing from
        them has vanished, rather than waiting to be created)."""
        return frozenset(
            i
            for i, s in self.facts.slices.items()
            if int((s.get("spec") or {}).get("attempt", 0)) == attempt
            and int((s.get("status") or {}).get("createdAttempt", 0)) >= attempt
        )

    def _assess_all(self, attempt: int) -> GangState:
        """The attempt assessed over every pod of the job at once (when ``_gang`` could
        not assess it by slices)."""
        facts = self.facts
        dropped = self._dropped()
        members = [
            m
            for i in range(facts.spec.num_slices)
            if i not in dropped
            for m in members_of(contract.slice_name(facts.name, i), i, facts.shape.hosts)
        ]
        tombstones: dict[str, Any] = {}
        for i in range(facts.spec.num_slices):
            tombstones.update(
                self.ctx.caches.tombstones.of_slice(
                    facts.namespace, contract.slice_name(facts.name, i), attempt
                )
            )
        return assess(
            attempt=attempt,
            members=members,
            pods=facts.pods,
            created_slices=self._created(attempt),
            tombstones=tombstones,
            not_ready_nodes=self.ctx.caches.not_ready_nodes(nodes_of(facts.pods, tombstones)),
            success_policy=facts.spec.success_policy,
            reports=facts.reports,
            leader_slice=min(
                (i for i in range(facts.spec.num_slices) if i not in dropped), default=0
            ),
        )

    def _count_pods(self) -> None:
        status = self.plan.status
        if self.gang is not None:
            status.active_pods = self.gang.active_pods
            status.terminating_pods = self.gang.terminating_pods
        else:
            status.active_pods, status.terminating_pods = stopping_count(self.facts.pods)

    # committing
    async def _commit(self) -> bool:
        """Write the status (once); on success post the events of this reconcile."""
        facts, plan = self.facts, self.plan
        status = plan.status
        status.observed_generation = facts.generation
        status.shape = ResolvedShape.of(facts.shape)
        wire = status.wire()
        wire["conditions"] = plan.conditions
        pacer = self.ctx.pacer
        if not plan.events and not plan.after_commit:
            hold = pacer.hold(facts.uid, facts.recorded, wire)
            if hold:  # only counters moved: written with the next change or after `hold`
                plan.after(hold)
                return True
        if not await write_status(self.ctx.kube, contract.JOB_PLURAL, self.body, wire, pacer):
            return False
        ref = job_ref(self.body)
        for type_, reason, message in plan.events:
            self.ctx.events.emit(ref, type_, reason, message)
        plan.events.clear()
        for action in plan.after_commit:
            action()
        plan.after_commit.clear()
        return True

    def _hold_pools(self) -> None:
        """The job's reservations follow its committed status (``context.Reservations``)."""
        status = self.plan.status
        holder = self.facts.holder
        if status.phase in TERMINAL_PHASES or status.phase in (Phase.SUSPENDED, Phase.QUEUED):
            # The pods hold the pools from now on, until they are gone (reconcile/pools.py).
            self.ctx.reservations.release(holder)
        else:
            self.ctx.reservations.hold(holder, list(status.node_pools or []))

    # acting
    async def _act(self) -> None:
        plan = self.plan
        if plan.act is Act.RUN:
            await self._run_children(plan.status.attempt)
            if restarting_in_place(plan.status):
                await self._restart_in_place(plan.status.attempt)
            if plan.checkpoint_for:
                await self._checkpoint(plan.checkpoint_for)
        elif plan.act is Act.STOP:
            await self._stop_children()
        elif plan.act is Act.DELETE:
            log.info(
                "deleting %s: finished %s s ago (ttlSecondsAfterFinished)",
                self.facts.holder,
                self.facts.spec.ttl_seconds_after_finished,
            )
            path = namespaced(
                self.facts.namespace,
                contract.JOB_PLURAL,
                self.facts.name,
                group=contract.GROUP,
                version=contract.VERSION,
            )
            await self.ctx.kube.delete(path, propagation="Background")

    async def _checkpoint(self, notices: list[str]) -> None:
        supervisors = self.ctx.supervisors
        if supervisors is None:
            return
        asked = await supervisors.checkpoint(
            job_uid=self.facts.uid,
            pods=self.facts.pods,
            attempt=self.plan.status.attempt,
            request_id=hashlib.sha256(notices[-1].encode()).hexdigest()[:16],
        )
        if not asked:
            return  # every worker had acknowledged it (or none could be asked now)
        log.info(
            "%s: asked %d workers to checkpoint (%s)",
            self.facts.holder,
            asked,
            "; ".join(notices),
        )

    async def _restart_in_place(self, attempt: int) -> None:
        """Stop every process of the previous attempt in the pods that stay (all, or
        those of the slices a mixed restart does not recreate), then start this one in
        every pod (each pass idempotent; reconcile/supervisors.py)."""
        supervisors = self.ctx.supervisors
        if supervisors is None:
            return
        facts, plan = self.facts, self.plan
        restart_at = parse(plan.status.restart_at)
        template_spec = (facts.raw_spec.get("template") or {}).get("spec") or {}
        started_before = self.world.in_place_started(attempt)
        done = await supervisors.restart_in_place(
            job_uid=facts.uid,
            pods=facts.pods,
            attempt=attempt,
            members=facts.spec.num_slices * facts.shape.hosts,
            recreated=frozenset(plan.status.recreated_slices or ()),
            hosts=facts.shape.hosts,
            grace_seconds=stop_grace(template_spec),
            may_start=restart_at is None or plan.now >= restart_at,
        )
        if not done:
            plan.after(IN_PLACE_RECHECK_SECONDS)
        elif not started_before:
            # This pass sent the last starts; the status it wrote still says Starting, and
            # no pod changes to wake the job (a started process's pod stays Ready).
            plan.after(MIN_REQUEUE_SECONDS)

    def _owner(self) -> Owner:
        return Owner(contract.API_VERSION, contract.JOB_KIND, self.facts.name, self.facts.uid)

    def _extra_labels(self) -> dict[str, str]:
        labels = self.body["metadata"].get("labels") or {}
        queue = labels.get(contract.LABEL_KUEUE_QUEUE)
        return {contract.LABEL_KUEUE_QUEUE: queue} if queue else {}

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
        facts = self.facts
        key = supervisors.channel.key_for(facts.uid)
        key_id = supervision.key_id(key)
        name = key_secret_name(facts.name, key_id)
        if (facts.namespace, name) in self.ctx.control_keys:
            return name, key_id
        secret = key_secret(
            name=name,
            namespace=facts.namespace,
            job_name=facts.name,
            owner=self._owner().reference(),
            key=key,
        )
        await self.ctx.kube.create(namespaced(facts.namespace, "secrets"), secret)
        self.ctx.control_keys.add((facts.namespace, name))
        return name, key_id

    async def _run_children(self, attempt: int) -> None:
        facts, plan = self.facts, self.plan
        ports = facts.spec.ports
        service = headless_service(
            name=facts.name,
            namespace=facts.namespace,
            selector={contract.LABEL_JOB_NAME: facts.name},
            owner=self._owner(),
            ports=Ports(ports.coordinator, ports.megascale, ports.metrics) if ports else Ports(),
        )
        await self.ctx.ensure_service(facts.namespace, service)
        control = await self._ensure_control_key() if facts.supervised else None
        secret, key_id = control if control is not None else (None, None)
        moving_in_place = restarting_in_place(plan.status)
        recreated = set(plan.status.recreated_slices or ())
        node_pools = plan.status.node_pools or []
        dropped = self._dropped()
        gke_slices = self.admission.gke_slices() or []
        world = elastic.world_of(facts.spec.num_slices, dropped)
        job_spec = facts.raw_spec
        if job_spec.get("placement") is not None:
            placement = fallback.wire_placement(job_spec["placement"], plan.status)
            job_spec = {**job_spec, "placement": placement}
        if plan.template is not None:
            job_spec = {**job_spec, "template": plan.template}
        # All slices at once, not one after the other: each slice's pods are created as
        # soon as the slice is, and one slice POST at a time would wait behind the pods
        # of the slices before it in the client's queue, leaving it idle between slices.
        # Except in a mixed restart: the slices it recreates are the restart's critical
        # path (their pods are deleted and created again; the kept slices only record that
        # they carry theirs), so they are written first, and their reconciles queue ahead
        # of the kept slices'.
        writes: list[Awaitable[Any]] = []
        first: list[Awaitable[Any]] = []
        for index in range(facts.spec.num_slices):
            current = facts.slices.get(index)
            current_spec = (current or {}).get("spec") or {}
            desired = job_slice(
                job_name=facts.name,
                namespace=facts.namespace,
                job_spec=job_spec,
                index=index,
                attempt=attempt,
                owner=self._owner(),
                node_pool=node_pools[index] if index < len(node_pools) else None,
                not_before=plan.status.restart_at,
                suspend=index in dropped,
                extra_labels=self._extra_labels(),
                in_place_from=carried_from(
                    attempt=attempt,
                    moving_in_place=moving_in_place,
                    recreated=index in recreated,
                    slice_attempt=None if current is None else current_spec.get("attempt", 0),
                    slice_from=current_spec.get("inPlaceFrom"),
                ),
                await_start=moving_in_place,
                control_key_secret=secret,
                control_key_id=key_id,
                world=world,
                gke_slice=gke_slices[index] if index < len(gke_slices) else None,
            )
            queue = first if moving_in_place and index in recreated else writes
            if current is None:
                queue.append(self.ctx.kube.create(_slices_path(facts.namespace), desired))
                continue
            patch = slice_patch(desired, current, placement=plan.status.fallback is not None)
            if patch:
                path = _slices_path(facts.namespace, desired["metadata"]["name"])
                queue.append(self.ctx.kube.merge_patch(path, patch))
        key = (facts.namespace, facts.name)
        try:
            await send_all(first, writes)
        except ApiError as exc:
            if exc.status == 429 or exc.status >= 500 or exc.not_found:
                raise  # the apiserver's own trouble, or a slice just deleted: back off
            # Its next status says why (the status was committed before this act).
            invalid = exc.invalid and " is forbidden: " not in exc.message
            self.ctx.refused_slices[key] = SliceRefusal(facts.uid, invalid, exc.message)
            log.warning("%s: the apiserver refused its TPUSlices: %s", facts.holder, exc.message)
            plan.after(MIN_REQUEUE_SECONDS if invalid else waiting.SLICE_RETRY_SECONDS)
            return
        self.ctx.refused_slices.pop(key, None)

    async def _stop_children(self) -> None:
        await send_all(
            self._suspend_slice(body["metadata"]["name"])
            for body in self.facts.slices.values()
            if not (body.get("spec") or {}).get("suspend")
        )

    async def _suspend_slice(self, slice_name: str) -> None:
        try:
            await self.ctx.kube.merge_patch(
                _slices_path(self.facts.namespace, slice_name), {"spec": {"suspend": True}}
            )
        except ApiError as exc:
            if not exc.not_found:
                raise
