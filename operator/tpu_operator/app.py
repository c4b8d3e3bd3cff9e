"""The operator process: its configuration and the runtime behind the kopf handlers.

kopf's start-up handler (``tpu_operator.controllers``, which also has ``run``) builds the
``Runtime``: the API client, the watch caches, the event recorder, the two work queues
and their reconcilers, and a periodic resync. It does not import the handlers.

Every replica watches and keeps its caches (``serve``: metrics, housekeeping, the audit
that heals the caches after a watch gap, ``runtime/audit.py``); only the
one that acts runs the work queues, the progress sampler and the resync (``start``).
Without leader election that is the only replica, from start-up on; with it, ``lead``
starts acting once this replica holds the Lease and kopf has listed everything, and
halts at once when the Lease is lost (``runtime/leader.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tpu_operator import contract
from tpu_operator.placement.pools import pools_from_nodes, spares_of
from tpu_operator.reconcile.cached import JOBS, SLICES
from tpu_operator.reconcile.context import Context
from tpu_operator.reconcile.jobs import JobReconciler
from tpu_operator.reconcile.pacing import (
    LastSeen,
    intent,
    material_slice,
    reconcile_spacing,
    shared_interval,
)
from tpu_operator.reconcile.pools import slice_pool_records
from tpu_operator.reconcile.slices import SliceReconciler
from tpu_operator.reconcile.supervisors import Supervisors
from tpu_operator.reconcile.wakes import Wake, node_wake, pod_wake, routine, waiting_for_pools
from tpu_operator.runtime import collector
from tpu_operator.runtime.audit import CacheAudit, Source
from tpu_operator.runtime.caches import Caches, Index, slice_sharing
from tpu_operator.runtime.collector import DEFAULT_THRESHOLD
from tpu_operator.runtime.control import ControlChannel, load_master_key
from tpu_operator.runtime.events import EventRecorder
from tpu_operator.runtime.kube import ApiError, Kube, RequestRecord, load_configuration
from tpu_operator.runtime.leader import LeaderElector, LeaseSettings
from tpu_operator.runtime.listwatch import NODES, PODS, Kind, ListWatch, OnEvent, Store
from tpu_operator.runtime.loops import UVLOOP
from tpu_operator.runtime.metrics import OperatorMetrics
from tpu_operator.runtime.metrics_server import Gate, MetricsServer
from tpu_operator.runtime.ownership import refile, slice_job_name
from tpu_operator.runtime.sampler import ProgressSampler
from tpu_operator.runtime.workqueue import WorkQueue
from tpu_operator.state.views import NodeView, PodView, pod_view

log = logging.getLogger(__name__)
LISTED_POLL_SECONDS = 1.0
"""How often start-up asks whether any TPUJob or TPUSlice exists (``_all_listed``)."""
HALT_SECONDS = 5.0
"""How long a deposed leader waits for its reconciles and queues to stop before exiting."""
SCHEDULERS_SECONDS = 5.0
"""How often the acting replica looks for schedulers gone quiet (``wake_awaiting``): a
scheduler that stopped is reported at most this much after ``SCHEDULER_GRACE_SECONDS``."""
SERVICES = Source(
    "services",
    "services",
    label_selector=f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY_VALUE}",
)
"""The operator's headless Services, listed at start and at every resync."""


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None
    namespaces: list[str] = field(default_factory=list)
    """Namespaces to watch; empty watches the whole cluster."""
    api_concurrency: int = 32
    job_workers: int = 8
    slice_workers: int = 16
    resync_seconds: float = 300.0
    metrics_port: int | None = 8000
    health_port: int | None = 8081
    sample_concurrency: int = 64
    progress_publish_seconds: float = 30.0
    """At most one progress write per running job per this many seconds."""
    reconcile_min_interval: float = 0.1
    """Seconds between two event-triggered reconciles of one object (more for an object
    of over 1,000 pods: ``reconcile/pacing.py``)."""
    reconcile_settle: float = 1.0
    """Seconds between two reconciles of one object asked for only by routine pod events
    (pods being scheduled, starting, becoming ready): ``runtime/workqueue.py``."""
    reconcile_deadline: float | None = 120.0
    """Seconds a reconcile may run before it is cancelled and retried with backoff."""
    gc_threshold: int = DEFAULT_THRESHOLD
    """Net allocations between two young-generation garbage collections
    (``runtime/collector.py``)."""
    event_loop: str = UVLOOP
    """The event loop the operator runs on: uvloop or asyncio (``runtime/loops.py``)."""
    audit_seconds: float = 60.0
    """Seconds between two audits of the watch caches against the API, besides the ones
    after every watch gap (``runtime/audit.py``)."""
    leader_election: LeaseSettings | None = None
    """Act only while holding this Lease; None: act from start-up (one replica only)."""
    bind_address: str = "0.0.0.0"
    """Address of the metrics and health servers."""
    metrics_auth: bool = True
    """Serve metrics over HTTPS to scrapers the apiserver authenticates and authorizes
    (TokenReview, SubjectAccessReview: ``runtime/metrics_server.py``); False: plain HTTP
    to anyone."""
    metrics_cert_dir: str | None = None
    """The metrics server's certificate (``tls.crt``, ``tls.key``); unset: self-signed."""
    kueue: bool = False
    """Admit TPUJobs labelled kueue.x-k8s.io/queue-name through Kueue Workloads
    (docs/tasks/kueue.md); needs Kueue's CRDs."""
    default_provisioning: str = "ExistingPools"
    """spec.placement.provisioning of the objects that leave it unset."""
    spare_node_pool_selector: dict[str, str] = field(default_factory=dict)
    """Node labels of the spare node pools of every job (empty: none)."""
    in_place_restarts: bool = True
    """Restart gangs in place where the workers run the supervisor
    (docs/concepts/attempts-and-restarts.md)."""
    control_key_file: str | None = None
    """The master key of the control channel to the supervisors (every replica must read
    the same one); unset: a random key per process."""
    control_network_policy: list[str] = field(default_factory=list)
    """Namespaces where a NetworkPolicy guards the workers' control port (empty: none);
    pods it cannot guard are not supervised."""

    def describe(self) -> str:
        scope = ", ".join(self.namespaces) if self.namespaces else "all namespaces"
        election = (
            f"leader election on {self.leader_election.describe()}"
            if self.leader_election
            else "no leader election"
        )
        guard = "authorized scrapers" if self.metrics_auth else "open"
        return (
            f"watching {scope}; {self.api_concurrency} concurrent API requests; "
            f"metrics :{self.metrics_port} ({guard}); liveness :{self.health_port}/healthz; "
            f"{election}; "
            f"placement.provisioning default {self.default_provisioning}"
            + (
                "; spare node pools "
                + ",".join(f"{k}={v}" for k, v in sorted(self.spare_node_pool_selector.items()))
                if self.spare_node_pool_selector
                else ""
            )
        )


class Runtime:
    def __init__(
        self, config: OperatorConfig, *, slices: Index | None = None, jobs: Index | None = None
    ) -> None:
        """``slices`` and ``jobs``: indexes to read TPUSlices and TPUJobs from instead of
        the runtime's own watches (unit tests)."""
        self.config = config
        self.metrics = OperatorMetrics()
        kube_config = load_configuration(config.kubeconfig)
        self.kube = Kube(
            kube_config, concurrency=config.api_concurrency, observer=self._api_request
        )
        self._decoded = 0
        """Watch events and API answers so far: the allocator is trimmed only after some."""
        pods, nodes = PODS.store(), NODES.store()
        slice_store, job_store = SLICES.store(), JOBS.store()
        self.caches = Caches(
            pods=pods,
            slices=slice_store if slices is None else slices,
            jobs=job_store if jobs is None else jobs,
            nodes=nodes,
        )

        def watch(kind: Kind, store: Store, on_event: OnEvent, **options: Any) -> ListWatch:
            counter = self.metrics.watch_events.labels(kind.name)

            def count() -> None:
                counter.inc()
                self._decoded += 1

            return ListWatch(kind, self.kube, kube_config, store, on_event, count=count, **options)

        owners = self.caches.owners
        self.pod_watch = watch(
            PODS,
            pods,
            self.pod_event,
            namespaces=config.namespaces,
            view=lambda document: pod_view(document, owners.ownership, owners.carried),
            on_replace=self.pod_replaced,
        )
        self.node_watch = watch(NODES, nodes, self.node_event, on_listed=self._nodes_listed)
        self.audit = CacheAudit(
            self.kube,
            self.caches,
            self,
            namespaces=config.namespaces,
            period=config.audit_seconds,
        )
        self.slice_watch = watch(
            SLICES,
            slice_store,
            self.slice_event,
            namespaces=config.namespaces,
            on_listed=lambda _: self.audit.listed("slices"),
        )
        self.job_watch = watch(
            JOBS,
            job_store,
            self.job_event,
            namespaces=config.namespaces,
            on_listed=lambda _: self.audit.listed("jobs"),
        )
        self.events = EventRecorder(self.kube)
        self.jobs: WorkQueue[tuple[str, str]] = WorkQueue(
            "TPUJob",
            self._reconcile_job,
            workers=config.job_workers,
            observer=self.metrics.reconciled,
            min_interval=config.reconcile_min_interval,
            spacing=self._job_spacing,
            settle=config.reconcile_settle,
            quiet=(ApiError,),
            deadline=config.reconcile_deadline,
        )
        self.slices: WorkQueue[tuple[str, str]] = WorkQueue(
            "TPUSlice",
            self._reconcile_slice,
            workers=config.slice_workers,
            observer=self.metrics.reconciled,
            min_interval=config.reconcile_min_interval,
            spacing=self._slice_spacing,
            settle=config.reconcile_settle,
            settle_of=self._slice_settle,
            quiet=(ApiError,),
            deadline=config.reconcile_deadline,
        )
        self.context = Context(
            kube=self.kube,
            caches=self.caches,
            events=self.events,
            jobs=self.jobs,
            slices=self.slices,
            metrics=self.metrics,
            default_provisioning=config.default_provisioning,
            default_spares=spares_of(match_labels=config.spare_node_pool_selector),
            control_network_policy=(
                frozenset(config.control_network_policy) if config.control_network_policy else None
            ),
        )
        if config.in_place_restarts:
            self.control = ControlChannel(load_master_key(config.control_key_file))
            self.context.supervisors = Supervisors(self.control, self.kube)
        self.sampler = ProgressSampler(
            self.caches,
            self.jobs.add,
            concurrency=config.sample_concurrency,
            publish_interval=config.progress_publish_seconds,
        )
        self.context.progress = self.sampler
        self.metrics.watch_sampler(self.sampler)
        self.metrics.watch_queues(self.depths)
        self.job_reconciler = JobReconciler(self.context)
        self.slice_reconciler = SliceReconciler(self.context)
        self._resync_task: asyncio.Task[None] | None = None
        self._schedulers_task: asyncio.Task[None] | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._trim_task: asyncio.Task[None] | None = None
        self.acting = False
        """Whether this replica reconciles (the event handlers enqueue only then)."""
        self.listed = asyncio.Event()
        """Set by the first kopf event handler call (Kueue Workloads, ``--kueue``): kopf
        calls none before every index has its initial listing."""
        self.own_listed = asyncio.Event()
        """Set once the TPUSlice, TPUJob, node and pod watches have their initial
        listings (``watch``)."""
        self._may_act: Callable[[], bool] = lambda: True
        self._slices_seen: LastSeen[tuple[str, str]] = LastSeen()
        """What each job-owned slice last said that its job reads (``slice_news``)."""
        self._intents: LastSeen[tuple[str, str, str]] = LastSeen()
        """Each TPUJob's and TPUSlice's last seen metadata and generation (``asks``)."""
        self.metrics.watch_phases(
            lambda: (list(self.caches.jobs()), list(self.caches.all_slices()))
        )
        self.metrics.watch_pools(lambda: self.caches.from_nodes("pools", pools_from_nodes).values())
        self.metrics.watch_leadership(lambda: self.acting)
        self.metrics_server: MetricsServer | None = None
        if config.metrics_port:
            gate = (
                Gate(self._review, counted=self.metrics.metrics_auth_review)
                if config.metrics_auth
                else None
            )
            self.metrics_server = MetricsServer(
                self.metrics.registry,
                config.metrics_port,
                config.bind_address,
                gate=gate,
                cert_dir=config.metrics_cert_dir,
            )

    async def _review(self, path: str, body: Any) -> Any:
        """A TokenReview or SubjectAccessReview for the metrics endpoint's gate."""
        return await self.kube.request("POST", path, body=body)

    def _api_request(self, record: RequestRecord) -> None:
        self._decoded += 1
        self.metrics.api_request(record)
        self.audit.api_request(record)

    def _job_spacing(self, key: tuple[str, str], changes: int | None) -> float:
        pods = self.caches.count_pods_of_job(*key)
        return reconcile_spacing(pods, self.config.reconcile_min_interval, changes)

    def _slice_spacing(self, key: tuple[str, str], changes: int | None) -> float:
        pods = self.caches.count_pods_of_slice(*key)
        return reconcile_spacing(pods, self.config.reconcile_min_interval, changes)

    def _slice_settle(self, key: tuple[str, str]) -> float:
        """How long routine progress of a slice waits: a slice of an N-slice job, whose
        counters its job's status carries and whose counter writes wait N times as long
        (``reconcile/slices.py``), settles N times as long too (``pacing.shared_interval``).
        What such a reconcile finds is counters, and those would only be held back."""
        sharing = slice_sharing(self.caches.slice(*key) or {})
        return shared_interval(self.config.reconcile_settle, sharing)

    async def _reconcile_job(self, key: tuple[str, str]) -> float | None:
        if not self._may_act():
            return None  # the Lease is lost: halting
        return await self.job_reconciler(key)

    async def _reconcile_slice(self, key: tuple[str, str]) -> float | None:
        if not self._may_act():
            return None
        return await self.slice_reconciler(key)

    @property
    def _watches(self) -> tuple[ListWatch, ...]:
        """In the order of their first listings: the TPUSlices before the pods, so that
        each pod is filed as its owner's from the start (``runtime/ownership.py``)."""
        return (self.slice_watch, self.job_watch, self.node_watch, self.pod_watch)

    async def watch(self) -> None:
        """List the TPUSlices, TPUJobs, TPU nodes and worker pods (retrying until the API
        answers), then watch them (``runtime/listwatch.py``). Nothing reconciles before
        every list is complete (``act``, ``lead``), so no reconcile sees a partial cache
        and creates a pod or slice that exists."""
        started = time.monotonic()
        for watch in self._watches:
            await watch.list_all()
        log.info(
            "listed %d TPUSlices, %d TPUJobs, %d TPU nodes and %d worker pods in %.1f s",
            *(watch.store.objects for watch in self._watches),
            time.monotonic() - started,
        )
        self.own_listed.set()
        await collector.trim_off_loop()  # the pages are decoded and gone: hand their memory back
        for watch in self._watches:
            watch.start()

    async def act(self) -> None:
        """Without leader election: act once every cache has its initial listing."""
        await self._all_listed()
        self.start()

    def pod_event(self, type: str | None, view: PodView, *, refiled: bool = False) -> None:
        """A worker pod changed (``type`` None: listed): keep its tombstone, and wake what
        the gang's rules say (``reconcile/wakes.pod_wake``). ``refiled``: the pod did not
        change, its slice's record did (``slice_known``), and that record's event woke the
        slice and its job already: what the pod asks is routine progress at most. When a
        restart writes that 63 slices of 4,096 hosts carry their pods in place, each of
        the 4,032 pods otherwise looked like the last of its attempt to turn ready, and
        woke its slice urgently, ahead of the slice the restart recreates."""
        if view.own:
            if type == "DELETED":
                self.caches.tombstones.record(view)  # a standby keeps them too
            elif view.pool is not None:
                self.context.pods_in_flight.seen(view)
        if self.acting:
            wake = pod_wake(self.caches, type, view)
            self._wake(routine(wake) if refiled else wake)

    def pod_replaced(self, old: PodView, new: PodView) -> None:
        """A worker pod's cached view changed: a scheduler may have looked at it."""
        self.caches.schedulers.replaced(old, new, self.context.clock())

    def _wake(self, wake: Wake) -> None:
        """Enqueue what a watch event asks for."""
        for ask in wake.slices:
            self.slices.add(ask.key, urgent=ask.urgent, routine=ask.routine)
        for ask in wake.jobs:
            self.jobs.add(ask.key, urgent=ask.urgent, routine=ask.routine, at_once=ask.at_once)
        if wake.waiting:
            self.wake_waiting()

    def job_event(self, type: str | None, body: dict[str, Any]) -> None:
        """A TPUJob changed (``type`` None: listed): the sampler follows it, and it is
        reconciled if it asks (``asks``)."""
        if not self.acting:
            return
        self.sampler.job_changed(type, body)
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if self.asks("jobs", key, type, body):
            self.jobs.add(key)

    def slice_event(self, type: str | None, body: dict[str, Any]) -> None:
        """A TPUSlice changed (``type`` None: listed): pods seen before it are filed again
        (``slice_known``); it and its job are reconciled if the change asks for it."""
        if type != "DELETED":
            self.slice_known(body)
        if not self.acting:
            return
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if self.asks("slices", key, type, body):
            self.slices.add(key)
        if type == "DELETED":
            self.slice_gone(body)
        job = slice_job_name(body)
        if job and self.slice_news(key, type, body):
            self.jobs.add((key[0], job))

    def slice_known(self, body: Any) -> None:
        """A TPUSlice was listed or changed (``slice_event``): pods seen before it, filed as
        not the operator's, are its workers after all; and its pods belong to the attempt
        its record says they were carried into (``runtime/ownership.py``)."""
        owners = self.caches.owners
        if not owners.known(body):
            return
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        store = self.pod_watch.store
        # Its pods seen before it (filed under its UID) and its own (under its name).
        seen = list(store.get(("owner", uid), ()))
        seen += store.get(("slice", meta.get("namespace"), meta.get("name")), ())
        for view in seen:
            if view.owner != uid:
                continue
            refiled = refile(view, owners)
            if refiled is not view:
                store.put((view.namespace, view.name, view.uid), refiled)
                self.pod_event(None, refiled, refiled=True)

    def asks(self, kind: str, key: tuple[str, str], type: str | None, body: Any) -> bool:
        """Whether an event of a TPUJob or TPUSlice asks for its own reconcile: not when
        it only shows the status the operator wrote (``reconcile/pacing.py``, ``intent``).
        Each status write would otherwise make one more reconcile of its object that
        finds nothing to do: for a slice, about one per pod event while its pods start.
        Listings (``type`` None), new and deleted objects always ask."""
        changed = self._intents.changed((kind, *key), type, intent(body))
        return changed or type != "MODIFIED"

    def slice_news(self, key: tuple[str, str], type: str | None, body: Any) -> bool:
        """Whether a job-owned slice's event says something its job reads: not while
        only its counters moved. Those follow the pod events that woke the job already,
        and would otherwise count as changes of a large job (``reconcile/pacing.py``):
        199 slices writing their counts every second would keep it reconciled as often
        as its spacing allows."""
        return self._slices_seen.changed(key, type, material_slice(body))

    def node_event(self, type: str | None, view: NodeView) -> None:
        """A TPU node changed: its pods' slices and jobs, and whatever waits for a pool,
        look again (after a list, ``_nodes_listed`` wakes everything once instead)."""
        self.caches.nodes_changed()
        if not self.acting or type is None:
            return
        self._wake(node_wake(self.caches, type, view))

    def _nodes_listed(self, _count: int) -> None:
        self.caches.nodes_changed()
        if self.acting:
            self.enqueue_all()  # every node listed again: every pod's node may have changed

    async def serve(self) -> None:
        """What every replica runs, leader or standby: metrics and cache housekeeping."""
        if self.metrics_server is not None:
            await self.metrics_server.start()
        self.caches.schedulers.watching(self.context.clock())
        self._housekeeping_task = asyncio.create_task(self._housekeeping(), name="housekeeping")
        self._trim_task = asyncio.create_task(self._trim(), name="trim")
        self.audit.start()  # a standby's caches must heal too

    def start(self) -> None:
        """Act: post events, sample progress, reconcile, resync. Everything in the caches
        is queued once (a new leader looks at every object, as after a restart)."""
        self.acting = True
        self.events.start()
        self.sampler.start()
        self.jobs.start()
        self.slices.start()
        self._resync_task = asyncio.create_task(self._resync(), name="resync")
        self._schedulers_task = asyncio.create_task(self._schedulers(), name="schedulers")
        self.enqueue_all()  # not after the Services' listing: a failover must not wait

    async def lead(self, elector: LeaderElector, on_lost: Callable[[str], None]) -> None:
        """As a candidate: act from when this replica holds the Lease and the caches are
        listed until the Lease is lost; then halt and call ``on_lost`` (which ends the
        process, as controller-runtime does: a deposed leader comes back as a standby)."""
        self._may_act = lambda: elector.leading
        if not await elector.wait_leading():
            on_lost("the election ended before this replica led")
            return
        lost = asyncio.create_task(elector.wait_lost(), name="leader-fence")
        listed = asyncio.create_task(self._all_listed(), name="caches-listed")
        try:
            await asyncio.wait({lost, listed}, return_when=asyncio.FIRST_COMPLETED)
            if not lost.done():
                self.start()
                log.info("acting as the leader")
            reason = await lost
        finally:
            listed.cancel()
            lost.cancel()
        log.error("lost the leadership (%s): stopping at once and exiting", reason)
        # A deposed leader must exit whatever its reconciles do (they are fenced already:
        # ``_may_act``); a halt that does not finish in time is left behind, not awaited.
        halting = asyncio.ensure_future(self.halt())
        done, _ = await asyncio.wait({halting}, timeout=HALT_SECONDS)
        if not done:
            log.error("halting took over %.0f s; exiting without waiting for it", HALT_SECONDS)
        on_lost(reason)

    async def _all_listed(self) -> None:
        """Until the TPUSlice, TPUJob, node and pod lists are complete, and, with Kueue,
        kopf has listed the Workloads: kopf calls its first handler (``listed``) once its
        index has its listing, but when no Workload exists it calls none, so the API is
        asked whether any TPUJob exists (none: nothing waits for a Workload)."""
        await self.own_listed.wait()
        while self.caches.kueue and not self.listed.is_set():
            try:
                if not await self.audit.any_exist(("jobs",)):
                    return  # nothing to reconcile yet; a new object comes with an event
            except ApiError as exc:
                log.warning("listing TPUJobs failed: %s; trying again", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listed.wait(), timeout=LISTED_POLL_SECONDS)

    async def halt(self) -> None:
        """Stop acting at once: reconciles are cancelled, unposted events dropped."""
        if not self.acting:
            return
        self.acting = False
        self._cancel_acting_tasks()
        await asyncio.gather(
            self.jobs.stop(), self.slices.stop(), self.sampler.stop(), self.events.stop()
        )
        if self.context.supervisors is not None:
            await self.context.supervisors.channel.close()

    def _cancel_acting_tasks(self) -> None:
        """Cancel the periodic tasks only the acting replica runs (``start``)."""
        for task in (self._resync_task, self._schedulers_task):
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        for task in (self._housekeeping_task, self._trim_task):
            if task is not None:
                task.cancel()
        await self.audit.stop()
        for watch in reversed(self._watches):
            await watch.stop()
        if self.acting:
            self.acting = False
            self._cancel_acting_tasks()
            await self.sampler.stop()
            await self.jobs.stop()
            await self.slices.stop()
            try:
                await asyncio.wait_for(self.events.flush(), timeout=3)
            except TimeoutError:
                log.warning("stopping with %d events not posted", self.events.dropped)
            await self.events.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.kube.close()

    def enqueue_all(self) -> None:
        for job in list(self.caches.jobs()):
            self.jobs.add((job["metadata"]["namespace"], job["metadata"]["name"]))
        for body in list(self.caches.all_slices()):
            self.slices.add((body["metadata"]["namespace"], body["metadata"]["name"]))

    def slice_gone(self, body: Any) -> None:
        """A TPUSlice was deleted: its pods stay the operator's while they go
        (``runtime/ownership.py``), and a pool its record held and no pod is on frees with
        it (its pods, if any, wake the waiters when the last one goes: ``pod_event``)."""
        self.caches.owners.gone((body.get("metadata") or {}).get("uid") or "")
        pools = slice_pool_records(body)
        if any(not any(p.active for p in self.caches.pods_in_pool(pool)) for pool in pools):
            self.wake_waiting()

    def wake_waiting(self) -> None:
        """Node changes and pods leaving a pool may free or add pools: look again at the
        jobs and standalone slices that may wait for one."""
        for kind, key in waiting_for_pools(self.caches):
            (self.jobs if kind == "jobs" else self.slices).add(key)

    def wake_awaiting(self, now: dt.datetime) -> None:
        """Look again at the jobs and slices whose pods await a scheduler that has looked
        at no pod of the operator's for ``SCHEDULER_GRACE_SECONDS``: they report it
        (``NoScheduler``). While it keeps looking at others, none of them looks again on
        a timer of its own (``state/gang.scheduler_wait``)."""
        for name in self.caches.schedulers.gone_quiet(now, self.caches.awaited_schedulers):
            slices: set[tuple[str, str]] = set()
            jobs: set[tuple[str, str]] = set()
            for pod in self.caches.awaiting(name):
                slices.add((pod.namespace, pod.slice_name))
                if pod.job_owned:
                    jobs.add((pod.namespace, pod.job_name))
            for key in slices:
                self.slices.add(key)
            for key in jobs:
                self.jobs.add(key)

    async def _schedulers(self) -> None:
        while True:
            await asyncio.sleep(SCHEDULERS_SECONDS)
            self.wake_awaiting(self.context.clock())

    def depths(self) -> dict[str, int]:
        return {"TPUJob": len(self.jobs), "TPUSlice": len(self.slices)}

    async def _resync(self) -> None:
        """Periodically look at everything again: a safety net for missed events. The
        operator's Services are listed first thing (when it starts to act) and at every
        resync, rather than created again by every owner to learn that they exist."""
        await self._list_services()
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            await self._list_services()
            self.enqueue_all()

    async def _list_services(self) -> None:
        """Refresh ``Context.services`` from one paged metadata list per namespace."""
        listed: list[dict[str, Any]] = []
        try:
            for path in SERVICES.paths(self.config.namespaces):
                listed += await self.kube.list_metadata(
                    path, label_selector=SERVICES.label_selector
                )
        except ApiError as exc:
            log.warning(
                "listing the operator's Services failed (%s); each is looked at again at "
                "its owner's next reconcile",
                exc,
            )
            listed = []  # none known: every owner looks at its own again
        self.context.known_services(listed)

    async def _housekeeping(self) -> None:
        """Forget old tombstones (a standby records them too, for when it leads) and what
        was seen of objects that are gone."""
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            self.caches.tombstones.prune()
            self.caches.owners.prune()
            self._forget_gone()

    async def _trim(self) -> None:
        """Hand the allocator's free pages back every ``collector.TRIM_SECONDS`` while
        anything is decoded (``runtime/collector.py``); in a thread, since a trim walks
        the heap."""
        trimmed_at = self._decoded
        while True:
            await asyncio.sleep(collector.TRIM_SECONDS)
            if self._decoded != trimmed_at:
                trimmed_at = self._decoded
                started = time.monotonic()
                await collector.trim_off_loop()
                log.debug("allocator trimmed in %.3f s", time.monotonic() - started)

    def _forget_gone(self) -> None:
        """Drop what ``asks`` and ``slice_news`` remember of TPUJobs and TPUSlices no longer
        cached (deleted while a watch was away, so no DELETED event said so)."""

        def names(bodies: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
            return {(b["metadata"]["namespace"], b["metadata"]["name"]) for b in bodies}

        cached = {"slices": names(self.caches.all_slices()), "jobs": names(self.caches.jobs())}
        self._slices_seen.keep_only(lambda key: key in cached["slices"])
        self._intents.keep_only(lambda seen: seen[1:] in cached[seen[0]])  # (kind, ns, name)
