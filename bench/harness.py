"""Shared harness of the control-plane benchmarks: cluster, operator process, figures, output.

Every benchmark here runs on a real local control plane (``localcluster``) and reports its
figures as ratios against a baseline measured in the same run, because the machine is
small and shared: absolute times move with whatever else runs on it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import Cluster, Pool  # noqa: E402
from localcluster.api import ApiError, SyncApi  # noqa: E402
from localcluster.images import operator_venv  # noqa: E402
from tests.operator.support import (  # noqa: E402
    OperatorProcess,
    free_port,
    install_crds,
    wait_crd,
)
from tpu_operator.runtime import collector, loops  # noqa: E402

__all__ = ["free_port", "wait_crd"]
RESULTS = REPO / "bench" / "results"
CLUSTERS = REPO / ".localcluster"
_STARTED = time.monotonic()
WORKER_TEMPLATE: dict[str, Any] = {
    "spec": {
        "terminationGracePeriodSeconds": 30,
        "containers": [
            {"name": "worker", "image": "bench.local/worker", "command": ["sleep", "infinity"]}
        ],
    }
}
"""The pod template of the control-plane benchmarks' jobs (simulate-mode pods run nothing);
read only: callers deep-copy it into the objects they send."""


def say(message: str) -> None:
    """One progress line, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", flush=True)


def run_hosts(main: Coroutine[Any, Any, None]) -> str:
    """Run a driver that plays the cluster's hosts (``standin_supervisor.StandIn``: one
    supervisor and readiness prober per simulated pod) on uvloop's event loop, the loop the
    operator runs on, and return the loop's kind for the results.

    On a cluster every pod's supervisor has a host of its own; here thousands of them share
    the machine's two cores with the operator and the control plane being measured, so
    their CPU is the simulation's cost, not the system's: the cheaper loop takes less of it
    from what is measured. Every variant of a run shares the one driver, so the choice
    moves no baseline apart from what it compares. Refuses to run without uvloop (a silent
    fallback would mislabel the figures)."""
    factory = exact_loop(loops.UVLOOP)
    collector.tune(collector.DEFAULT_THRESHOLD)  # as the operator collects
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)
    return loops.UVLOOP


def exact_loop(wanted: str) -> loops.LoopFactory | None:
    """The factory of event loops of kind ``wanted`` (None: asyncio's own), chosen as the
    operator chooses its own (``loops.loop_factory``), but never another kind: where
    uvloop is missing the operator falls back to asyncio's loop, and figures measured on
    that fallback would be labelled uvloop's."""
    factory, kind = loops.loop_factory(wanted)
    if kind != wanted:
        raise SystemExit(f"{wanted}: uvloop cannot be imported here (`make venv` installs it)")
    return factory


def freeze_heap() -> None:
    """Collect, then keep what this process holds out of every later collection, just
    before a timed fault: the watches' histories and the stand-ins of thousands of hosts
    are long-lived, and a full collection walking them mid-trial (a sixth of this
    process's samples at 4,096 hosts) is the simulation's cost, not the system's."""
    gc.collect()
    gc.freeze()


# Figures ---------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread (min, max) of repeated measurements."""
    clean = [v for v in values if v is not None]
    if not clean:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(clean),
        "min": min(clean),
        "max": max(clean),
        "n": len(clean),
        "values": [round(v, 4) for v in clean],
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def spread(stats: dict[str, Any], digits: int = 2) -> str:
    """``median [min-max]``."""
    if not stats["n"]:
        return "-"
    return (
        f"{fmt(stats['median'], digits)} [{fmt(stats['min'], digits)}-{fmt(stats['max'], digits)}]"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (pastes into bench/HISTORY.md as it is)."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in (headers, *rows)
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
        "note": "shared machine: another engineer's test suites may run at the same time",
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **payload}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    say(f"wrote {path.relative_to(REPO)}")
    return path


# Processes -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def counter_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of counter ``name`` (Prometheus text) whose labels match."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def api_requests(text: str) -> dict[str, float]:
    """The operator's API requests so far, by verb (tpu_operator_api_requests_total)."""
    verbs = ("GET", "LIST", "POST", "PUT", "PATCH", "DELETE")
    return {
        verb: counter_total(text, "tpu_operator_api_requests_total", verb=verb) for verb in verbs
    }


def reconciles(text: str) -> dict[str, float]:
    """The operator's reconciles so far, by kind (tpu_operator_reconcile_duration_seconds)."""
    return {
        kind: counter_total(text, "tpu_operator_reconcile_duration_seconds_count", kind=kind)
        for kind in ("TPUJob", "TPUSlice")
    }


def memory_mb(pid: int) -> dict[str, float]:
    """Resident memory of a process in MB: ``rss`` now (VmRSS) and ``peak`` (VmHWM, the
    high-water mark since start or since ``reset_peak``)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss": fields.get("VmRSS", 0.0), "peak": fields.get("VmHWM", 0.0)}


def reset_peak(pid: int) -> bool:
    """Reset a process's VmHWM to its current RSS (``/proc/<pid>/clear_refs``, value 5;
    needs the right to ptrace it). False when the kernel refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def watch_events(text: str) -> dict[str, float]:
    """The operator's watch events so far, by kind (tpu_operator_watch_events_total)."""
    kinds = ("pods", "nodes", "slices", "jobs")
    return {k: counter_total(text, "tpu_operator_watch_events_total", kind=k) for k in kinds}


def event_counters(text: str) -> dict[str, float]:
    """The operator's watch events so far, keyed ``events.<kind>`` (beside other counters)."""
    return {f"events.{k}": v for k, v in watch_events(text).items()}


def deltas(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


class Operator(OperatorProcess):
    """``tpu-operator run`` as a subprocess (the integration tests' launcher)."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        args: Sequence[str] = (),
        source: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Installed as the operator image installs it (its extra only, none of the dev
        tools: what it imports and the memory it takes are the image's), from this
        checkout or ``source``, another one (an A/B)."""
        log_path = cluster.logs_dir / f"operator-{name}.log"
        venv = operator_venv(source.resolve() if source else REPO)
        python = str(venv / "bin" / "python")
        super().__init__(cluster.kubeconfig, log_path, list(args), dict(env or {}), python)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def requests(self) -> dict[str, float]:
        return api_requests(self.metrics())

    def reconciles(self) -> dict[str, float]:
        return reconciles(self.metrics())

    def counters(self) -> dict[str, float]:
        """API requests by verb and watch events by kind, so far."""
        text = self.metrics()
        return {**api_requests(text), **event_counters(text)}


# Cluster ---------------------------------------------------------------------------------


def tpu_pool(name: str, topology: str, vms: int, accelerator: str = "tpu-v5p-slice") -> Pool:
    """A simulate-mode TPU node pool (pods go Running at once, no processes)."""
    return Pool(name=name, vms=vms, accelerator=accelerator, topology=topology, mode="simulate")


SCALE_ARGS: dict[str, list[str]] = {
    "kube-controller-manager": ["--controllers=*,-ttl", "--node-monitor-period=20s"],
    "kube-apiserver": ["--disable-admission-plugins=TaintNodesByCondition"],
}
"""Component flags for clusters of thousands of simulated nodes, each saving a GET and a
PATCH per node that a real cluster pays once per node over its lifetime, and the local one
all at once at start-up, for minutes (measured with 4,096 and 12,736 nodes):

- no TTL controller: it re-annotates every node each time the node count crosses one of
  its steps (100, 500, 1,000, 2,000, 10,000 nodes); the annotation only tunes a real
  kubelet's caches;
- no ``TaintNodesByCondition`` admission: it taints every new node ``not-ready``
  (NoSchedule) until the node-lifecycle controller has seen it Ready and removed the
  taint, about 73 nodes a second here: 12,736 nodes stay unschedulable for 3 minutes after
  they registered. The simulated nodes register Ready;
- the node-lifecycle controller checks every node's lease every 20 s instead of 2 s
  (12,736 idle nodes: 15 % of a core of kube-controller-manager, 3.7 % at 20 s), which
  only delays noticing a lost node, and with ``quiet_grace`` that takes hours anyway.

With all three, 12,736 idle simulated nodes cost about 9 % of a core in all (apiserver
3 %, kube-controller-manager 4 %, etcd 1.5 %, node agent 0.4 %) and registered in 48 s."""


def quiet_grace(nodes: int, renewals_per_second: float = 2.0, floor: float = 120.0) -> float:
    """A node-monitor grace period at which ``nodes`` simulated nodes renew their leases
    about ``renewals_per_second`` times a second in all (renewal interval: 40 % of it).

    Each lease renewal is a PATCH that the apiserver and etcd serve: at the default 20 s a
    thousand nodes send 125 a second, which measured about 1 % of a core of apiserver CPU
    per renewal a second. Nothing here partitions nodes during a benchmark, so a grace of
    hours changes nothing else."""
    return max(floor, nodes / (0.4 * renewals_per_second))


def node_events(api: SyncApi) -> int:
    """Events in the ``default`` namespace, where the node lifecycle controller posts its
    ``RegisteredNode`` events (counted from one item's page: ``remainingItemCount``)."""
    listing = api.get("/api/v1/namespaces/default/events?limit=1")
    items = len(listing.get("items") or [])
    return items + int((listing.get("metadata") or {}).get("remainingItemCount") or 0)


def settle_node_events(
    cluster: Cluster, nodes: int, quiet: float = 15.0, timeout: float = 900.0
) -> None:
    """Wait until the node lifecycle controller has stopped posting its ``RegisteredNode``
    events: one for every node, or none more for ``quiet`` seconds.

    It posts them after the nodes registered, about a hundred a second here, and stops
    at about 2,000 however many nodes there are (20 s after 3,072 or 10,240 nodes came
    up, on a machine at rest; 1,420 in the first 81 s of a 300-job trial started at once):
    a trial started before they end pays for them, and only the first trial of a run
    would."""
    api = cluster.api()
    started = time.monotonic()
    last_count, last_change = -1, started
    while True:
        try:
            count = node_events(api)
        except (ApiError, OSError) as exc:  # a slow apiserver: go on rather than fail the run
            say(f"could not count the node controller's events ({exc}); not waiting for them")
            return
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if count >= nodes or now - last_change >= quiet or now - started >= timeout:
            break
        say(f"waiting for the node controller's events: {count} of {nodes} posted")
        time.sleep(5.0)
    say(f"node controller's events: {last_count} posted ({time.monotonic() - started:.1f} s)")


@contextmanager
def bench_cluster(
    name: str,
    pools: Sequence[Pool],
    *,
    grace: float = 120.0,
    namespaces: Sequence[str] = (),
    timeout: float = 300.0,
    component_args: Mapping[str, Sequence[str]] | None = None,
    pod_addresses: str = "loopback",
) -> Iterator[Cluster]:
    """A fresh local cluster with the CRDs installed, stopped (with everything in it) after.

    ``grace``: node-monitor grace period. Leases are renewed every 40 % of it, so a long
    grace keeps hundreds of simulated nodes from adding lease traffic to the measurement
    (``quiet_grace`` sizes it for thousands). ``timeout``: seconds the start may take
    (registering thousands of simulated nodes takes minutes). ``component_args``: extra
    flags per component (``Cluster.start``; ``SCALE_ARGS`` for thousands of nodes).
    ``pod_addresses``: ``Cluster.start``'s (``routed``: Services get endpoints, as on GKE).
    """
    directory = CLUSTERS / f"bench-{name}"
    nodes = sum(p.vms for p in pools)
    say(f"starting a local cluster in {directory.relative_to(REPO)} ({nodes} simulated nodes)")
    with Cluster.start(
        directory,
        pools=list(pools),
        node_monitor_grace_period=grace,
        fresh=True,
        timeout=timeout,
        component_args=component_args,
        pod_addresses=pod_addresses,
    ) as cluster:
        say(f"cluster up in {cluster.startup_seconds:.1f} s; installing the CRDs")
        install_crds(cluster)
        settle_node_events(cluster, nodes)
        for namespace in namespaces:
            cluster.kubectl("create", "namespace", namespace)
        yield cluster
        say("stopping the cluster")


# Profiles ---------------------------------------------------------------------------------


PROFILE_FLAGS = os.environ.get("BENCH_PROFILE_FLAGS", "--nonblocking").split()
"""``py-spy record`` flags: by default it reads stacks without pausing the operator;
``--native`` (C frames: garbage collection, JSON) needs to pause it, so it replaces that."""


class Profiler:
    """``py-spy record`` attached to a running process; ``stop`` writes the stacks."""

    def __init__(self, process: asyncio.subprocess.Process, path: Path) -> None:
        self.process = process
        self.path = path

    async def stop(self) -> Path:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        say(f"profile written to {self.path}")
        for line in top_functions(self.path):
            say(f"  {line}")
        return self.path


async def profile(pid: int, directory: Path | None, name: str) -> Profiler | None:
    """Sample the thread of ``pid`` that holds the GIL at 100 Hz (where its Python CPU
    goes) until ``Profiler.stop``; None when ``directory`` is None. Collapsed stacks go to
    ``directory/name``."""
    if directory is None:
        return None
    executable, path = _profile_paths(directory, name)
    process = await asyncio.create_subprocess_exec(
        str(executable), "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
        "--gil", *PROFILE_FLAGS, "--output", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(0.5)  # attached before the timed part starts
    return Profiler(process, path)


def _profile_paths(directory: Path, name: str) -> tuple[Path, Path]:
    executable = Path(sys.executable).with_name("py-spy")
    if not executable.exists():
        raise SystemExit(f"--profile needs py-spy: {executable} is missing (make venv)")
    directory.mkdir(parents=True, exist_ok=True)
    return executable, directory / name


def top_functions(path: Path, count: int = 25) -> list[str]:
    """The functions with the most samples in a collapsed-stack file, by self time (the
    leaf frame) and by total time (anywhere on the stack), as printable lines."""
    if not path.exists():
        return [f"no profile at {path}"]
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        weight = int(n)
        samples += weight
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + weight
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + weight
    if not samples:
        return ["no samples"]
    lines = [f"{samples} samples; self %, total %, function"]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:count]:
        lines.append(f"{100 * n / samples:5.1f} {100 * total[frame] / samples:5.1f}  {frame}")
    return lines
