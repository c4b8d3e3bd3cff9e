"""Benchmark: the cost of progress sampling, per running job, with 100 and 1,000 jobs.

On a local control plane with one simulate-mode pool of single-host v5e VMs (2x2, one
pod per VM), N single-host TPUJobs run under ``tpu-operator run`` (default flags:
``--progress-publish-seconds=30``; each job has the default ``monitoring.sampleInterval``
of 10 s). Their metrics endpoints are served by a stand-in (``metrics_standin.py``: one
process answering on 0.0.0.0:<port> for every simulated pod IP, with the real worker's
metric families and synthetic, advancing values), because simulate-mode pods run no
process.

Measured in windows that alternate, on the same N running jobs, between monitoring on
(``spec.monitoring.enabled: true``, the default) and the baseline with monitoring off
(the same jobs patched to ``enabled: false``): per window, after a settling period that
lets the first publication burst pass,

- operator CPU (``/proc/<pid>/stat`` utime + stime) as % of one core;
- apiserver writes by the operator, per job per minute (the operator's own
  ``tpu_operator_api_requests_total``: PATCH, and all of POST/PUT/PATCH/DELETE);
- reads of worker endpoints per job per minute (``tpu_operator_worker_metric_reads_total``);
- apiserver CPU and the stand-in's CPU (context, not the operator's cost).

Ratios are on/off per pair of adjacent windows; medians and [min-max] over the pairs.

    .venv/bin/python bench/sampling_cost.py [--quick] [--jobs 100 1000] [--pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import say, spread, summary
from kwatch import connect

from localcluster import Cluster
from localcluster.agent.kube import MERGE_PATCH, Kube
from tpu_operator import contract

NAMESPACE = "bench-sample"
ACCELERATOR = "tpu-v5-lite-podslice"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.JOB_PLURAL}"


@dataclass
class Settings:
    jobs: list[int]
    pairs: int
    window: float
    settle: float


@dataclass
class Run:
    cluster: Cluster
    operator: harness.Operator
    standin: subprocess.Popen[bytes]
    port: int
    api: Kube = field(init=False)
    windows: list[dict[str, Any]] = field(default_factory=list)

    def apiserver_pid(self) -> int:
        return int(self.cluster.status()["processes"]["kube-apiserver"]["pid"])


def tpujob(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "slice": {"accelerator": ACCELERATOR, "topology": "2x2"},
            "ports": {"metrics": port},
            "template": {
                "spec": {
                    "containers": [
                        {"name": "worker", "image": "bench.local/w", "command": ["sleep", "inf"]}
                    ]
                }
            },
        },
    }


def job_name(index: int) -> str:
    return f"sj-{index:04d}"


async def bounded(coroutines: list[Any], limit: int = 16) -> None:
    slots = asyncio.Semaphore(limit)

    async def one(coroutine: Any) -> None:
        async with slots:
            await coroutine

    await asyncio.gather(*(one(c) for c in coroutines))


async def create_jobs(run: Run, first: int, last: int) -> None:
    say(f"creating TPUJobs {job_name(first)} .. {job_name(last - 1)}")
    await bounded(
        [run.api.call("POST", JOBS, tpujob(job_name(i), run.port)) for i in range(first, last)]
    )
    deadline = time.monotonic() + 900
    while True:
        items = (await run.api.call("GET", JOBS))["items"]
        running = sum((j.get("status") or {}).get("phase") == "Running" for j in items)
        say(f"  {running}/{len(items)} TPUJobs Running")
        if running == len(items) == last:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {running} of {last} TPUJobs Running after 15 min")
        await asyncio.sleep(5)


async def set_monitoring(run: Run, count: int, enabled: bool) -> None:
    patch = {"spec": {"monitoring": {"enabled": enabled}}}
    await bounded(
        [
            run.api.call("PATCH", f"{JOBS}/{job_name(i)}", patch, content_type=MERGE_PATCH)
            for i in range(count)
        ]
    )


def reading(run: Run) -> dict[str, float]:
    """Counters at one moment: CPU of the three processes, the operator's requests, reads."""
    text = run.operator.metrics()
    requests = harness.api_requests(text)
    return {
        "t": time.monotonic(),
        "operator_cpu": run.operator.cpu(),
        "apiserver_cpu": harness.cpu_seconds(run.apiserver_pid()),
        "standin_cpu": harness.cpu_seconds(run.standin.pid),
        "reads": harness.counter_total(text, "tpu_operator_worker_metric_reads_total"),
        **{f"req_{verb}": value for verb, value in requests.items()},
    }


async def window(run: Run, jobs: int, enabled: bool, settings: Settings) -> dict[str, Any]:
    mode = "on" if enabled else "off"
    await set_monitoring(run, jobs, enabled)
    say(f"  {jobs} jobs, monitoring {mode}: settling {settings.settle:.0f} s")
    await asyncio.sleep(settings.settle)
    say(f"  {jobs} jobs, monitoring {mode}: measuring {settings.window:.0f} s")
    before = await asyncio.to_thread(reading, run)
    await asyncio.sleep(settings.window)
    after = await asyncio.to_thread(reading, run)
    delta = {k: after[k] - before[k] for k in before}
    minutes = delta["t"] / 60
    per_job_minute = jobs * minutes
    result = {
        "jobs": jobs,
        "monitoring": mode,
        "seconds": delta["t"],
        "operator_cpu_pct": 100 * delta["operator_cpu"] / delta["t"],
        "apiserver_cpu_pct": 100 * delta["apiserver_cpu"] / delta["t"],
        "standin_cpu_pct": 100 * delta["standin_cpu"] / delta["t"],
        "patches_per_job_min": delta["req_PATCH"] / per_job_minute,
        "writes_per_job_min": sum(delta[f"req_{v}"] for v in WRITES) / per_job_minute,
        "reads_per_job_min": delta["reads"] / per_job_minute,
        "requests": {k[4:]: v for k, v in delta.items() if k.startswith("req_")},
    }
    say(
        f"  -> operator CPU {result['operator_cpu_pct']:.1f}% of a core, "
        f"{result['patches_per_job_min']:.2f} PATCH/job/min, "
        f"{result['writes_per_job_min']:.2f} writes/job/min, "
        f"{result['reads_per_job_min']:.1f} reads/job/min"
    )
    return result


async def measure(run: Run, settings: Settings) -> None:
    run.api = connect(run.cluster)
    try:
        created = 0
        for jobs in settings.jobs:
            await create_jobs(run, created, jobs)
            created = jobs
            for pair in range(settings.pairs):
                order = (True, False) if pair % 2 == 0 else (False, True)
                for enabled in order:
                    result = await window(run, jobs, enabled, settings)
                    run.windows.append({"pair": pair, **result})
    finally:
        await run.api.close()


def start_standin(cluster: Cluster, port: int) -> subprocess.Popen[bytes]:
    log = open(cluster.logs_dir / "metrics-standin.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("metrics_standin.py")), f"--port={port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=1):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the metrics stand-in did not start")


FIGURES = (
    "operator_cpu_pct",
    "patches_per_job_min",
    "writes_per_job_min",
    "reads_per_job_min",
    "apiserver_cpu_pct",
    "standin_cpu_pct",
)


def figures(windows: list[dict[str, Any]], jobs_list: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for jobs in jobs_list:
        mine = [w for w in windows if w["jobs"] == jobs]
        on = {w["pair"]: w for w in mine if w["monitoring"] == "on"}
        off = {w["pair"]: w for w in mine if w["monitoring"] == "off"}
        entry: dict[str, Any] = {}
        for key in FIGURES:
            entry[f"{key}_on"] = summary([w[key] for w in on.values()])
            entry[f"{key}_off"] = summary([w[key] for w in off.values()])
        entry["operator_cpu_ratio"] = summary(
            [on[p]["operator_cpu_pct"] / off[p]["operator_cpu_pct"] for p in on if p in off]
        )
        entry["operator_cpu_pct_per_100_jobs_added"] = summary(
            [100 * (on[p]["operator_cpu_pct"] - off[p]["operator_cpu_pct"]) / jobs
             for p in on if p in off]
        )  # fmt: skip
        out[str(jobs)] = entry
    return out


def report(results: dict[str, Any]) -> None:
    rows = []
    for jobs, f in results.items():
        for mode in ("on", "off"):
            digits = (1, 2, 2, 1, 1)
            keys = ("operator_cpu_pct", "patches_per_job_min", "writes_per_job_min",
                    "reads_per_job_min", "apiserver_cpu_pct")  # fmt: skip
            rows.append(
                [jobs, mode]
                + [spread(f[f"{k}_{mode}"], d) for k, d in zip(keys, digits, strict=True)]
            )
    print()
    print("Progress sampling cost (median [min-max] over windows; stand-in metrics endpoints)")
    print(harness.table(
        ["jobs", "monitoring", "operator CPU % of 1 core", "PATCH /job/min", "writes /job/min",
         "endpoint reads /job/min", "apiserver CPU %"], rows))  # fmt: skip
    print()
    ratio_rows = [
        [jobs, spread(f["operator_cpu_ratio"]), spread(f["operator_cpu_pct_per_100_jobs_added"])]
        for jobs, f in results.items()
    ]
    headers = ["jobs", "operator CPU on/off", "added CPU % of 1 core per 100 jobs"]
    print(harness.table(headers, ratio_rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 jobs, one pair of 40 s windows")
    parser.add_argument("--jobs", type=int, nargs="+")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--window", type=float)
    parser.add_argument("--settle", type=float, default=30.0)
    args = parser.parse_args()
    settings = Settings(
        jobs=sorted(args.jobs or ([100] if args.quick else [100, 1000])),
        pairs=args.pairs or (1 if args.quick else 2),
        window=args.window or (40.0 if args.quick else 60.0),
        settle=args.settle,
    )
    vms = max(settings.jobs)
    pool = harness.Pool(
        name="v5e-1", vms=vms, accelerator=ACCELERATOR, topology="2x2", mode="simulate"
    )
    port = harness.free_port()
    # A long node-monitor grace period: 1,000 nodes' lease renewals stay ~4 requests/s.
    with harness.bench_cluster("sampling", [pool], grace=600.0, namespaces=[NAMESPACE]) as cluster:
        standin = start_standin(cluster, port)
        operator = harness.Operator(cluster, "sampling", [f"--namespace={NAMESPACE}"])
        try:
            operator.start()
            run = Run(cluster, operator, standin, port)
            asyncio.run(measure(run, settings))
        finally:
            operator.stop()
            standin.terminate()
            standin.wait(10)
    results = figures(run.windows, settings.jobs)
    report(results)
    harness.write_results(
        "sampling_cost",
        {
            "machine": harness.machine(),
            "settings": vars(settings)
            | {
                "sample_interval": "10s (default)",
                "progress_publish_seconds": "30 (default)",
                "endpoints": "stand-in (bench/metrics_standin.py), not real workers",
            },
            "figures": results,
            "windows": run.windows,
        },
    )


if __name__ == "__main__":
    main()
