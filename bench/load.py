"""Benchmark: a thousand TPUJobs (about 10,000 pods) at once, against the bare client and JobSet.

A platform's busy day, not one large job: ``--jobs N`` TPUJobs of a mix a shared cluster
has, per 100 jobs

- 40 single-host ``v5litepod-4`` (1 pod; all on one shared pool of single-host VMs),
- 30 ``v5litepod-16`` (4 pods), 22 ``v5litepod-64`` (16 pods),
- 8 two-slice ``v5litepod-128`` (2 x 32 pods),

1,024 pods per 100 jobs (10,240 at 1,000), one simulate-mode node pool per multi-host
slice. Every job has ``monitoring.enabled: false``, so progress sampling adds nothing:
this measures the operator's own bookkeeping. Variants, one after the other on the same
cluster:

- ``operator``: ``tpu-operator run`` (namespace ``load-op``) gets every TPUJob, POSTed 32
  at a time; timed from the first POST to every pod Running and to every job's phase
  Running. Then, with everything Running: the operator's steady CPU, RSS and API requests
  per second over a quiet window; then it is SIGKILLed and started again, and the time
  until its caches hold everything again (its ``tpu_operator_watch_events_total`` reaches
  the number of pods and jobs: the initial listing delivers each object as an event) is
  measured, with the requests it sends in the 20 s after and the pods created or deleted
  meanwhile (a restart must not touch the pods).
- ``bare``: ``bare_client.py`` (the official client in 32 threads, raw JSON) POSTs the same
  pods (built with the operator's ``worker_pod``; without owner references, since nothing
  here collects them) and nothing else; timed from its go to every pod Running.
- ``bare-svc`` (only when asked for): the bare client's pods with, made before the go,
  the headless Service of each job the operator makes (``builders/service.py``): what any
  system whose workers find each other by DNS pays on top of the pods, the Service's
  endpoints kept by the kube-controller-manager while the pods start (JobSet makes one
  per JobSet too). With the local cluster's default loopback pod addresses, which the
  apiserver refuses in Endpoints and EndpointSlices, the controllers' writes fail and
  are retried (on GKE they succeed), so this measures their cost only roughly;
  ``--pod-addresses routed`` gives pods addresses the controllers publish, as on GKE
  (``localcluster/agent/ipam.py``; root with CAP_NET_ADMIN).
- ``jobset``: JobSet (``jobset.py``, built from its Go module; namespace ``load-js``) gets
  the same jobs as JobSets, POSTed 32 at a time: one replicated Indexed Job per slice, the
  operator's worker pod spec, a node pool per multi-host slice through JobSet's exclusive
  placement, the single-host jobs on their shared pool by node selector. Its CPU is the
  JobSet controller's plus the kube-controller-manager's (whose Job controller creates
  JobSet's pods); its RSS is measured steady and after a SIGKILL and restart.
- ``operator-b`` (only when asked for, with ``--b-source DIR``): the operator of another
  checkout, run as ``operator`` is, for an A/B in the same run.

Each variant's deletion is timed too: one collection DELETE of its top-level objects
(TPUJobs, JobSets, the bare client's pods), background propagation, until every pod is
gone. Repetitions rotate the variants' order.

Operator CPU is also sampled every ``WINDOW`` seconds while jobs start (the peak window's
share of a core). Figures are printed as Markdown tables, with ratios of the same
repetition, and written to ``bench/results/load.json`` with each trial's load average.

    .venv/bin/python bench/load.py [--jobs 1000] [--reps 1] [--steady 60] [--profile DIR]
        [--tracemalloc DIR | --mallocstats DIR]
        [--variants operator operator-b bare jobset] [--b-source DIR]
        [--pod-addresses loopback|routed]

The operator runs as its image installs it (``localcluster.images.operator_venv``: the
``operator`` extra alone), so its memory is what a cluster would see, not that of the
development environment (whose extra packages kopf imports when it finds them).
``--tracemalloc DIR`` makes it trace its allocations and write, every 20 s, what holds its
memory (``bench/memhook``); its figures are then no measure of anything else.
``--mallocstats DIR`` costs nothing measurable: every 20 s the operator appends to
``DIR/load-N.txt.log`` its RSS, the Python allocator's arenas, live and free bytes, and
glibc's bytes in use and free, which tell live objects from memory the allocators keep.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import jobset
from harness import say
from kwatch import Watch, connect, status_writes
from pod_creation import BareProcess
from scale import Components, PodCounts

from localcluster import Cluster
from localcluster.agent.ipam import POD_ADDRESSES
from localcluster.agent.kube import Kube
from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.service import headless_service
from tpu_operator.builders.wiring import PodWiring, Ports

MIX = (("v5litepod-4", 1, 40), ("v5litepod-16", 1, 30), ("v5litepod-64", 1, 22),
       ("v5litepod-128", 2, 8))  # fmt: skip
"""(slice type, slices per job, jobs per 100)."""
NAMESPACES = {
    "operator": "load-op",
    "operator-b": "load-opb",
    "bare": "load-bare",
    "bare-svc": "load-bsvc",
    "jobset": "load-js",
}
VARIANTS = tuple(NAMESPACES)
"""``operator-b``: the operator of another checkout (``--b-source``), for an A/B."""
SINGLE_POOL = "v5e-single"
ATTEMPT = contract.LABEL_RESTART_ATTEMPT
CONCURRENCY = 32
WINDOW = 10.0
"""Seconds per CPU sample while the jobs start."""
TIMEOUT = 1800.0
DRAIN_RETRY = 60.0
REQUEST_ROWS = 16
"""Rows of the apiserver's requests the report prints (the most frequent)."""
STATUS_ROWS = 10
"""How many kinds of status change the report lists per kind of object."""


@dataclass(frozen=True)
class JobPlan:
    name: str
    slice_type: str
    slices: int
    pools: tuple[str, ...]
    """The pool of each slice (the shared single-host pool for single-host jobs)."""

    @property
    def shape(self) -> catalog.SliceShape:
        accelerator, topology = catalog.short_types()[self.slice_type]
        return catalog.shape(accelerator, topology)

    @property
    def pods(self) -> int:
        return self.shape.hosts * self.slices


def plan(jobs: int) -> list[JobPlan]:
    """The jobs of the mix, ``jobs`` in all, and a pool name for each multi-host slice."""
    plans: list[JobPlan] = []
    for slice_type, slices, per_hundred in MIX:
        count = round(jobs * per_hundred / 100)
        hosts = catalog.shape(*catalog.short_types()[slice_type]).hosts
        for i in range(count):
            name = f"{slice_type.replace('v5litepod', 'e')}-{i:04d}"
            pools = tuple(SINGLE_POOL if hosts == 1 else f"{name}-s{s}" for s in range(slices))
            plans.append(JobPlan(name, slice_type, slices, pools))
    return plans


def pools_for(plans: list[JobPlan]) -> list[Any]:
    single = [p for p in plans if p.shape.hosts == 1]
    pools = []
    if single:
        accelerator, topology = catalog.short_types()[single[0].slice_type]
        pools.append(harness.tpu_pool(SINGLE_POOL, topology, len(single), accelerator))
    for p in plans:
        if p.shape.hosts == 1:
            continue
        accelerator, topology = catalog.short_types()[p.slice_type]
        pools += [harness.tpu_pool(pool, topology, p.shape.hosts, accelerator) for pool in p.pools]
    return pools


def tpujob(p: JobPlan, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": p.name, "namespace": namespace},
        "spec": {
            "slice": {"type": p.slice_type},
            "numSlices": p.slices,
            "template": copy.deepcopy(harness.WORKER_TEMPLATE),
            "monitoring": {"enabled": False},
        },
    }


def bare_pods(plans: list[JobPlan], namespace: str) -> list[dict[str, Any]]:
    """Every pod of every job as the operator builds it (owner references dropped)."""
    pods = []
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, "inert", "0")
    for p in plans:
        for index, pool in enumerate(p.pools):
            for worker in range(p.shape.hosts):
                wiring = PodWiring(
                    job_name=p.name,
                    service=p.name,
                    slice_name=contract.slice_name(p.name, index),
                    shape=p.shape,
                    num_slices=p.slices,
                    slice_index=index,
                    worker_index=worker,
                    attempt=1,
                )
                pod = worker_pod(
                    namespace=namespace,
                    wiring=wiring,
                    template=harness.WORKER_TEMPLATE,
                    owner=owner,
                    placement=NodePlacement(node_pool=pool),
                )
                del pod["metadata"]["ownerReferences"]
                pods.append(pod)
    return pods


def jobs_path(namespace: str) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.JOB_PLURAL}"


def slices_path(namespace: str) -> str:
    return (
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.SLICE_PLURAL}"
    )


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


@dataclass
class Bench:
    cluster: Cluster
    api: Kube
    plans: list[JobPlan]
    steady: float
    profile: Path | None = None
    """Where py-spy writes the operator's stacks while jobs start and while it restarts."""
    tracemalloc: Path | None = None
    """Where the operator writes what holds its memory (``bench/memhook``), if anywhere."""
    mallocstats: Path | None = None
    """Where the operator writes its allocators' statistics (``bench/memhook``), if anywhere."""
    operator_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the operator (``--operator-env``: an allocator setting, say)."""
    jobset: jobset.JobSetController | None = None
    variants: tuple[str, ...] = VARIANTS
    b_source: Path | None = None
    """The checkout the ``operator-b`` variant runs (``--b-source``)."""
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_pods(self) -> int:
        return sum(p.pods for p in self.plans)

    @property
    def total_nodes(self) -> int:
        return sum(p.vms for p in pools_for(self.plans))


class CpuSampler:
    """A process's CPU share of one core per ``WINDOW`` seconds, while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.shares: list[float] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last, at = harness.cpu_seconds(self.pid), time.monotonic()
        while True:
            await asyncio.sleep(WINDOW)
            cpu, now = harness.cpu_seconds(self.pid), time.monotonic()
            self.shares.append((cpu - last) / (now - at))
            last, at = cpu, now

    async def stop(self) -> list[float]:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.shares


async def post_all(api: Kube, bodies: list[tuple[str, dict[str, Any]]]) -> None:
    slots = asyncio.Semaphore(CONCURRENCY)

    async def post(path: str, body: dict[str, Any]) -> None:
        async with slots:
            await api.call("POST", path, body)

    await asyncio.gather(*(post(path, body) for path, body in bodies))


async def drain(
    bench: Bench, namespace: str, pods: PodCounts, paths: list[str] | None = None
) -> float:
    """Delete the variant's objects (``paths``, collection DELETEs; TPUJobs by default:
    their slices and pods go with them) and return the seconds until every pod is gone.
    A collection DELETE of thousands of objects can outlive the client's timeout and stop
    part-way (measured with 10,240 pods: 3,721 pods and 421 TPUJobs were left), so it is
    sent again every ``DRAIN_RETRY`` seconds, with the pods' own collection, until nothing
    is left."""
    paths = paths or [jobs_path(namespace)]
    started = time.monotonic()
    deadline = started + TIMEOUT
    while True:
        for path in paths:
            try:
                await bench.api.call("DELETE", f"{path}?propagationPolicy=Background", ok=(404,))
            except TimeoutError:
                say(f"collection DELETE {path} outlived the client's timeout; waiting")
        try:
            await pods.wait(lambda: pods.live == 0, DRAIN_RETRY, f"the pods of {namespace}")
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
            say(f"{pods.live} pods of {namespace} left; deleting again")
            if pods_path(namespace) not in paths:
                paths = [*paths, pods_path(namespace)]
    elapsed = time.monotonic() - started
    await pods.stop()
    return elapsed


def memhook(bench: Bench, rep: int) -> dict[str, str]:
    """The environment that makes the operator trace its memory (``--tracemalloc``) or
    report its allocators' statistics (``--mallocstats``)."""
    for directory, variable in (
        (bench.tracemalloc, "TPU_BENCH_TRACEMALLOC"),
        (bench.mallocstats, "TPU_BENCH_MALLOCSTATS"),
    ):
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            return {
                **bench.operator_env,
                "PYTHONPATH": str(Path(__file__).resolve().parent / "memhook"),
                variable: str(directory / f"load-{rep}.txt"),
            }
    return dict(bench.operator_env)


async def trial_operator(bench: Bench, rep: int, variant: str = "operator") -> dict[str, Any]:
    namespace = NAMESPACES[variant]
    operator = harness.Operator(
        bench.cluster,
        f"load-{variant}-{rep}",
        [f"--namespace={namespace}"],
        source=bench.b_source if variant == "operator-b" else None,
        env=memhook(bench, rep),
    )
    operator.start()
    # Its initial node list decoded before the go: otherwise the trial's CPU and watch
    # events would count the end of it (10,240 nodes: about a second).
    await caches_filled(operator, {"nodes": bench.total_nodes}, time.monotonic())
    pods = PodCounts(bench.api, pods_path(namespace))
    await pods.start()
    jobs = await Watch(bench.api, jobs_path(namespace)).start()
    slices = await Watch(bench.api, slices_path(namespace)).start()
    total, count = bench.total_pods, len(bench.plans)
    try:
        harness.reset_peak(operator.pid)
        cpu, requests, work = operator.cpu(), requests_of(operator), work_of(operator)
        components, served = Components(bench.cluster), await apiserver_requests(bench)
        sampler = CpuSampler(operator.pid)
        profiler = await harness.profile(
            operator.pid, bench.profile, f"load-start-{variant}-{rep}.txt"
        )
        started = time.monotonic()
        say(f"{variant}: POSTing {count} TPUJobs ({total} pods)")
        await post_all(
            bench.api, [(jobs_path(namespace), tpujob(p, namespace)) for p in bench.plans]
        )
        posted = time.monotonic() - started
        await pods.wait(lambda: pods.at("running", "1", total), TIMEOUT, "every pod Running")
        spent = components.done()
        served = await requests_spent(bench, served)

        def jobs_running() -> bool:
            return sum(1 for s in jobs.objects.values() if s.phase == "Running") == count

        job_running = await jobs.wait(jobs_running, TIMEOUT, "every job Running")
        writes = {"TPUJob": status_writes(jobs.history), "TPUSlice": status_writes(slices.history)}
        if profiler is not None:
            await profiler.stop()
        result: dict[str, Any] = {
            "posted": posted,
            "created": pods.at("created", "1", total) - started,  # type: ignore[operator]
            "running": pods.at("running", "1", total) - started,  # type: ignore[operator]
            "job_running": job_running - started,
            "components": spent,
            "apiserver_requests": served,
            "status_writes": writes,
        }
        shares = await sampler.stop()
        result["cpu"] = operator.cpu() - cpu
        result["cpu_peak_share"] = max(shares, default=None)
        result["requests"] = harness.deltas(requests_of(operator), requests)
        result["work"] = harness.deltas(work_of(operator), work)
        result["peak_mb"] = harness.memory_mb(operator.pid)["peak"]
        say(f"{variant}: all Running after {result['running']:.1f} s; steady window")
        await asyncio.sleep(10)  # paced status writes of the last jobs
        cpu, requests, at = operator.cpu(), requests_of(operator), time.monotonic()
        await asyncio.sleep(bench.steady)
        elapsed = time.monotonic() - at
        moved = harness.deltas(requests_of(operator), requests)
        result["steady"] = {
            "cpu_share": (operator.cpu() - cpu) / elapsed,
            "rss_mb": harness.memory_mb(operator.pid)["rss"],
            "requests_per_s": sum(moved.values()) / elapsed,
            "requests": moved,
        }
        result["restart"] = await restart(bench, operator, namespace, f"{variant}-{rep}")
    finally:
        await jobs.stop()
        await slices.stop()
        say(f"{variant}: deleting the jobs")
        deleted = await drain(bench, namespace, pods)
        operator.stop()
    result["delete"] = deleted
    return result


def requests_of(operator: harness.Operator) -> dict[str, float]:
    """The operator's API requests so far, by verb."""
    return harness.api_requests(read_metrics(operator))


def work_of(operator: harness.Operator) -> dict[str, float]:
    """The operator's reconciles by kind, and its watch events by kind (``events.pods``),
    so far."""
    text = read_metrics(operator)
    return {**harness.reconciles(text), **harness.event_counters(text)}


def read_metrics(operator: harness.Operator, tries: int = 5) -> str:
    """The operator's metrics, asked again when they answer late (a loaded machine: the
    read has a 5 s timeout)."""
    for _ in range(tries - 1):
        try:
            return operator.metrics()
        except OSError:
            time.sleep(1)
    return operator.metrics()


async def pod_uids(bench: Bench, namespace: str) -> set[str]:
    listed = await bench.api.call("GET", pods_path(namespace))
    return {item["metadata"]["uid"] for item in listed.get("items") or []}


async def restart(
    bench: Bench, operator: harness.Operator, namespace: str, trial: str
) -> dict[str, Any]:
    """SIGKILL the operator, start it again; how long until its caches are full again,
    what it sends in the 20 s after, and whether any pod was created or deleted."""
    pods, jobs, profile = bench.total_pods, len(bench.plans), bench.profile
    uids = await pod_uids(bench, namespace)
    operator.kill()
    started = time.monotonic()
    await asyncio.to_thread(operator.start)
    healthy = time.monotonic() - started
    profiler = await harness.profile(operator.pid, profile, f"load-restart-{trial}.txt")
    filled = await caches_filled(operator, {"pods": pods, "jobs": jobs}, started)
    if profiler is not None:
        await profiler.stop()
    before = requests_of(operator)
    await asyncio.sleep(20)
    return {
        "healthy": healthy,
        "caches_filled": filled,
        "rss_mb": harness.memory_mb(operator.pid)["rss"],
        "requests_after": harness.deltas(requests_of(operator), before),
        "pods_changed": len(uids ^ await pod_uids(bench, namespace)),
    }


async def caches_filled(
    operator: harness.Operator, wanted: dict[str, int], started: float
) -> float:
    """Seconds from ``started`` until the operator's watches delivered at least ``wanted``
    events of each kind (``pods``, ``jobs``, ``nodes``, ``slices``): its initial lists."""
    while True:
        try:
            events = harness.watch_events(operator.metrics())
        except OSError:  # timeouts included: a loaded machine answers late; ask again
            events = {}
        if all(events.get(kind, 0) >= count for kind, count in wanted.items()):
            return time.monotonic() - started
        if time.monotonic() - started > TIMEOUT:
            raise TimeoutError(f"the operator's caches after {TIMEOUT:.0f} s: {events}")
        await asyncio.sleep(0.2)


def services(plans: list[JobPlan], namespace: str) -> list[dict[str, Any]]:
    """The headless Service of each job, as the operator makes it (owner references
    dropped)."""
    owner = Owner(contract.API_VERSION, contract.JOB_KIND, "inert", "0")
    bodies = []
    for p in plans:
        service = headless_service(
            name=p.name,
            namespace=namespace,
            selector={contract.LABEL_JOB_NAME: p.name},
            owner=owner,
            ports=Ports(),
        )
        del service["metadata"]["ownerReferences"]
        bodies.append(service)
    return bodies


async def trial_bare(bench: Bench, rep: int, variant: str = "bare") -> dict[str, Any]:
    namespace = NAMESPACES[variant]
    total = bench.total_pods
    if variant == "bare-svc":
        say(f"{variant}: POSTing {len(bench.plans)} headless Services (not timed)")
        path = f"/api/v1/namespaces/{namespace}/services"
        await post_all(bench.api, [(path, body) for body in services(bench.plans, namespace)])
    pods_file = bench.cluster.directory / "load.pods.json"
    pods_file.write_text(json.dumps({"first": bare_pods(bench.plans, namespace), "second": []}))
    pods = PodCounts(bench.api, pods_path(namespace))
    await pods.start()
    bare = await BareProcess.start(bench, namespace, pods_file, "each")  # type: ignore[arg-type]
    try:
        components, served = Components(bench.cluster), await apiserver_requests(bench)
        started = await bare.go()
        go = await bare.expect("go")
        created = await bare.expect("created")
        await pods.wait(lambda: pods.at("running", "1", total), TIMEOUT, "every pod Running")
        result = {
            "created": pods.at("created", "1", total) - started,  # type: ignore[operator]
            "running": pods.at("running", "1", total) - started,  # type: ignore[operator]
            "cpu": created["cpu"] - go["cpu"],
            "components": components.done(),
            "apiserver_requests": await requests_spent(bench, served),
        }
    finally:
        if bare.process.returncode is None:
            bare.process.kill()
            await bare.process.wait()
        paths = [pods_path(namespace)]
        if variant == "bare-svc":
            # The Services first, as the operator's go with their jobs: Services left
            # while their pods go keep the endpoint controllers busy (measured: delete
            # 3.6x the bare client's, where the operator's was 1.2x).
            paths.insert(0, f"/api/v1/namespaces/{namespace}/services")
        deleted = await drain(bench, namespace, pods, paths)
    result["delete"] = deleted
    return result


def jobset_manifest(p: JobPlan, namespace: str) -> dict[str, Any]:
    """The job as JobSet runs it: one replicated Indexed Job per slice, the operator's
    worker 0 pod spec. A multi-host slice gets a node pool of its own through JobSet's
    exclusive placement; single-host jobs share their pool, pinned to it by a node
    selector (exclusive placement would give the whole pool to one of them)."""
    single = p.shape.hosts == 1
    wiring = PodWiring(
        job_name=p.name,
        service=p.name,
        slice_name=contract.slice_name(p.name, 0),
        shape=p.shape,
        num_slices=p.slices,
        slice_index=0,
        worker_index=0,
        attempt=1,
    )
    pod = worker_pod(
        namespace=namespace,
        wiring=wiring,
        template=harness.WORKER_TEMPLATE,
        owner=Owner("v1", "None", "none", "0"),
        placement=NodePlacement(node_pool=SINGLE_POOL if single else None),
    )
    return jobset.manifest(
        p.name, namespace, pod, hosts=p.shape.hosts, slices=p.slices, exclusive=not single
    )


def jobsets_path(namespace: str) -> str:
    return f"{jobset.API}/namespaces/{namespace}/jobsets"


async def apiserver_requests(bench: Bench) -> dict[str, float]:
    """The apiserver's requests so far (``apiserver_request_total``), by verb, resource
    (and subresource) and code class: ``"PATCH tpuslices/status 2xx"``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = await bench.api.call("GET", "/metrics")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = f"{labels.get('verb', '')} {resource} {labels.get('code', '?')[:1]}xx"
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def requests_spent(bench: Bench, before: dict[str, float]) -> dict[str, float]:
    """The apiserver's requests since ``before`` (``apiserver_requests``), those that moved."""
    moved = harness.deltas(await apiserver_requests(bench), before)
    return {key: value for key, value in moved.items() if value}


def controller_cpu(bench: Bench) -> tuple[float, float]:
    """JobSet's controller CPU and the kube-controller-manager's (whose Job controller
    creates and deletes JobSet's pods: JobSet's work, where the operator does its own)."""
    assert bench.jobset is not None
    kcm = int(bench.cluster.status()["processes"]["kube-controller-manager"]["pid"])
    return bench.jobset.cpu(), harness.cpu_seconds(kcm)


async def trial_jobset(bench: Bench, rep: int) -> dict[str, Any]:
    assert bench.jobset is not None
    namespace = NAMESPACES["jobset"]
    total, count = bench.total_pods, len(bench.plans)
    pods = PodCounts(bench.api, pods_path(namespace))
    await pods.start()
    controller = bench.jobset
    try:
        harness.reset_peak(controller.pid)
        own, kcm = controller_cpu(bench)
        components, served = Components(bench.cluster), await apiserver_requests(bench)
        started = time.monotonic()
        say(f"jobset: POSTing {count} JobSets ({total} pods)")
        await post_all(
            bench.api,
            [(jobsets_path(namespace), jobset_manifest(p, namespace)) for p in bench.plans],
        )
        posted = time.monotonic() - started
        await pods.wait(lambda: pods.at("running", "", total), TIMEOUT, "every pod Running")
        own_after, kcm_after = controller_cpu(bench)
        result: dict[str, Any] = {
            "posted": posted,
            "created": pods.at("created", "", total) - started,  # type: ignore[operator]
            "running": pods.at("running", "", total) - started,  # type: ignore[operator]
            "cpu": (own_after - own) + (kcm_after - kcm),
            "cpu_jobset": own_after - own,
            "peak_mb": harness.memory_mb(controller.pid)["peak"],
            "components": components.done(),
            "apiserver_requests": await requests_spent(bench, served),
        }
        say(f"jobset: all Running after {result['running']:.1f} s; steady window")
        await asyncio.sleep(10)
        own, at = controller.cpu(), time.monotonic()
        await asyncio.sleep(bench.steady)
        result["steady"] = {
            "cpu_share": (controller.cpu() - own) / (time.monotonic() - at),
            "rss_mb": harness.memory_mb(controller.pid)["rss"],
        }
        uids = await pod_uids(bench, namespace)
        await asyncio.to_thread(controller.kill_and_start)
        await asyncio.sleep(20)
        result["restart"] = {
            "rss_mb": harness.memory_mb(controller.pid)["rss"],
            "pods_changed": len(uids ^ await pod_uids(bench, namespace)),
        }
    finally:
        say("jobset: deleting the jobs")
        deleted = await drain(bench, namespace, pods, [jobsets_path(namespace)])
    result["delete"] = deleted
    return result


PAIRS = (
    ("operator", "bare"),
    ("bare-svc", "bare"),
    ("operator", "bare-svc"),
    ("operator-b", "bare"),
    ("jobset", "bare"),
    ("operator", "jobset"),
    ("operator", "operator-b"),
)
"""The ratios reported, each of the same repetition: (numerator, denominator)."""


def figures(trials: list[dict[str, Any]], pods: int) -> dict[str, Any]:
    """Per variant: medians [min-max] of the times, CPU per pod, memory; ratios of the
    same repetition against the bare client and, for the operator, against JobSet."""
    out: dict[str, Any] = {}
    by_variant: dict[str, dict[int, dict[str, Any]]] = {}
    for t in trials:
        by_variant.setdefault(t["variant"], {})[t["rep"]] = t
    for variant, mine in by_variant.items():
        runs = list(mine.values())
        out[variant] = {
            key: harness.summary([t[key] for t in runs])
            for key in ("created", "running", "cpu", "delete")
        }
        out[variant]["cpu_ms_per_pod"] = harness.summary([1000 * t["cpu"] / pods for t in runs])
        keys = {k for t in runs for k in t.get("apiserver_requests", {})}
        out[variant]["apiserver_requests"] = {
            k: harness.summary([t["apiserver_requests"].get(k, 0.0) for t in runs])["median"]
            for k in keys
        }
        names = sorted({n for t in runs for n in t.get("components", {})})
        out[variant]["components"] = {
            n: harness.summary(
                [t["components"][n]["cpu"] for t in runs if n in t.get("components", {})]
            )
            for n in names
        }
        out[variant]["status_writes"] = runs[-1].get("status_writes", {})
        if all("work" in t for t in runs):
            out[variant]["work"] = {
                k: harness.summary([t["work"][k] for t in runs])["median"] for k in runs[0]["work"]
            }
        for key, get in (
            ("peak_mb", lambda t: t["peak_mb"]),
            ("steady_rss_mb", lambda t: t["steady"]["rss_mb"]),
            ("steady_cpu_share", lambda t: t["steady"]["cpu_share"]),
            ("restart_rss_mb", lambda t: t["restart"]["rss_mb"]),
            ("restart_pods_changed", lambda t: t["restart"]["pods_changed"]),
        ):  # fmt: skip
            if all("steady" in t for t in runs):
                out[variant][key] = harness.summary([get(t) for t in runs])

    def ratios(a: str, b: str) -> None:
        common = sorted(set(by_variant.get(a, {})) & set(by_variant.get(b, {})))
        if not common:
            return
        for key in ("running", "cpu", "delete"):
            out[f"{a}_{key}_vs_{b}"] = harness.summary(
                [by_variant[a][r][key] / by_variant[b][r][key] for r in common]
            )

    for a, b in PAIRS:
        ratios(a, b)
    op = by_variant.get("operator", {})
    for key, get in (
        ("job_running", lambda t: t["job_running"]),
        ("cpu_peak_share", lambda t: t["cpu_peak_share"]),
        ("steady_requests_per_s", lambda t: t["steady"]["requests_per_s"]),
        ("restart_caches_filled", lambda t: t["restart"]["caches_filled"]),
        ("restart_requests", lambda t: sum(t["restart"]["requests_after"].values())),
    ):  # fmt: skip
        if op:
            out[key] = harness.summary([get(t) for t in op.values()])
    return out


def work_rows(
    results: dict[str, Any], variants: list[str], jobs: int, slices: int, pods: int
) -> list[list[str]]:
    """Reconciles per job and per slice, watch events per pod and per job or slice."""
    rows = (
        ("job reconciles per job", "TPUJob", jobs),
        ("slice reconciles per slice", "TPUSlice", slices),
        ("job watch events per job", "events.jobs", jobs),
        ("slice watch events per slice", "events.slices", slices),
        ("pod watch events per pod", "events.pods", pods),
        ("node watch events per pod", "events.nodes", pods),
    )
    return [
        [name, *(f"{results[v]['work'].get(key, 0.0) / count:.2f}" for v in variants)]
        for name, key, count in rows
    ]


def report(results: dict[str, Any], jobs: int, slices: int, pods: int) -> None:
    s = harness.spread
    variants = [v for v in VARIANTS if v in results]
    rows = [
        [
            v,
            s(results[v]["created"]),
            s(results[v]["running"]),
            s(results[v]["cpu_ms_per_pod"]),
            s(results[v]["delete"]),
        ]
        for v in variants
    ]
    print(f"\n{jobs} jobs, {pods} pods, applied at once (median [min-max])")
    print(
        harness.table(
            ["variant", "all pods created s", "all Running s", "CPU ms per pod", "delete s"], rows
        )
    )
    ratio_rows = [
        [f"{a} / {b}", s(results[f"{a}_running_vs_{b}"]), s(results[f"{a}_cpu_vs_{b}"]),
         s(results[f"{a}_delete_vs_{b}"])]
        for a, b in PAIRS
        if f"{a}_running_vs_{b}" in results
    ]  # fmt: skip
    print("\nRatios of the same repetition (median [min-max])")
    print(harness.table(["", "all Running", "CPU", "delete"], ratio_rows))
    memory = [
        [v, s(results[v]["peak_mb"], 0), s(results[v]["steady_rss_mb"], 0),
         s(results[v]["steady_cpu_share"], 3), s(results[v]["restart_rss_mb"], 0),
         s(results[v]["restart_pods_changed"], 0)]
        for v in ("operator", "operator-b", "jobset")
        if v in results and "peak_mb" in results[v]
    ]  # fmt: skip
    print("\nControllers: RSS MB while starting (peak), steady, after a SIGKILL and restart")
    print(
        harness.table(
            ["controller", "RSS peak", "steady RSS", "steady CPU (cores)", "RSS after restart",
             "pods created or deleted by the restart"],
            memory,
        )
    )  # fmt: skip
    names = sorted({n for v in variants for n in results[v].get("components", {})})
    if names:
        print("\nCluster CPU seconds from the go until every pod Running, by process")
        print("(benchmark: this script, with its own watches)")
        print(
            harness.table(
                ["process", *variants],
                [
                    [n, *(s(results[v]["components"].get(n, {"n": 0}), 1) for v in variants)]
                    for n in names
                ],
            )
        )
    served = {v: results[v].get("apiserver_requests", {}) for v in variants}
    keys = sorted(
        {k for counts in served.values() for k in counts},
        key=lambda k: -max(counts.get(k, 0.0) for counts in served.values()),
    )[:REQUEST_ROWS]
    if keys:
        print(f"\nThe apiserver's requests until every pod Running (median; top {REQUEST_ROWS})")
        print(
            harness.table(
                ["verb resource code", *variants],
                [[k, *(f"{served[v].get(k, 0.0):.0f}" for v in variants)] for k in keys],
            )
        )
    worked = [v for v in variants if "work" in results[v]]
    if worked:
        print("\nThe operator's work until every pod Running (median), per job, slice and pod")
        print(harness.table(["", *worked], work_rows(results, worked, jobs, slices, pods)))
    for v in worked:
        for kind, counts in results[v].get("status_writes", {}).items():
            top = list(counts.items())[:STATUS_ROWS]
            print(f"\n{v}: {kind} status changes until every job Running, by fields changed")
            print(f"(last repetition; top {STATUS_ROWS}; a condition by type, ~: message only)")
            print(harness.table(["fields", "changes"], [[k, str(n)] for k, n in top]))
    if "job_running" in results:
        print(
            harness.table(
                ["operator", "value"],
                [
                    ["every job's phase Running s", s(results["job_running"])],
                    [f"CPU, busiest {WINDOW:.0f} s window (cores)", s(results["cpu_peak_share"])],
                    ["steady API requests/s", s(results["steady_requests_per_s"])],
                    ["restart: caches filled s", s(results["restart_caches_filled"])],
                    ["restart: API requests in the 20 s after", s(results["restart_requests"], 0)],
                ],
            )
        )


async def drive(bench: Bench, reps: int) -> None:
    bench.api = connect(bench.cluster, limit=CONCURRENCY)
    try:
        trials = {
            "operator": trial_operator,
            "operator-b": lambda b, r: trial_operator(b, r, "operator-b"),
            "bare": trial_bare,
            "bare-svc": lambda b, r: trial_bare(b, r, "bare-svc"),
            "jobset": trial_jobset,
        }
        for rep in range(1, reps + 1):
            # Each variant first, middle and last in turn: the cluster's state after one
            # (its etcd, the scheduler's caches) weighs on each alike.
            shift = (rep - 1) % len(bench.variants)
            order = [*bench.variants[shift:], *bench.variants[:shift]]
            for variant in order:
                result = await trials[variant](bench, rep)
                result["load_average"] = os.getloadavg()
                bench.trials.append({"variant": variant, "rep": rep, **result})
                # Every finished trial at once: a long run that fails later keeps them.
                harness.write_results("load.partial", {"trials": bench.trials})
                say(f"rep {rep} {variant}: all Running {result['running']:.1f} s, "
                    f"CPU {result['cpu']:.1f} s, delete {result['delete']:.1f} s")  # fmt: skip
    finally:
        await bench.api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=["operator", "bare", "jobset"],
        help="what runs the jobs",
    )
    parser.add_argument("--b-source", type=Path, help="the checkout the operator-b variant runs")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady window")
    parser.add_argument(
        "--profile", type=Path, help="write py-spy stacks of the operator to this directory"
    )
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        help="the operator traces its memory and writes what holds it to this directory",
    )
    parser.add_argument(
        "--mallocstats",
        type=Path,
        help="the operator writes its allocators' statistics to this directory every 20 s",
    )
    parser.add_argument(
        "--operator-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the operator, e.g. MALLOC_ARENA_MAX=2",
    )
    parser.add_argument(
        "--pod-addresses",
        choices=sorted(POD_ADDRESSES),
        default="loopback",
        help="the local cluster's pod IPs: loopback (refused in EndpointSlices) or routed "
        "(published by the endpoint controllers as on GKE; needs CAP_NET_ADMIN)",
    )
    args = parser.parse_args()
    if "operator-b" in args.variants and args.b_source is None:
        parser.error("the operator-b variant needs --b-source")
    operator_env = dict(item.split("=", 1) for item in args.operator_env)
    plans = plan(args.jobs)
    pools = pools_for(plans)
    nodes = sum(p.vms for p in pools)
    total = sum(p.pods for p in plans)
    say(f"{len(plans)} jobs, {total} pods, {len(pools)} pools, {nodes} nodes")
    with harness.bench_cluster(
        "load",
        pools,
        grace=harness.quiet_grace(nodes),
        namespaces=[NAMESPACES[v] for v in args.variants],
        timeout=TIMEOUT,
        component_args=harness.SCALE_ARGS,  # nodes schedulable at once, as scale.py's
        pod_addresses=args.pod_addresses,
    ) as cluster:
        bench = Bench(
            cluster,
            None,  # type: ignore[arg-type]
            plans,
            args.steady,
            args.profile,
            args.tracemalloc,
            args.mallocstats,
            operator_env,
            variants=tuple(args.variants),
            b_source=args.b_source,
        )
        if "jobset" in args.variants:
            from pod_creation import start_jobset

            bench.jobset, _ = start_jobset(cluster)
            if bench.jobset is None:
                bench.variants = tuple(v for v in bench.variants if v != "jobset")
        try:
            asyncio.run(drive(bench, args.reps))
        finally:
            if bench.jobset is not None:
                bench.jobset.stop()
    results = figures(bench.trials, total)
    report(results, len(plans), sum(p.slices for p in plans), total)
    harness.write_results(
        "load",
        {
            "machine": harness.machine(),
            "settings": {
                "jobs": len(plans),
                "pods": total,
                "nodes": nodes,
                "reps": args.reps,
                "mix": MIX,
                "steady_s": args.steady,
                "pod_addresses": args.pod_addresses,
                "variants": list(bench.variants),
                "jobset_version": jobset.VERSION,
                "load_average": os.getloadavg(),
            },
            "figures": results,
            "trials": bench.trials,
        },
    )


if __name__ == "__main__":
    main()
