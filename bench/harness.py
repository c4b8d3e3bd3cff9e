"""Shared harness of the control-plane benchmarks: cluster, operator process, figures, output.

Every benchmark here runs on a real local control plane (``localcluster``) and reports its
figures as ratios against a baseline measured in the same run, because the machine is
small and shared: absolute times move with whatever else runs on it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import Cluster, Pool  # noqa: E402
from tests.operator.support import (  # noqa: E402
    OperatorProcess,
    free_port,
    install_crds,
    wait_crd,
)

__all__ = ["free_port", "wait_crd"]
RESULTS = REPO / "bench" / "results"
CLUSTERS = REPO / ".localcluster"
_STARTED = time.monotonic()


def say(message: str) -> None:
    """One progress line, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", flush=True)


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
    """A Markdown table (pastes into bench/README.md as it is)."""
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


class Operator(OperatorProcess):
    """``tpu-operator run`` as a subprocess (the integration tests' launcher)."""

    def __init__(self, cluster: Cluster, name: str, args: Sequence[str] = ()) -> None:
        log_path = cluster.logs_dir / f"operator-{name}.log"
        super().__init__(cluster.kubeconfig, log_path, list(args))

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def requests(self) -> dict[str, float]:
        return api_requests(self.metrics())


# Cluster ---------------------------------------------------------------------------------


def tpu_pool(name: str, topology: str, vms: int, accelerator: str = "tpu-v5p-slice") -> Pool:
    """A simulate-mode TPU node pool (pods go Running at once, no processes)."""
    return Pool(name=name, vms=vms, accelerator=accelerator, topology=topology, mode="simulate")


@contextmanager
def bench_cluster(
    name: str, pools: Sequence[Pool], *, grace: float = 120.0, namespaces: Sequence[str] = ()
) -> Iterator[Cluster]:
    """A fresh local cluster with the CRDs installed, stopped (with everything in it) after.

    ``grace``: node-monitor grace period. Leases are renewed every 40 % of it, so a long
    grace keeps hundreds of simulated nodes from adding lease traffic to the measurement.
    """
    directory = CLUSTERS / f"bench-{name}"
    nodes = sum(p.vms for p in pools)
    say(f"starting a local cluster in {directory.relative_to(REPO)} ({nodes} simulated nodes)")
    with Cluster.start(
        directory, pools=list(pools), node_monitor_grace_period=grace, fresh=True, timeout=300
    ) as cluster:
        say(f"cluster up in {cluster.startup_seconds:.1f} s; installing the CRDs")
        install_crds(cluster)
        for namespace in namespaces:
            cluster.kubectl("create", "namespace", namespace)
        yield cluster
        say("stopping the cluster")
