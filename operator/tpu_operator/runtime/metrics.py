"""Prometheus metrics of the operator (prefix ``tpu_operator_``, base units).

Counts of jobs and slices by phase are computed at scrape time from the watch caches, so
they are exact and cost nothing between scrapes.
"""

from __future__ import annotations

import platform
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tpu_operator import __version__
from tpu_operator.api.status import Phase
from tpu_operator.placement.pools import PoolView
from tpu_operator.runtime.kube import RequestRecord

PHASES = tuple(Phase)
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STARTUP_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class PhaseCollector(Collector):
    """Counts by phase and per-job state, read from the caches at scrape time.

    Per job (labels namespace, tpujob; one series per existing TPUJob, like
    kube-state-metrics): tpu_operator_job_phase (1 for the current phase),
    tpu_operator_job_restarts, tpu_operator_job_goodput, tpu_operator_job_step.
    """

    def __init__(
        self,
        objects: Callable[[], tuple[Iterable[dict], Iterable[dict]]],
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self._objects = objects
        self._active = active

    def collect(self) -> Iterator[Metric]:
        # Only the replica that acts reports the cluster's state: a standby's caches show
        # the same objects, and sums over both replicas would count every job twice.
        if not self._active():
            return
        jobs, slices = self._objects()
        jobs = list(jobs)
        for name, items, help_text in (
            ("tpu_operator_jobs", jobs, "TPUJobs by phase"),
            ("tpu_operator_slices", slices, "TPUSlices by phase"),
        ):
            tally = Tally((o.get("status") or {}).get("phase") or Phase.PENDING for o in items)
            family = GaugeMetricFamily(name, help_text, labels=["phase"])
            for phase in PHASES:
                family.add_metric([phase], tally.get(phase, 0))
            yield family
        labels = ["namespace", "tpujob"]
        job_phase = GaugeMetricFamily(
            "tpu_operator_job_phase", "1 for the TPUJob's current phase", labels=[*labels, "phase"]
        )
        restarts = GaugeMetricFamily(
            "tpu_operator_job_restarts", "Gang restarts of the TPUJob so far", labels=labels
        )
        goodput = GaugeMetricFamily(
            "tpu_operator_job_goodput",
            "Productive step time / wall time since the TPUJob was created",
            labels=labels,
        )
        step = GaugeMetricFamily(
            "tpu_operator_job_step", "Training step of the TPUJob (from its status)", labels=labels
        )
        for job in jobs:
            meta, status = job["metadata"], job.get("status") or {}
            key = [meta["namespace"], meta["name"]]
            job_phase.add_metric([*key, status.get("phase") or Phase.PENDING], 1)
            restarts.add_metric(key, status.get("restarts", 0))
            if status.get("goodput"):
                goodput.add_metric(key, status["goodput"].get("fraction", 0.0))
            if (status.get("progress") or {}).get("step") is not None:
                step.add_metric(key, status["progress"]["step"])
        yield from (job_phase, restarts, goodput, step)


class PoolCollector(Collector):
    """TPU node pools with VMs that are not ready or cordoned, read from the node cache at
    scrape time. Such a pool is given to no slice until every VM is ready, and a slice a
    restart recreates moves off it (``placement/pools.pool_unhealthy``)."""

    def __init__(self, pools: Callable[[], Iterable[PoolView]], active: Callable[[], bool]):
        self._pools = pools
        self._active = active

    def collect(self) -> Iterator[Metric]:
        if not self._active():
            return
        family = GaugeMetricFamily(
            "tpu_operator_node_pool_unready_vms",
            "VMs not ready or cordoned, per TPU node pool that has any (such a pool is given "
            "to no slice until healthy)",
            labels=["node_pool"],
        )
        for pool in self._pools():
            if pool.ready < pool.nodes:
                family.add_metric([pool.name], pool.nodes - pool.ready)
        yield family


class SamplerCounts(Protocol):
    """What the metrics read from the progress sampler."""

    @property
    def reads(self) -> int: ...
    @property
    def failures(self) -> int: ...


class SamplerCollector(Collector):
    """The progress sampler's own counters, read at scrape time."""

    def __init__(self, sampler: SamplerCounts) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "tpu_operator_worker_metric_reads",
            "Worker metrics endpoint reads by the progress sampler",
            value=float(self._sampler.reads),
        )
        yield CounterMetricFamily(
            "tpu_operator_worker_metric_read_failures",
            "Worker metrics endpoint reads that failed (unreachable, timeout, bad reply)",
            value=float(self._sampler.failures),
        )


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconcile_seconds = Histogram(
            "tpu_operator_reconcile_duration_seconds",
            "Time to reconcile one object",
            ["kind"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "tpu_operator_reconcile_errors_total",
            "Reconciles that raised and were retried",
            ["kind"],
            registry=r,
        )
        self.pod_create_seconds = Histogram(
            "tpu_operator_pod_create_duration_seconds",
            "Latency of one worker pod create request",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.time_to_running_seconds = Histogram(
            "tpu_operator_job_time_to_running_seconds",
            "Time from TPUJob creation to all workers Running (first attempt)",
            buckets=STARTUP_BUCKETS,
            registry=r,
        )
        self.wait_seconds = Histogram(
            "tpu_operator_wait_seconds",
            "Time TPUJobs waited for capacity, by what for (the PodsScheduled or Queued "
            "condition's reason), observed when each wait ends",
            ["reason"],
            buckets=STARTUP_BUCKETS,
            registry=r,
        )
        self.restarts = Counter(
            "tpu_operator_restarts_total",
            "Gang restarts by kind (TPUJob, TPUSlice) and reason (what ended the attempt)",
            ["kind", "reason"],
            registry=r,
        )
        self.slice_moves = Counter(
            "tpu_operator_slice_moves_total",
            "Slices a restart moved off a broken node pool, by where to: spare (a spare "
            "pool, spec.placement.spares or --spare-node-pool-selector) or pool (another "
            "free pool)",
            ["to"],
            registry=r,
        )
        self.api_requests = Counter(
            "tpu_operator_api_requests_total",
            "Kubernetes API requests by verb and HTTP code (0: no response)",
            ["verb", "code"],
            registry=r,
        )
        self.api_errors = Counter(
            "tpu_operator_api_errors_total",
            "Kubernetes API requests that failed, by verb and HTTP code (0: no response)",
            ["verb", "code"],
            registry=r,
        )
        self.api_seconds = Histogram(
            "tpu_operator_api_request_duration_seconds",
            "Kubernetes API request latency",
            ["verb"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.watch_events = Counter(
            "tpu_operator_watch_events_total",
            "Watch events received, by kind (pods, nodes, slices, jobs; relisted objects too)",
            ["kind"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "tpu_operator_workqueue_depth", "Keys waiting to be reconciled", ["queue"], registry=r
        )
        build = Gauge(
            "tpu_operator_build_info",
            "Build information (value is 1)",
            ["version", "python"],
            registry=r,
        )
        build.labels(__version__, platform.python_version()).set(1)
        self.metrics_auth_reviews = Counter(
            "tpu_operator_metrics_auth_reviews_total",
            "Reviews the metrics endpoint asked of the apiserver to let a scraper in, by "
            "review (TokenReview, SubjectAccessReview) and result (authenticated, "
            "unauthenticated, allowed, denied, error); cached answers are not counted",
            ["review", "result"],
            registry=r,
        )
        self.leader = Gauge(
            "tpu_operator_leader",
            "1 if this replica acts (holds the leader Lease, or runs without leader election)",
            registry=r,
        )
        self._leading: Callable[[], bool] = lambda: True

    # reconcile-side hooks (tpu_operator.reconcile.context.Metrics)
    def pod_created(self, seconds: float) -> None:
        self.pod_create_seconds.observe(seconds)

    def restart(self, kind: str, reason: str) -> None:
        self.restarts.labels(kind, reason).inc()

    def waited(self, reason: str, seconds: float) -> None:
        self.wait_seconds.labels(reason).observe(seconds)

    def slice_moved(self, to: str) -> None:
        self.slice_moves.labels(to).inc()

    def time_to_running(self, seconds: float) -> None:
        self.time_to_running_seconds.observe(seconds)

    # runtime hooks
    def api_request(self, record: RequestRecord) -> None:
        code = str(record.code)
        self.api_requests.labels(record.verb, code).inc()
        self.api_seconds.labels(record.verb).observe(record.seconds)
        if record.code == 0 or record.code >= 400:
            self.api_errors.labels(record.verb, code).inc()

    def reconciled(self, queue: str, seconds: float, ok: bool) -> None:
        self.reconcile_seconds.labels(queue).observe(seconds)
        if not ok:
            self.reconcile_errors.labels(queue).inc()

    def watch_sampler(self, sampler: SamplerCounts) -> None:
        """Reads of worker metrics endpoints (counted by the sampler itself)."""
        self.registry.register(SamplerCollector(sampler))

    def watch_queues(self, depths: Callable[[], dict[str, int]]) -> None:
        def depth(queue: str) -> Callable[[], float]:
            return lambda: float(depths()[queue])

        for queue in ("TPUJob", "TPUSlice"):
            self.queue_depth.labels(queue).set_function(depth(queue))

    def watch_phases(self, objects: Callable[[], tuple[Iterable[dict], Iterable[dict]]]) -> None:
        """Jobs and slices by phase and per job, reported by the acting replica only."""
        self.registry.register(PhaseCollector(objects, lambda: self._leading()))

    def watch_pools(self, pools: Callable[[], Iterable[PoolView]]) -> None:
        """Unhealthy TPU node pools, reported by the acting replica only."""
        self.registry.register(PoolCollector(pools, lambda: self._leading()))

    def watch_leadership(self, leading: Callable[[], bool]) -> None:
        """``tpu_operator_leader``; a standby (``leading`` false) reports no cluster state."""
        self._leading = leading
        self.leader.set_function(lambda: float(leading()))

    def metrics_auth_review(self, review: str, result: str) -> None:
        self.metrics_auth_reviews.labels(review, result).inc()
