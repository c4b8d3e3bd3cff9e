"""Kueue integration, I/O part: keep a TPUJob's Workload and tell Kueue what the job does.

:class:`KueueAdmission` is the job's admission (``policies/admission.py``) for a
Kueue-managed job of an operator run with ``--kueue``: the driver asks it whether the job
is held (Kueue's verdict, ``builders/workload.queue_state``, from the watch cache of
Workloads), decides and commits the job's status as usual, and then calls its ``act``,
which brings the Workload in line with the committed status:

- no Workload: create it (a WorkloadPriorityClass named by ``kueue.x-k8s.io/priority-class``
  is read once for its value);
- a Workload that no longer describes a job that is not admitted (changed while queued):
  delete it; the next reconcile creates the new one (the job is queued again);
- an evicted job whose pods are all gone (PodsStopped True): clear the admission, which
  gives the quota back and lets Kueue admit it again (Kueue's contract for a job that is
  "no longer active");
- PodsReady and Finished conditions as the job's status says;
- a suspended job (``spec.suspend``): the Workload is deactivated (``spec.active: false``,
  marked with an annotation), its admission cleared once the pods are gone; on resume the
  operator reactivates it, and Kueue queues it again;
- a running job some of whose slices have finished: their workers are reported as
  ``status.reclaimablePods``, so that Kueue frees their quota.

Before deciding, :meth:`Queueing.load_flavors` reads the ResourceFlavors of a new admission
(their node labels and tolerations go to the pods, ``builders/workload.admission_assignment``).

Every Workload write is guarded by the resourceVersion read, so a write never undoes
Kueue's own (a 409 wakes the job again on fresh data). Writes happen on changes only:
creation, deletion, one per eviction, PodsReady changes, Finished once, one per slice
that finishes before the others.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from tpu_operator.api.conditions import stamp
from tpu_operator.api.job import QueueStatus
from tpu_operator.api.status import TERMINAL_PHASES, ConditionType, Phase, Reason
from tpu_operator.builders.workload import (
    CLUSTER_QUEUE_PLURAL,
    FINISHED,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_PRIORITY_CLASS,
    LOCAL_QUEUE_PLURAL,
    PODS_READY,
    PRIORITY_CLASS_PLURAL,
    RESOURCE_FLAVOR_PLURAL,
    Priority,
    QueueState,
    apply_assignment,
    build_workload,
    clear_admission,
    flavor_names,
    queue_flavors,
    queue_name,
    queue_state,
    reclaimable_pods,
    reclaimable_status,
    slice_node_selector,
    with_condition,
    workload_outdated,
)
from tpu_operator.catalog import SliceShape
from tpu_operator.policies.admission import NO_ADMISSION, Admission
from tpu_operator.policies.failure import fail
from tpu_operator.policies.plan import Act, JobFacts, Plan
from tpu_operator.policies.suspend import stopped
from tpu_operator.reconcile.context import Context, job_ref, workload_path
from tpu_operator.reconcile.slice_check import SliceCheck, activate
from tpu_operator.runtime.kube import ApiError

log = logging.getLogger(__name__)
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSION = "v1beta2"
POSITION_SECONDS = 10.0
"""A LocalQueue's pending workloads are read at most this often (one GET for all of its
queued jobs), and a queued job looks again this often."""
UNSERVED_SECONDS = 300.0
"""After the visibility API did not answer (not served: Kueue's VisibilityOnDemand off;
or forbidden), it is not asked again for this long."""
SUSPEND_ANNOTATION = "tpu-operator.dev/deactivated-for-suspend"
"""On a Workload the operator deactivated because its job is suspended."""


def pending_positions(summary: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Workload name -> (position in its LocalQueue, in its ClusterQueue), from Kueue's
    ``PendingWorkloadsSummary``."""
    positions: dict[str, tuple[int, int]] = {}
    for item in summary.get("items") or []:
        name = (item.get("metadata") or {}).get("name")
        local, cluster = item.get("positionInLocalQueue"), item.get("positionInClusterQueue")
        if name and isinstance(local, int) and isinstance(cluster, int):
            positions[str(name)] = (local, cluster)
    return positions


@dataclass
class QueuePositions:
    """One LocalQueue's pending workloads, as last read (or why not)."""

    read_at: float
    positions: dict[str, tuple[int, int]]
    unserved: bool = False
    pending: asyncio.Future[None] | None = None


async def read_flavor(ctx: Context, name: str) -> dict[str, Any] | None:
    """A ResourceFlavor's spec, read now and kept in ``ctx.resource_flavors`` (an empty
    one for a flavor that does not exist); None when it does not exist."""
    found = await ctx.kube.get(
        f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{RESOURCE_FLAVOR_PLURAL}/{name}"
    )
    ctx.resource_flavors[name] = dict((found or {}).get("spec") or {})
    return None if found is None else ctx.resource_flavors[name]


TOPOLOGY_SECONDS = 30.0
"""How long a LocalQueue's answer to "does its ClusterQueue schedule by topology" is kept."""


async def queue_topology(ctx: Context, namespace: str, local_queue: str) -> bool:
    """Whether the ClusterQueue behind a LocalQueue has a ResourceFlavor with a Topology,
    read (LocalQueue, ClusterQueue, its flavors) at most once per ``TOPOLOGY_SECONDS`` per
    LocalQueue. A multi-host job's Workload asks for one node pool per slice only then:
    Kueue admits a pod set with a topology request on no flavor without a Topology, so
    on a queue without one such a job would stay queued for ever. Unreadable (no such
    queue yet, or no RBAC to read it): True, the placement Kueue's topology gives."""
    key = (namespace, local_queue)
    now = ctx.clock().timestamp()
    known = ctx.queue_topologies.get(key)
    if known is not None and now - known[1] < TOPOLOGY_SECONDS:
        return known[0]
    base = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}"
    found = True
    try:
        path = f"{base}/namespaces/{namespace}/{LOCAL_QUEUE_PLURAL}/{local_queue}"
        queue = await ctx.kube.get(path) or {}
        cluster_queue = str((queue.get("spec") or {}).get("clusterQueue") or "")
        body = None
        if cluster_queue:
            body = await ctx.kube.get(f"{base}/{CLUSTER_QUEUE_PLURAL}/{cluster_queue}")
        if body is not None:
            await activate(ctx, queue_checks(body))
            found = False
            for name in queue_flavors(body):
                spec = await read_flavor(ctx, name)
                if spec is not None and spec.get("topologyName"):
                    found = True
                    break
    except ApiError as exc:
        if exc.apiserver_trouble:
            raise
        if known is None:
            log.warning(
                "cannot read Kueue LocalQueue %s/%s, its ClusterQueue or flavors (%s): "
                "multi-host jobs ask it for one node pool per slice (topology-aware "
                "scheduling); grant the operator get on localqueues, clusterqueues and "
                "resourceflavors (the chart does)",
                namespace,
                local_queue,
                exc.message,
            )
    ctx.queue_topologies[key] = (found, now)
    return found


def queue_checks(cluster_queue: dict[str, Any]) -> list[str]:
    """The AdmissionChecks a ClusterQueue lists (either of Kueue's two ways)."""
    spec = cluster_queue.get("spec") or {}
    names = [str(name) for name in spec.get("admissionChecks") or []]
    strategy = (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    return names + [str(rule.get("name")) for rule in strategy if rule.get("name")]


async def queue_position(
    ctx: Context, namespace: str, local_queue: str, workload: str
) -> tuple[int, int] | None:
    """A pending Workload's (LocalQueue, ClusterQueue) position from Kueue's visibility
    API, read once per LocalQueue every ``POSITION_SECONDS`` for all its jobs; None when
    the API does not answer or the Workload is not pending."""
    key = (namespace, local_queue)
    now = ctx.clock().timestamp()
    entry: QueuePositions | None = ctx.queue_positions.get(key)
    if entry is not None and entry.pending is not None:
        await asyncio.shield(entry.pending)
        entry = ctx.queue_positions.get(key)
    elif entry is None or now - entry.read_at >= (
        UNSERVED_SECONDS if entry.unserved else POSITION_SECONDS
    ):
        pending = asyncio.get_running_loop().create_future()
        if entry is not None:
            entry.pending = pending
        else:
            ctx.queue_positions[key] = QueuePositions(0.0, {}, pending=pending)
        try:
            entry = await _read_positions(ctx, namespace, local_queue)
            ctx.queue_positions[key] = entry
        finally:
            pending.set_result(None)
    if entry is None or entry.unserved:
        return None
    return entry.positions.get(workload)


async def _read_positions(ctx: Context, namespace: str, local_queue: str) -> QueuePositions:
    path = (
        f"/apis/{VISIBILITY_GROUP}/{VISIBILITY_VERSION}/namespaces/{namespace}/localqueues/"
        f"{local_queue}/pendingworkloads"
    )
    try:
        summary = await ctx.kube.get(path)
    except ApiError as exc:
        if exc.apiserver_trouble:
            raise
        log.info(
            "Kueue's visibility API does not answer for LocalQueue %s/%s (%s): queue "
            "positions are not shown; asking again in %.0f s",
            namespace,
            local_queue,
            exc.message,
            UNSERVED_SECONDS,
        )
        return QueuePositions(ctx.clock().timestamp(), {}, unserved=True)
    if summary is None:  # the API is not served here at all
        return QueuePositions(ctx.clock().timestamp(), {}, unserved=True)
    return QueuePositions(ctx.clock().timestamp(), pending_positions(summary))


@dataclass
class WorkloadReport:
    """What the committed job status tells Kueue (``KueueAdmission.report``)."""

    release: bool = False
    """The evicted job's pods are gone: clear the admission."""
    pods_ready: bool | None = None
    finished: tuple[bool, str] | None = None
    """(succeeded, message) once the job ended."""
    suspended: bool = False
    """spec.suspend: the Workload is deactivated (``spec.active: false``) so that Kueue
    does not hold quota for a job that is not to run; reactivated on resume."""
    reclaimable: int | None = None
    """Workers of whole finished slices of the running attempt
    (``builders/workload.reclaimable_pods``): their quota can go back to Kueue."""


class Queueing:
    """The Kueue side of one reconcile of one Kueue-managed job."""

    def __init__(
        self,
        ctx: Context,
        body: dict[str, Any],
        shape: SliceShape,
        num_slices: int,
        topology: bool = True,
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.shape = shape
        self.num_slices = num_slices
        self.topology = topology
        meta = body["metadata"]
        self.namespace: str = meta["namespace"]
        self.workload = ctx.caches.workload_of_job(meta["namespace"], meta["name"])
        spec = body.get("spec") or {}
        self.own_selector = slice_node_selector(
            spec.get("template") or {}, shape, spec.get("placement")
        )
        self._pool_of = {node.name: node.pool for node in ctx.caches.tpu_nodes()}
        self.state: QueueState = self._read_state()
        self.report = WorkloadReport()

    def _read_state(self) -> QueueState:
        return queue_state(
            self.workload,
            self.shape.hosts,
            self.num_slices,
            self._pool_of,
            flavors=self.ctx.resource_flavors,
            own_selector=self.own_selector,
        )

    async def load_flavors(self) -> None:
        """Read the ResourceFlavors of a new admission (before deciding).

        One GET per flavor when the job is newly admitted (its recorded queue state is not
        yet Admitted), and on a miss (an operator restarted since). Not a watch: a job
        needs its flavors' node labels and tolerations only when it starts on an admission
        (its slices keep the pod template they were created with, as Kueue applies a
        flavor only when it starts a job), flavors are few and change rarely, and one GET
        per admission costs less than a cluster-wide watch held open for them.
        """
        if not self.state.admitted:
            return
        recorded = ((self.body.get("status") or {}).get("queue") or {}).get("state")
        names = [
            name
            for name in flavor_names(self.workload)
            if recorded != "Admitted" or name not in self.ctx.resource_flavors
        ]
        if not names:
            return
        for name in names:
            if await read_flavor(self.ctx, name) is None:
                # Kueue keeps a flavor in use (finalizer); one gone adds nothing.
                log.warning("ResourceFlavor %s of Workload %s not found", name, self.workload_name)
        self.state = self._read_state()

    @property
    def workload_name(self) -> str:
        return str(((self.workload or {}).get("metadata") or {}).get("name", ""))

    def desired(self, priority: Priority | None = None) -> dict[str, Any]:
        spec = self.body.get("spec") or {}
        return build_workload(
            self.body,
            spec.get("template") or {},
            self.shape,
            self.num_slices,
            priority=priority,
            topology=self.topology,
            placement=spec.get("placement"),
        )

    def outdated(self) -> bool:
        """A queued job whose Workload no longer describes it (spec or queue changed)."""
        if self.workload is None or self.state.admission_held:
            return False
        current_priority = (self.workload.get("spec") or {}).get("priority")
        class_name = (self.body["metadata"].get("labels") or {}).get(LABEL_PRIORITY_CLASS)
        ref = (self.workload.get("spec") or {}).get("priorityClassRef") or {}
        if (ref.get("name") or None) != (class_name or None):
            return True
        priority = Priority(class_name, int(current_priority or 0)) if class_name else None
        return workload_outdated(self.workload, self.desired(priority))

    async def act(self, now: str) -> None:
        """Bring the Workload in line with the committed job status."""
        try:
            await self._act(now)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                # Kueue wrote meanwhile: its event wakes the job with fresh data.
                log.debug(
                    "workload write of %s/%s lost a race: %s",
                    self.namespace,
                    self.workload_name,
                    exc,
                )
                return
            raise

    async def _act(self, now: str) -> None:
        if self.workload is None:
            await self._create()
            return
        if self.outdated():
            log.info("job %s changed while queued: replacing its Workload", self.workload_name)
            await self.ctx.kube.delete(
                workload_path(self.namespace, self.workload_name),
                uid=self.workload["metadata"].get("uid"),
                propagation="Background",
            )
            return
        report = self.report
        meta = self.workload["metadata"]
        active = (self.workload.get("spec") or {}).get("active", True) is not False
        ours = SUSPEND_ANNOTATION in (meta.get("annotations") or {})
        if report.suspended == active and (active or ours):
            # Deactivate for spec.suspend, or reactivate what the operator deactivated
            # (never a Workload Kueue itself deactivated).
            await self.ctx.kube.merge_patch(
                workload_path(self.namespace, meta["name"]),
                {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "annotations": {SUSPEND_ANNOTATION: "true" if active else None},
                    },
                    "spec": {"active": not active},
                },
            )
            return
        status: dict[str, Any] | None = None
        if report.release and self.state.admission_held:
            status = clear_admission(self.workload, now)
        elif report.finished is not None:
            succeeded, message = report.finished
            reason = "Succeeded" if succeeded else "Failed"
            conditions = with_condition(self.workload, FINISHED, True, reason, message, now)
            if conditions is not None:
                status = {"conditions": conditions}
        elif report.pods_ready is not None and self.state.admitted:
            ready = report.pods_ready
            conditions = with_condition(
                self.workload,
                PODS_READY,
                ready,
                "PodsReady" if ready else "WaitForPodsStart",
                "All pods reached readiness" if ready else "Not all pods are ready or succeeded",
                now,
            )
            if conditions is not None:
                status = {"conditions": conditions}
        if report.reclaimable is not None and self.state.admitted and not report.release:
            reclaimable = reclaimable_status(self.workload, report.reclaimable)
            if reclaimable is not None:
                status = {**(status or {}), **reclaimable}
        if status is not None:
            meta = self.workload["metadata"]
            await self.ctx.kube.merge_patch(
                workload_path(self.namespace, meta["name"], "status"),
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
            )

    async def _create(self) -> None:
        labels = self.body["metadata"].get("labels") or {}
        priority = None
        class_name = labels.get(LABEL_PRIORITY_CLASS)
        if class_name:
            found = await self.ctx.kube.get(
                f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{PRIORITY_CLASS_PLURAL}/{class_name}"
            )
            if found is None:
                log.warning(
                    "%s/%s: WorkloadPriorityClass %s not found; queued without priority",
                    self.namespace,
                    self.body["metadata"]["name"],
                    class_name,
                )
            else:
                priority = Priority(class_name, int(found.get("value") or 0))
        body = self.desired(priority)
        if await self.ctx.kube.create(workload_path(self.namespace), body):
            spec = body["spec"]
            self.ctx.events.emit(
                job_ref(self.body),
                "Normal",
                Reason.WORKLOAD_CREATED,
                f"Workload {body['metadata']['name']} in LocalQueue {spec['queueName']} "
                f"({spec['podSets'][0]['count']} pods"
                + (f", priority {priority.class_name}={priority.value}" if priority else "")
                + ")",
            )


def admission_of(ctx: Context, body: dict[str, Any], shape: SliceShape, slices: int) -> Admission:
    """A job's admission: Kueue's for a job labelled ``kueue.x-k8s.io/queue-name`` when the
    operator runs with ``--kueue``, none otherwise."""
    if ctx.caches.kueue and queue_name(body["metadata"]):
        return KueueAdmission(Queueing(ctx, body, shape, slices))
    return NO_ADMISSION


class KueueAdmission:
    """Kueue as a job's admission (``policies/admission.Admission``)."""

    def __init__(self, queueing: Queueing) -> None:
        self.queueing = queueing
        self.position: tuple[int, int] | None = None
        """(LocalQueue, ClusterQueue) position of the queued job (``observe``)."""
        self.slice_check: SliceCheck | None = None
        """Ironwood dynamic slicing: the slice admission check the operator serves for
        the job's Workload (``reconcile/slice_check.py``), when its queue has one."""

    async def observe(self) -> None:
        queueing = self.queueing
        await queueing.load_flavors()  # a new admission's ResourceFlavors
        self.position = None
        local_queue = queue_name(queueing.body["metadata"])
        shape = queueing.shape
        if (shape.multi_host or shape.dynamic) and local_queue and not queueing.state.admitted:
            # Whether its Workload asks for one node pool per slice (a queued job's
            # Workload is made anew if the answer changes while it waits); the queue's
            # slice admission checks are marked Active on the way.
            queueing.topology = await queue_topology(
                ctx=queueing.ctx, namespace=queueing.namespace, local_queue=local_queue
            )
        if queueing.state.state == "Queued" and queueing.workload_name and local_queue:
            self.position = await queue_position(
                queueing.ctx, queueing.namespace, local_queue, queueing.workload_name
            )
        self.slice_check = await SliceCheck.of(
            queueing.ctx, queueing.body, queueing.workload, shape, queueing.num_slices
        )
        if self.slice_check is not None:
            workload = queueing.workload or {}
            await self.slice_check.observe(
                release=queueing.state.state in ("Evicted", "Finished")
                or (workload.get("spec") or {}).get("active") is False
                or bool(workload["metadata"].get("deletionTimestamp"))
            )
            retry = self.slice_check.retrying()
            if retry is not None and queueing.state.admitted:
                # Kueue evicts the job for the check's Retry: it stops now, not counted
                # as a failure (its lost cube is no failure of the job). The admission is
                # given back only once Kueue's own eviction shows (its reason is what
                # Kueue requeues the Workload by).
                queueing.state = replace(
                    queueing.state,
                    state="Evicted",
                    reason="AdmissionCheck",
                    message=f"admission check {self.slice_check.check} is Retry: {retry}",
                    admission_held=False,
                )

    def pools(self) -> list[str] | None:
        """Node pool per slice from Kueue's topology assignment, if it made one."""
        assignment = self.queueing.state.assignment
        if assignment is None or not assignment.node_pools:
            return None
        return list(assignment.node_pools)

    def gke_slices(self) -> list[str] | None:
        """The GKE Slice of each slice, formed by the slice admission check."""
        if self.slice_check is None or not self.queueing.state.admitted:
            return None
        return self.slice_check.names

    def holds(self, facts: JobFacts, plan: Plan) -> bool:
        """Held (no pods) until Kueue admits the Workload, stopped when Kueue evicts it;
        the quota goes back once the pods are gone (PodsStopped)."""
        queueing = self.queueing
        status = plan.status
        state = queueing.state
        previous = status.queue or QueueStatus()
        assignment = state.assignment
        status.queue = QueueStatus(
            workload=queueing.workload_name,
            local_queue=queue_name(queueing.body["metadata"]) or "",
            cluster_queue=assignment.cluster_queue if assignment else previous.cluster_queue,
            state=state.state,
            reason=state.reason,
            message=state.message,
            flavors=(assignment.flavors or None) if assignment else previous.flavors,
            admissions=previous.admissions + int(state.admitted and previous.state != "Admitted"),
            position_in_local_queue=self.position[0] if self.position else None,
            position_in_cluster_queue=self.position[1] if self.position else None,
        )
        if state.admitted and state.conflict and previous.state != "Admitted":
            # Judged when an admission starts the job, as Kueue does (a running job keeps
            # its pods). The Workload is marked Finished, which frees the quota.
            message = f"cannot run on Kueue's admission: {state.conflict}"
            plan.event("Warning", Reason.ADMISSION_CONFLICT, message)
            fail(facts, plan, Reason.ADMISSION_CONFLICT, message, None)
            return True
        if state.admitted and assignment is not None:
            where = f"ClusterQueue {assignment.cluster_queue}"
            if assignment.flavors:
                where += " (" + ", ".join(f"{k}: {v}" for k, v in assignment.flavors.items()) + ")"
            if previous.state != "Admitted":
                plan.event("Normal", Reason.ADMITTED, f"admitted by Kueue to {where}")
            plan.condition(ConditionType.ADMITTED, True, Reason.ADMITTED, f"admitted to {where}")
            plan.condition(ConditionType.QUEUED, False, Reason.ADMITTED, where)
            if plan.has_condition(ConditionType.EVICTED):
                plan.condition(ConditionType.EVICTED, False, Reason.ADMITTED)
            plan.template = apply_assignment(facts.raw_spec.get("template") or {}, assignment)
            return False
        plan.act = Act.STOP
        entering = status.phase != Phase.QUEUED
        if status.attempt > 0:
            # Evicted (or queued again after running): the attempt ends, and the time until
            # Kueue admits the job again is booked as suspended.
            plan.account.suspend(facts.total_workers)
        status.phase = Phase.QUEUED
        status.node_pools = None
        status.restart_at = None
        status.ready_workers = 0
        status.ready = f"0/{facts.total_workers}"
        stopping = status.active_pods + status.terminating_pods
        if state.state == "Evicted":
            if not plan.condition_is(ConditionType.EVICTED, True):
                plan.event(
                    "Warning",
                    Reason.WORKLOAD_EVICTED,
                    f"evicted by Kueue ({state.reason}): stopping the workers; {state.message}",
                )
            plan.condition(ConditionType.EVICTED, True, state.reason, state.message)
            status.message = f"evicted by Kueue ({state.reason})"
        else:
            where = status.queue.local_queue
            if self.position is not None:
                local, cluster = self.position
                where += f" at position {local} (ClusterQueue position {cluster}; 0 is next)"
            status.message = f"queued in {where}: {state.message}"
            if state.state == "Queued" and queueing.workload_name:
                plan.after(POSITION_SECONDS)  # the position moves as others are admitted
        if stopping:
            status.message += f"; {stopping} pods still stopping"
        plan.condition(ConditionType.QUEUED, True, state.reason, state.message)
        plan.condition(ConditionType.ADMITTED, False, state.reason, state.message)
        plan.condition(ConditionType.RUNNING, False, Reason.QUEUED)
        stopped(plan)
        if state.state == "Evicted" and plan.condition_is(ConditionType.PODS_STOPPED, True):
            # The job is no longer active: Kueue may give its quota to others now.
            queueing.report.release = True
        if entering:
            plan.event("Normal", Reason.QUEUED, status.message)
        return True

    def report(self, facts: JobFacts, plan: Plan) -> None:
        """What the committed status will tell Kueue (``WorkloadReport``)."""
        queueing = self.queueing
        status = plan.status
        report = queueing.report
        report.suspended = facts.spec.suspend and status.phase not in TERMINAL_PHASES
        if status.phase in TERMINAL_PHASES:
            report.finished = (status.phase == Phase.SUCCEEDED, status.message)
        elif facts.spec.suspend:
            # The quota goes back once the pods are gone (Kueue evicts the deactivated
            # Workload; the operator clears the admission, as after any eviction).
            report.release = plan.condition_is(ConditionType.PODS_STOPPED, True)
        elif queueing.state.admitted:
            report.pods_ready = status.phase == Phase.RUNNING
            report.reclaimable = reclaimable_pods(
                facts.pods, status.attempt, facts.shape.hosts, facts.spec.num_slices
            )

    async def act(self, plan: Plan) -> None:
        if self.slice_check is not None:
            status = plan.status
            recheck = await self.slice_check.act(
                pods_gone=status.active_pods + status.terminating_pods == 0
            )
            if recheck is not None:
                plan.after(recheck)
        await self.queueing.act(stamp(plan.now))
