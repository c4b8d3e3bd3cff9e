"""Benchmark: one multislice TPUJob of 256 to 12,736 hosts, operator against the bare client.

The shape of the largest published JAX training run (199 slices of TPU v5e 16x16, 50,944
chips, 12,736 hosts), written as a user writes it::

    spec:
      slice: {type: v5litepod-256}     # tpu-v5-lite-podslice 16x16: 64 hosts of 4 chips
      numSlices: 199

Sizes (``--sizes``): 64 hosts (1 slice; also the warm-up), 256 (4 slices), 1,024 (16),
4,096 (64) and 12,736 (199). The local control plane gets one simulate-mode node pool of
64 VMs per slice of the largest size (``v5e-000``, ``v5e-001``, ...; pods go Running as
soon as they are bound, no processes), with a node-monitor grace period long enough that
the nodes' lease renewals stay near 2 a second in all (``harness.quiet_grace``). Per size
and repetition, the variants run one after the other (order alternating):

- ``operator``: ``tpu-operator run --no-in-place-restarts`` (a subprocess watching
  namespace scale-op) gets the TPUJob; phases are timed from the POST of the TPUJob, the
  kill of a worker and the DELETE of the TPUJob.
- ``operator-b`` (only when asked for, with ``--b-source DIR``): the same, run from
  another checkout and watching namespace scale-opb, for an A/B of two versions side by
  side in one run;
- ``bare``: the practical limit (``scale_bare.py``): a separate process with the official
  client in 32 threads (the operator's default ``--api-concurrency``), raw JSON, POSTs the
  same headless Service and pods (built with the operator's own builders, owned by inert
  TPUSlices, one per slice); on a failure it DELETEs every pod, waits until they are gone
  and POSTs the next attempt; at the end it DELETEs every pod.

Phases, each timed by one watch of the namespace in this process (``kwatch``, counting
pods per attempt label: O(1) per event):

- create: all pods created, all Running, and (operator) the job's phase Running;
- restart: worker 32 of the middle slice exits 1 (the node agent reports it) -> every pod
  of attempt 2 Running (and the job Running as attempt 2; failurePolicy backoffSeconds 0);
- delete: DELETE the TPUJob (the garbage collector removes its TPUSlices and pods; the
  operator has no finalizer) or, bare, its own DELETE of every pod -> every pod gone.

After each phase the benchmark waits until the measured process is idle (at least 2 s,
then until it used under 10 % of a core over a second), then reads its CPU seconds
(``/proc/<pid>/stat``) and, for the operator, its API requests by verb
(``tpu_operator_api_requests_total``). Figures per pod: CPU milliseconds and API requests
per pod and phase. Operator memory: the peak (``VmHWM``, reset at the start of each trial
through ``/proc/<pid>/clear_refs``) and the steady RSS with the job Running (after a 15 s
window whose idle CPU is reported too). Ratios: operator / bare per size and repetition,
and each size's CPU per pod against the smallest size measured (the issue's "flat within
1.1x" target). The operator's CPU per pod is also given less its idle rate over each
phase's seconds (``per_pod_net``): what it spends per second with nothing to do is paid
for as long as the cluster takes, which here grows faster than the pods. The cluster
components' CPU and RSS per trial are recorded too.

A size whose estimated memory (``MEMORY``: measured per simulated node and per pod) does
not fit the machine's available memory is skipped with a message saying so (``--force``
runs it anyway); a trial that times out stops the larger sizes and is reported as such.
Every finished trial goes to ``bench/results/scale.partial.json`` at once, everything to
``bench/results/scale.json`` at the end.

    .venv/bin/python bench/scale.py [--reps N] [--small-reps N]
        [--sizes 256 1024 4096 12736] [--variants operator bare] [--profile DIR] [--force]
    .venv/bin/python bench/scale.py --sizes 256 12736 --small-reps 5   # 256 five times
    .venv/bin/python bench/scale.py --sizes 4096 --variants operator operator-b \
        --b-source /tmp/base                  # an A/B against another checkout
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import fmt, say, spread, summary
from kwatch import Watch, connect

from localcluster import Cluster
from localcluster.agent.kube import Kube
from tpu_operator import catalog, contract

SLICE_TYPE = "v5litepod-256"
ACCELERATOR, TOPOLOGY = catalog.short_types()[SLICE_TYPE]
HOSTS_PER_SLICE = catalog.shape(ACCELERATOR, TOPOLOGY).hosts
SIZES = {64: 1, 256: 4, 1024: 16, 4096: 64, 12736: 199}
"""Hosts -> slices of v5litepod-256."""
SMALL_HOSTS = 1024
"""Sizes up to this take a few minutes a trial at most: ``--small-reps`` repeats them."""
DEFAULT_SIZES = [256, 1024, 4096, 12736]
NAMESPACES = {"operator": "scale-op", "operator-b": "scale-opb", "bare": "scale-bare"}
VARIANTS = ("operator", "operator-b", "bare")
DEFAULT_VARIANTS = ("operator", "bare")
"""``operator-b`` (``--b-source``) is a second operator from another checkout, for an A/B
of two versions in the same run (pods of its own namespace only, as the other's)."""
ATTEMPT = contract.LABEL_RESTART_ATTEMPT
CONCURRENCY = 32
TEMPLATE = harness.WORKER_TEMPLATE
SETTLE = 2.0
"""Seconds after a phase before its cost is read (paced status writes), at least."""
STEADY = 15.0
"""Seconds with the job Running over which the operator's idle CPU is measured."""
MEMORY = {"base_mb": 1000.0, "per_node_mb": 0.1, "per_pod_mb": 0.85}
"""Memory model of a trial (the sum of the peak RSS of etcd, kube-apiserver, the
controller-manager, the scheduler, the node agent, the operator or bare client and this
process), fitted to measured runs: 4,096 nodes and a 4,096-pod job peaked at 5.1 GB
(kube-apiserver 2.4 GB, etcd 0.8, node agent 0.6, controller-manager 0.5, operator 0.4,
scheduler 0.3); 12,736 idle nodes take 1.35 GB (the scale runs in bench/HISTORY.md)."""


WARMUP_TIMEOUT = 3600.0
"""Seconds the warm-up job may take: it includes the operator's start-up, which grows with
the square of the cluster's TPU nodes (about 48 s with 4,096; the scale runs in
bench/HISTORY.md)."""


def timeout_for(hosts: int) -> float:
    """Seconds a phase of ``hosts`` pods may take before the trial counts as failed."""
    return 180.0 + 0.15 * hosts


def pool_name(index: int) -> str:
    return f"v5e-{index:03d}"


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def jobs_path(namespace: str, plural: str = contract.JOB_PLURAL) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{plural}"


def victim(name: str, hosts: int) -> str:
    """Worker 32 of the middle slice."""
    return contract.pod_name(contract.slice_name(name, SIZES[hosts] // 2), HOSTS_PER_SLICE // 2)


# Observation -----------------------------------------------------------------------------


class PodCounts(Watch):
    """A pod watch that keeps per-attempt counts instead of objects.

    For each attempt label it records, in order, when pods were first seen, first seen
    Running, first seen deleting and seen gone, so the n-th time of a list is when the
    n-th pod got there: O(1) per event and per check, where ``Watch`` scans every pod on
    every check (quadratic at 12,736 pods, in a process sharing the 2 cores).
    """

    def __init__(self, api: Kube, path: str) -> None:
        super().__init__(api, path)
        self.pods: dict[str, list[Any]] = {}
        """uid -> [attempt, running seen, deleting seen, gone]."""
        self.times: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.live = 0
        self.events = 0

    def _apply(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        state = self.pods.get(meta["uid"])
        if state is None:
            attempt = (meta.get("labels") or {}).get(ATTEMPT, "")
            state = self.pods[meta["uid"]] = [attempt, False, False, False]
            self.times["created", attempt].append(now)
            self.live += 1
        attempt = state[0]
        if not state[1] and (obj.get("status") or {}).get("phase") == "Running":
            state[1] = True
            self.times["running", attempt].append(now)
        if not state[2] and (meta.get("deletionTimestamp") or kind == "DELETED"):
            state[2] = True
            self.times["deleting", attempt].append(now)
        if kind == "DELETED" and not state[3]:
            state[3] = True
            self.times["gone", attempt].append(now)
            self.live -= 1
        self.events += 1
        self._changed.set()

    def _alive(self) -> dict[str, str]:
        return {uid: "" for uid, state in self.pods.items() if not state[3]}

    def at(self, event: str, attempt: str, count: int) -> float | None:
        """When the ``count``-th pod of ``attempt`` got to ``event`` (None: not yet)."""
        times = self.times.get((event, attempt), [])
        return times[count - 1] if len(times) >= count else None

    def describe(self) -> str:
        counts = {f"{e} {a}": len(t) for (e, a), t in sorted(self.times.items())}
        return f"{counts}, {self.live} live, {self.reconnects} reconnects, {self.events} events"


def since(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


async def quiesce(
    pid: int, minimum: float = SETTLE, idle: float = 0.1, limit: float = 60.0
) -> None:
    """Wait ``minimum`` seconds, then until ``pid`` used under ``idle`` of a core over one
    second (at most ``limit`` seconds): the phase's trailing work (paced status writes,
    queued events) counts in the phase."""
    await asyncio.sleep(minimum)
    deadline = time.monotonic() + limit
    last = harness.cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        current = harness.cpu_seconds(pid)
        if current - last < idle:
            return
        last = current


class Meter:
    """CPU seconds (and, given ``requests``, API requests by verb; given ``reconciles``,
    reconciles by kind) of one process per phase."""

    def __init__(
        self,
        pid: int,
        requests: Callable[[], dict[str, float]] | None = None,
        reconciles: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.pid = pid
        self.requests = requests
        self.reconciles = reconciles
        self._cpu = harness.cpu_seconds(pid)
        self._at = time.monotonic()
        self._requests = requests() if requests else {}
        self._reconciles = reconciles() if reconciles else {}

    def phase(self) -> dict[str, Any]:
        """What the process spent since the last call (or since it was made)."""
        cpu, at = harness.cpu_seconds(self.pid), time.monotonic()
        out: dict[str, Any] = {
            "cpu": cpu - self._cpu,
            "seconds": at - self._at,
            "memory_mb": harness.memory_mb(self.pid),
        }
        self._cpu, self._at = cpu, at
        if self.requests is not None:
            current = self.requests()
            delta = {verb: current[verb] - self._requests.get(verb, 0.0) for verb in current}
            delta["total"] = sum(delta.values())
            out["requests"] = delta
            self._requests = current
        if self.reconciles is not None:
            current = self.reconciles()
            out["reconciles"] = harness.deltas(current, self._reconciles)
            self._reconciles = current
        return out


class Components:
    """CPU seconds and peak RSS of the cluster's processes (and this one) across a trial."""

    def __init__(self, cluster: Cluster) -> None:
        processes = cluster.status()["processes"]
        self.pids = {name: int(p["pid"]) for name, p in processes.items()}
        self.pids["benchmark"] = os.getpid()
        for pid in self.pids.values():
            harness.reset_peak(pid)
        self._start = self._cpu()

    def _cpu(self) -> dict[str, float]:
        return {name: harness.cpu_seconds(pid) for name, pid in self.pids.items()}

    def done(self) -> dict[str, Any]:
        end = self._cpu()
        return {
            name: {
                "cpu": round(end[name] - self._start[name], 2),
                "peak_mb": round(harness.memory_mb(pid)["peak"]),
            }
            for name, pid in self.pids.items()
        }


# Operator --------------------------------------------------------------------------------


def tpujob(name: str, namespace: str, hosts: int) -> dict[str, Any]:
    """The TPUJob a user writes for ``hosts`` hosts of v5litepod-256 slices."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "slice": {"type": SLICE_TYPE},
            "numSlices": SIZES[hosts],
            "template": copy.deepcopy(TEMPLATE),
            "failurePolicy": {"maxRestarts": 1000, "backoffSeconds": 0},
        },
    }


@dataclass
class Bench:
    cluster: Cluster
    api: Kube
    operator: harness.Operator | None
    operator_b: harness.Operator | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)
    warmups: list[dict[str, Any]] = field(default_factory=list)
    """The untimed first job of each variant (the operator's includes its start-up: its
    caches of every TPU node fill before it assigns node pools)."""
    profile: Path | None = None
    operator_started: float = 0.0
    """When ``tpu-operator run`` answered its health check (monotonic)."""


class PhaseProfiles:
    """One py-spy recording per phase of a trial (``DIR/<trial>-<phase>.txt``), so that a
    phase's profile at one size can be set beside the same phase's at another; nothing
    when ``directory`` is None. Each recording attaches before its phase is timed."""

    def __init__(self, pid: int, directory: Path | None, trial: str) -> None:
        self.pid, self.directory, self.trial = pid, directory, trial
        self.current: harness.Profiler | None = None

    async def next(self, phase: str) -> None:
        await self.stop()
        name = f"{self.trial}-{phase}.txt"
        self.current = await harness.profile(self.pid, self.directory, name)

    async def stop(self) -> None:
        if self.current is not None:
            await self.current.stop()
            self.current = None


async def kill(bench: Bench, namespace: str, pod: str) -> float:
    """Fail one worker (the agent reports exit code 1); the monotonic time just before."""
    started = time.monotonic()
    await asyncio.to_thread(bench.cluster.agent.kill_pod, namespace, pod, exit_code=1)
    return started


async def trial_operator(
    bench: Bench, hosts: int, rep: int, variant: str = "operator"
) -> dict[str, Any]:
    operator = bench.operator_b if variant == "operator-b" else bench.operator
    assert operator is not None
    prefix = "opb" if variant == "operator-b" else "op"
    namespace, name = NAMESPACES[variant], f"{prefix}{hosts}-{rep}"
    timeout = timeout_for(hosts) if rep else WARMUP_TIMEOUT
    pods = PodCounts(bench.api, pods_path(namespace))
    await pods.start()
    jobs = await Watch(bench.api, jobs_path(namespace)).start()
    profiles = PhaseProfiles(operator.pid, bench.profile, name)
    await profiles.next("create")
    components = Components(bench.cluster)
    harness.reset_peak(operator.pid)
    meter = Meter(operator.pid, operator.requests, operator.reconciles)
    try:
        result = await operator_phases(
            bench, operator, pods, jobs, meter, profiles, namespace, name, hosts, timeout
        )
    finally:
        await profiles.stop()
        await jobs.stop()
    result["peak_mb"] = harness.memory_mb(operator.pid)["peak"]
    result["components"] = components.done()
    await drain(bench, namespace, pods, timeout)
    return result


async def operator_phases(
    bench: Bench,
    operator: harness.Operator,
    pods: PodCounts,
    jobs: Watch,
    meter: Meter,
    profiles: PhaseProfiles,
    namespace: str,
    name: str,
    hosts: int,
    limit: float,
) -> dict[str, Any]:
    pid = operator.pid
    started = time.monotonic()
    await bench.api.call("POST", jobs_path(namespace), tpujob(name, namespace, hosts))
    post_after_start = started - bench.operator_started
    await pods.wait(lambda: pods.at("running", "1", hosts), limit, f"{name}: all Running")
    await jobs.wait(lambda: jobs.phase_at(name, "Running", started), limit, f"{name} phase")
    result: dict[str, Any] = {
        "first_created": since(pods.at("created", "1", 1), started),
        "created": since(pods.at("created", "1", hosts), started),
        "running": since(pods.at("running", "1", hosts), started),
        "job_running": since(jobs.phase_at(name, "Running", started), started),
        "post_after_start": post_after_start,
    }
    await quiesce(pid)
    result["create_cost"] = meter.phase()
    await profiles.next("steady")
    await asyncio.sleep(STEADY)
    result["steady_cost"] = meter.phase()
    await profiles.next("restart")
    say(f"  {name}: all Running after {result['running']:.1f} s; restarting a worker")

    failed = await kill(bench, namespace, victim(name, hosts))
    await pods.wait(lambda: pods.at("running", "2", hosts), limit, f"{name}: attempt 2")
    await jobs.wait(
        lambda: jobs.phase_at(name, "Running", failed, attempt=2), limit, f"{name} phase 2"
    )
    result["restart"] = restart_figures(pods, hosts, failed)
    result["restart"]["job_running"] = since(
        jobs.phase_at(name, "Running", failed, attempt=2), failed
    )
    await quiesce(pid)
    result["restart_cost"] = meter.phase()
    await profiles.next("delete")
    say(f"  {name}: restarted in {result['restart']['all_new_running']:.1f} s; deleting")

    deleting = time.monotonic()
    await bench.api.call("DELETE", f"{jobs_path(namespace)}/{name}")
    await pods.wait(lambda: pods.at("gone", "2", hosts), limit, f"{name}: pods gone")
    result["delete"] = {
        "first_deleting": since(pods.at("deleting", "2", 1), deleting),
        "all_deleting": since(pods.at("deleting", "2", hosts), deleting),
        "all_gone": since(pods.at("gone", "2", hosts), deleting),
    }
    await quiesce(pid)
    result["delete_cost"] = meter.phase()
    return result


def restart_figures(pods: PodCounts, hosts: int, failed: float) -> dict[str, Any]:
    return {
        "first_deleting": since(pods.at("deleting", "1", 1), failed),
        "all_deleting": since(pods.at("deleting", "1", hosts), failed),
        "old_gone": since(pods.at("gone", "1", hosts), failed),
        "first_new_created": since(pods.at("created", "2", 1), failed),
        "all_new_created": since(pods.at("created", "2", hosts), failed),
        "all_new_running": since(pods.at("running", "2", hosts), failed),
    }


async def drain(bench: Bench, namespace: str, pods: PodCounts, limit: float) -> None:
    """Delete what a trial left (owners first, then pods) and wait until it is gone."""
    for plural in (contract.JOB_PLURAL, "tpuslices"):
        await bench.api.call(
            "DELETE", f"{jobs_path(namespace, plural)}?propagationPolicy=Background", ok=(404,)
        )
    await bench.api.call("DELETE", pods_path(namespace), ok=(404,))
    await pods.wait(lambda: pods.live == 0, limit, f"the pods of {namespace} to be gone")
    deadline = time.monotonic() + limit
    for plural in (contract.JOB_PLURAL, "tpuslices"):
        while (await bench.api.call("GET", f"{jobs_path(namespace, plural)}?limit=1"))["items"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{plural} of {namespace} still there after {limit:.0f} s")
            await asyncio.sleep(0.5)
    await pods.stop()


# Bare client -----------------------------------------------------------------------------


async def bare_owners(bench: Bench, name: str, namespace: str, hosts: int) -> list[dict]:
    """One inert TPUSlice per slice (no controller watches this namespace), the owners of
    the bare client's pods as a TPUSlice owns the operator's."""
    from tpu_operator.builders.pods import Owner
    from tpu_operator.builders.slices import job_slice

    spec = tpujob(name, namespace, hosts)["spec"]
    owners = []
    for index in range(SIZES[hosts]):
        body = job_slice(
            job_name=name,
            namespace=namespace,
            job_spec=spec,
            index=index,
            attempt=1,
            owner=Owner(contract.API_VERSION, contract.JOB_KIND, name, "0"),
            node_pool=pool_name(index),
            not_before=None,
            suspend=False,
        )
        del body["metadata"]["ownerReferences"]
        created = await bench.api.call("POST", jobs_path(namespace, "tpuslices"), body)
        owners.append(
            {"name": body["metadata"]["name"], "uid": created["metadata"]["uid"],
             "pool": pool_name(index)}
        )  # fmt: skip
    return owners


class BareProcess:
    """scale_bare.py as a subprocess: commands on stdin, one JSON event per line out."""

    def __init__(self, process: asyncio.subprocess.Process, timeout: float) -> None:
        self.process = process
        self.timeout = timeout

    @classmethod
    async def start(cls, bench: Bench, job_file: Path, limit: float) -> BareProcess:
        log = open(bench.cluster.logs_dir / "scale-bare.log", "ab")  # noqa: ASYNC230, SIM115
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("scale_bare.py")),
            f"--kubeconfig={bench.cluster.kubeconfig}", f"--job={job_file}",
            f"--concurrency={CONCURRENCY}", f"--timeout={limit}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
            limit=1 << 20,
        )  # fmt: skip
        log.close()
        bare = cls(process, limit)
        await bare.expect("ready")
        return bare

    @property
    def pid(self) -> int:
        return self.process.pid

    async def expect(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), self.timeout)
            if not line:
                raise RuntimeError(f"the bare client exited before {event!r} (scale-bare.log)")
            message = json.loads(line)
            if message["event"] == event:
                return message

    async def send(self, command: str) -> float:
        assert self.process.stdin is not None
        sent = time.monotonic()
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()
        return sent

    async def mark(self) -> dict[str, Any]:
        """Wait until it is idle, then its CPU seconds at the end of a phase."""
        await quiesce(self.pid)
        await self.send("mark")
        return await self.expect("mark")

    async def close(self) -> None:
        if self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def trial_bare(bench: Bench, hosts: int, rep: int) -> dict[str, Any]:
    namespace, name = NAMESPACES["bare"], f"bare{hosts}-{rep}"
    timeout = timeout_for(hosts) if rep else WARMUP_TIMEOUT
    owners = await bare_owners(bench, name, namespace, hosts)
    job_file = bench.cluster.directory / f"{name}.job.json"
    job = {"name": name, "namespace": namespace, "accelerator": ACCELERATOR,
           "topology": TOPOLOGY, "template": TEMPLATE, "slices": owners}  # fmt: skip
    job_file.write_text(json.dumps(job))
    pods = PodCounts(bench.api, pods_path(namespace))
    await pods.start()
    components = Components(bench.cluster)
    bare = await BareProcess.start(bench, job_file, timeout)
    try:
        result = await bare_phases(bench, bare, pods, namespace, name, hosts, timeout)
        result["peak_mb"] = harness.memory_mb(bare.pid)["peak"]
    finally:
        await bare.close()
        job_file.unlink()
    result["components"] = components.done()
    await drain(bench, namespace, pods, timeout)
    return result


async def bare_phases(
    bench: Bench,
    bare: BareProcess,
    pods: PodCounts,
    namespace: str,
    name: str,
    hosts: int,
    limit: float,
) -> dict[str, Any]:
    started = await bare.send("go")
    go = await bare.expect("go")
    await pods.wait(lambda: pods.at("running", "1", hosts), limit, f"{name}: all Running")
    created = await bare.expect("created")
    result: dict[str, Any] = {
        "created": since(pods.at("created", "1", hosts), started),
        "running": since(pods.at("running", "1", hosts), started),
        "client_done": created["t"] - started,
    }
    mark = await bare.mark()
    result["create_cost"] = {"cpu": mark["cpu"] - go["cpu"]}
    say(f"  {name}: all Running after {result['running']:.1f} s; restarting a worker")

    await bare.send("arm")
    armed = await bare.expect("armed")
    failed = await kill(bench, namespace, victim(name, hosts))
    await pods.wait(lambda: pods.at("running", "2", hosts), limit, f"{name}: attempt 2")
    await bare.expect("recreated")
    result["restart"] = restart_figures(pods, hosts, failed)
    mark = await bare.mark()
    result["restart_cost"] = {"cpu": mark["cpu"] - armed["cpu"]}
    say(f"  {name}: restarted in {result['restart']['all_new_running']:.1f} s; deleting")

    deleting = await bare.send("delete")
    delete_go = await bare.expect("delete-go")
    await pods.wait(lambda: pods.at("gone", "2", hosts), limit, f"{name}: pods gone")
    await bare.expect("gone")
    result["delete"] = {
        "first_deleting": since(pods.at("deleting", "2", 1), deleting),
        "all_deleting": since(pods.at("deleting", "2", hosts), deleting),
        "all_gone": since(pods.at("gone", "2", hosts), deleting),
    }
    mark = await bare.mark()
    result["delete_cost"] = {"cpu": mark["cpu"] - delete_go["cpu"]}
    return result


# Runs ------------------------------------------------------------------------------------

Trial = Callable[[Bench, int, int], Awaitable[dict[str, Any]]]
TRIALS: dict[str, Trial] = {
    "operator": trial_operator,
    "operator-b": lambda b, h, r: trial_operator(b, h, r, variant="operator-b"),
    "bare": trial_bare,
}


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def estimate_mb(hosts: int, nodes: int) -> float:
    """Memory a trial of ``hosts`` pods needs on a cluster of ``nodes`` nodes (``MEMORY``)."""
    return MEMORY["base_mb"] + MEMORY["per_node_mb"] * nodes + MEMORY["per_pod_mb"] * hosts


def fitting(sizes: list[int], force: bool) -> tuple[list[int], dict[int, str]]:
    """The sizes whose estimated memory fits what is available now, and why others don't."""
    available = available_mb()
    nodes = SIZES[max(sizes)] * HOSTS_PER_SLICE
    skipped: dict[int, str] = {}
    for hosts in sizes:
        need = estimate_mb(hosts, SIZES[max(sizes)] * HOSTS_PER_SLICE)
        if need > available and not force:
            skipped[hosts] = (
                f"needs about {need:,.0f} MB ({MEMORY['base_mb']:.0f} + {nodes:,} nodes x "
                f"{MEMORY['per_node_mb']} + {hosts:,} pods x {MEMORY['per_pod_mb']}), "
                f"{available:,.0f} MB available"
            )
    kept = [h for h in sizes if h not in skipped]
    if len(kept) < len(sizes) and kept:
        return fitting(kept, force)  # a smaller cluster needs less
    return kept, skipped


async def run_trials(
    bench: Bench, variants: list[str], sizes: list[int], reps: int, small_reps: int = 0
) -> dict:
    """Every trial; returns the sizes that did not finish and why. Sizes of up to
    ``SMALL_HOSTS`` run ``small_reps`` repetitions if that is more than ``reps``: the
    medians of the size the others are compared with then rest on more than one run."""
    failures: dict[int, str] = {}
    say("warm-up: one untimed 64-host (1-slice) job of each variant")
    for variant in variants:
        warmup = await TRIALS[variant](bench, 64, 0)
        bench.warmups.append({"variant": variant, "hosts": 64, "rep": 0, **warmup})
        say(
            f"warm-up {variant}: first pod {warmup.get('first_created') or 0:.1f} s, all "
            f"Running {warmup['running']:.1f} s after the POST"
            + (f" ({warmup['post_after_start']:.1f} s after the operator started)"
               if "post_after_start" in warmup else "")
        )  # fmt: skip
    for rep in range(1, max(reps, small_reps) + 1):
        for hosts in sizes:
            runs = max(reps, small_reps) if hosts <= SMALL_HOSTS else reps
            if hosts in failures or rep > runs:
                continue
            order = variants if rep % 2 else variants[::-1]
            for variant in order:
                say(f"rep {rep}: {hosts:,} hosts ({SIZES[hosts]} slices), {variant}")
                try:
                    result = await TRIALS[variant](bench, hosts, rep)
                except (TimeoutError, RuntimeError) as error:
                    failures[hosts] = f"{variant}, rep {rep}: {error}"
                    say(f"SIZE {hosts:,} DID NOT FINISH ({variant}): {error}")
                    bench.trials.append({"variant": variant, "hosts": hosts, "rep": rep,
                                         "error": str(error)})  # fmt: skip
                    harness.write_results("scale.partial", {"trials": bench.trials})
                    break
                bench.trials.append({"variant": variant, "hosts": hosts, "rep": rep, **result})
                harness.write_results("scale.partial", {"trials": bench.trials})
                say(
                    f"rep {rep} {hosts:>6,} hosts {variant:<8} created "
                    f"{result['created']:7.2f} s  running {result['running']:7.2f} s  "
                    f"restart {result['restart']['all_new_running']:7.2f} s  "
                    f"delete {result['delete']['all_gone']:7.2f} s  CPU ms/pod "
                    + " / ".join(f"{per_pod({**result, 'hosts': hosts}, p):.2f}" for p in PHASES)
                )
            if hosts in failures:
                bigger = [h for h in sizes if h > hosts]
                for other in bigger:
                    failures.setdefault(other, f"not run: {hosts:,} hosts did not finish")
    return failures


# Figures ---------------------------------------------------------------------------------

PHASES = ("create", "restart", "delete")
Getter = Callable[[dict[str, Any]], float | None]


def per_pod(trial: dict[str, Any], phase: str) -> float:
    """CPU milliseconds per pod of one phase."""
    return 1000 * trial[f"{phase}_cost"]["cpu"] / trial["hosts"]


def per_pod_net(trial: dict[str, Any], phase: str) -> float | None:
    """CPU milliseconds per pod of one phase, less what the operator spends per second
    with the job Running and nothing to do (the progress sampler, the cache audit,
    housekeeping: ``steady_cost``) over the phase's seconds. The rest is the work the
    phase's pods caused; the idle part grows with how long the cluster takes, not with
    the pods (a 12,736-pod job takes 20 minutes to start on this machine)."""
    cost, steady = trial[f"{phase}_cost"], trial.get("steady_cost") or {}
    if "seconds" not in cost or not steady.get("seconds"):
        return None  # a trial recorded before phases were timed
    idle = steady["cpu"] / steady["seconds"] * cost["seconds"]
    return 1000 * (cost["cpu"] - idle) / trial["hosts"]


def requests_per_pod(trial: dict[str, Any], phase: str, verb: str = "total") -> float | None:
    requests = trial[f"{phase}_cost"].get("requests")
    return None if requests is None else requests[verb] / trial["hosts"]


DURATIONS: dict[str, Getter] = {
    "created_s": lambda t: t["created"],
    "running_s": lambda t: t["running"],
    "restart_s": lambda t: t["restart"]["all_new_running"],
    "restart_old_gone_s": lambda t: t["restart"]["old_gone"],
    "delete_s": lambda t: t["delete"]["all_gone"],
}


def pick(trials: list[dict[str, Any]], variant: str, hosts: int) -> dict[int, dict[str, Any]]:
    return {
        t["rep"]: t
        for t in trials
        if t["variant"] == variant and t["hosts"] == hosts and "error" not in t
    }


def stat(trials: dict[int, dict[str, Any]], get: Getter) -> dict[str, Any]:
    return summary([get(t) for t in trials.values()])  # type: ignore[misc]


def ratio(mine: dict[int, dict], base: dict[int, dict], get: Getter) -> dict[str, Any]:
    """Per-repetition ratios mine / base."""
    values = []
    for rep in sorted(set(mine) & set(base)):
        a, b = get(mine[rep]), get(base[rep])
        if a is not None and b:
            values.append(a / b)
    return summary(values)


def figures(trials: list[dict[str, Any]], variants: list[str], sizes: list[int]) -> dict:
    out: dict[str, Any] = {}
    for hosts in sizes:
        base = pick(trials, "bare", hosts)
        for variant in variants:
            mine = pick(trials, variant, hosts)
            if not mine:
                continue
            entry: dict[str, Any] = {k: stat(mine, get) for k, get in DURATIONS.items()}
            entry["pods_per_s"] = stat(mine, lambda t, h=hosts: h / t["created"])
            for phase in PHASES:
                entry[f"cpu_ms_per_pod_{phase}"] = stat(mine, lambda t, p=phase: per_pod(t, p))
            entry["peak_mb"] = stat(mine, lambda t: t["peak_mb"])
            if variant != "bare":
                entry["job_running_s"] = stat(mine, lambda t: t["job_running"])
                entry["restart_job_running_s"] = stat(mine, lambda t: t["restart"]["job_running"])
                entry["steady_mb"] = stat(mine, lambda t: t["steady_cost"]["memory_mb"]["rss"])
                entry["steady_cpu_pct"] = stat(
                    mine,
                    lambda t: (
                        100 * t["steady_cost"]["cpu"] / t["steady_cost"].get("seconds", STEADY)
                    ),
                )
                for phase in PHASES:
                    entry[f"cpu_ms_per_pod_{phase}_net"] = stat(
                        mine, lambda t, p=phase: per_pod_net(t, p)
                    )
                    entry[f"requests_per_pod_{phase}"] = stat(
                        mine, lambda t, p=phase: requests_per_pod(t, p)
                    )
                    entry[f"writes_per_pod_{phase}"] = stat(
                        mine,
                        lambda t, p=phase: sum(
                            requests_per_pod(t, p, v) or 0
                            for v in ("POST", "PUT", "PATCH", "DELETE")
                        ),
                    )
            if variant != "bare" and base:
                vs = entry["vs_bare"] = {k: ratio(mine, base, get) for k, get in DURATIONS.items()}
                for phase in PHASES:
                    vs[f"cpu_per_pod_{phase}"] = ratio(mine, base, lambda t, p=phase: per_pod(t, p))
            out[f"{variant}/{hosts}"] = entry
    for variant in variants:  # per-pod CPU against the smallest size that ran
        measured = [h for h in sizes if f"{variant}/{h}" in out]
        if not measured:
            continue
        first = out[f"{variant}/{measured[0]}"]
        for hosts in measured:
            entry = out[f"{variant}/{hosts}"]
            entry["cpu_per_pod_vs_smallest"] = {
                phase: _over(entry[f"cpu_ms_per_pod_{phase}"], first[f"cpu_ms_per_pod_{phase}"])
                for phase in PHASES
            }
            if variant != "bare":
                entry["cpu_per_pod_net_vs_smallest"] = {
                    phase: _over(
                        entry[f"cpu_ms_per_pod_{phase}_net"], first[f"cpu_ms_per_pod_{phase}_net"]
                    )
                    for phase in PHASES
                }
    return out


def _over(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a["median"] is None or not b["median"]:
        return None
    return a["median"] / b["median"]


def report(results: dict[str, Any], variants: list[str], sizes: list[int]) -> None:
    rows, ratio_rows, cost_rows, net_rows = [], [], [], []
    for hosts in sizes:
        for variant in variants:
            f = results.get(f"{variant}/{hosts}")
            if f is None:
                continue
            rows.append([
                f"{hosts:,}", variant, spread(f["created_s"]), spread(f["running_s"]),
                spread(f["job_running_s"]) if "job_running_s" in f else "-",
                spread(f["restart_s"]), spread(f["delete_s"]),
            ])  # fmt: skip
            vs = f["cpu_per_pod_vs_smallest"]
            cost_rows.append([
                f"{hosts:,}", variant,
                " / ".join(fmt(f[f"cpu_ms_per_pod_{p}"]["median"]) for p in PHASES),
                " / ".join(fmt(vs[p]) for p in PHASES),
                " / ".join(fmt(f[f"requests_per_pod_{p}"]["median"]) for p in PHASES)
                if variant != "bare" else "-",
                fmt(f["peak_mb"]["median"], 0),
                fmt(f["steady_mb"]["median"], 0) if "steady_mb" in f else "-",
            ])  # fmt: skip
            if "cpu_per_pod_net_vs_smallest" in f:
                net = f["cpu_per_pod_net_vs_smallest"]
                net_rows.append([
                    f"{hosts:,}", variant, fmt(f["steady_cpu_pct"]["median"]),
                    " / ".join(fmt(f[f"cpu_ms_per_pod_{p}_net"]["median"]) for p in PHASES),
                    " / ".join(fmt(net[p]) for p in PHASES),
                ])  # fmt: skip
            if "vs_bare" in f:
                r = f["vs_bare"]
                ratio_rows.append([
                    f"{hosts:,}", variant, spread(r["created_s"]), spread(r["running_s"]),
                    spread(r["restart_s"]), spread(r["delete_s"]),
                    " / ".join(fmt(r[f"cpu_per_pod_{p}"]["median"]) for p in PHASES),
                ])  # fmt: skip
    print()
    print("Times, seconds (median [min-max] over repetitions)")
    print(harness.table(
        ["hosts", "variant", "all created", "all Running", "job Running",
         "restart -> all Running", "delete -> all gone"], rows))  # fmt: skip
    if ratio_rows:
        print()
        print("Operator / bare client (per repetition, median [min-max])")
        print(harness.table(
            ["hosts", "variant", "all created", "all Running", "restart", "delete",
             "CPU per pod create / restart / delete"], ratio_rows))  # fmt: skip
    print()
    print("Cost per pod (medians): CPU ms create / restart / delete, vs the smallest size, "
          "operator API requests per pod, peak and steady RSS MB of the process")  # fmt: skip
    print(harness.table(
        ["hosts", "variant", "CPU ms/pod c / r / d", "vs smallest c / r / d",
         "API requests/pod c / r / d", "RSS peak", "RSS steady"], cost_rows))  # fmt: skip
    if net_rows:
        print()
        print("Operator CPU per pod less its idle rate (steady, % of a core) over each phase's "
              "seconds: ms create / restart / delete, vs the smallest size")  # fmt: skip
        print(harness.table(
            ["hosts", "variant", "idle % of a core", "CPU ms/pod net c / r / d",
             "vs smallest c / r / d"], net_rows))  # fmt: skip


# Main ------------------------------------------------------------------------------------


def start_operator(cluster: Cluster, variant: str, source: Path | None = None) -> harness.Operator:
    """``tpu-operator run`` for ``variant``, watching its namespace, from this checkout or
    ``source``; started (its health check answers)."""
    operator = harness.Operator(
        cluster,
        "scale-b" if variant == "operator-b" else "scale",
        [f"--namespace={NAMESPACES[variant]}", "--no-in-place-restarts"],
        source=source,
    )
    operator.start()
    return operator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--small-reps",
        type=int,
        default=0,
        help=f"repetitions of the sizes of up to {SMALL_HOSTS:,} hosts (about a minute "
        "each at 256 hosts), if more than --reps: the ratios to the smallest size then rest "
        "on its median",
    )
    parser.add_argument("--sizes", type=int, nargs="+", choices=sorted(SIZES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record the operator with py-spy during each phase of each trial into "
        "DIR/<trial>-<phase>.txt "
        "(collapsed stacks) and print the top functions",
    )
    parser.add_argument(
        "--b-source",
        type=Path,
        metavar="DIR",
        help="run the operator-b variant from another checkout (e.g. `git worktree add "
        "/tmp/base HEAD~1`)",
    )
    parser.add_argument("--force", action="store_true",
                        help="run sizes even when their estimated memory does not fit")  # fmt: skip
    args = parser.parse_args()
    sizes = sorted(args.sizes or DEFAULT_SIZES)
    variants = list(args.variants or DEFAULT_VARIANTS)
    if "operator-b" in variants and args.b_source is None:
        parser.error("the operator-b variant needs --b-source")
    sizes, skipped = fitting(sizes, args.force)
    for hosts, why in skipped.items():
        say(f"SIZE {hosts:,} CANNOT RUN HERE: {why}; skipped (--force runs it anyway)")
    if not sizes:
        raise SystemExit("no size fits this machine")
    slices = SIZES[max(sizes)]
    nodes = slices * HOSTS_PER_SLICE
    grace = harness.quiet_grace(nodes)
    pools = [
        harness.tpu_pool(pool_name(i), TOPOLOGY, HOSTS_PER_SLICE, ACCELERATOR)
        for i in range(slices)
    ]
    say(f"{slices} node pools of {HOSTS_PER_SLICE} VMs ({nodes:,} nodes), grace {grace:,.0f} s")
    started = time.monotonic()
    with harness.bench_cluster(
        "scale",
        pools,
        grace=grace,
        namespaces=[NAMESPACES[v] for v in variants],
        timeout=600 + 0.2 * nodes,
        component_args=harness.SCALE_ARGS,
    ) as cluster:
        cluster_up = time.monotonic() - started
        operator = start_operator(cluster, "operator") if "operator" in variants else None
        operator_b = (
            start_operator(cluster, "operator-b", args.b_source)
            if "operator-b" in variants
            else None
        )
        try:
            bench = Bench(cluster, None, operator, operator_b, profile=args.profile)  # type: ignore[arg-type]
            bench.operator_started = time.monotonic()
            failures = asyncio.run(drive(bench, variants, sizes, args.reps, args.small_reps))
        finally:
            for running in (operator, operator_b):
                if running is not None:
                    running.stop()
    failures = {**{h: f"not run: {why}" for h, why in skipped.items()}, **failures}
    results = figures(bench.trials, variants, sizes)
    report(results, variants, sizes)
    for hosts, why in sorted(failures.items()):
        print(f"\n{hosts:,} hosts: NO FIGURES: {why}")
    harness.write_results(
        "scale",
        {
            "machine": harness.machine(),
            "settings": {
                "sizes": sizes,
                "slices": {h: SIZES[h] for h in sizes},
                "slice_type": SLICE_TYPE,
                "reps": args.reps,
                "small_reps": args.small_reps,
                "variants": variants,
                "nodes": nodes,
                "node_monitor_grace_period": grace,
                "cluster_up_s": round(cluster_up, 1),
                "bare_client": f"official kubernetes client, {CONCURRENCY} threads, raw JSON",
                "memory_model": MEMORY,
            },
            "not_finished": failures,
            "warmups": bench.warmups,
            "figures": results,
            "trials": bench.trials,
        },
    )


async def drive(
    bench: Bench, variants: list[str], sizes: list[int], reps: int, small_reps: int
) -> dict:
    bench.api = connect(bench.cluster)
    try:
        return await run_trials(bench, variants, sizes, reps, small_reps)
    finally:
        await bench.api.close()


if __name__ == "__main__":
    main()
