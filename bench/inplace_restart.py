"""Benchmark: in-place gang restart against restart by recreation and JobSet's restart.

On a local control plane with simulate-mode v5p node pools of 16, 64, 256 and 1,024 VMs
(topologies 4x4x4, 4x8x8, 8x8x16, 16x16x16; pods go Running as soon as they are bound, no
processes), one slice of N hosts is started and one worker's training process fails; the
time until every worker of the next attempt runs (and is Ready) is measured for:

- ``inplace``: ``tpu-operator run --in-place-restarts --control-key-file FILE`` and a
  TPUJob whose worker command is ``tpu-worker ...`` (failurePolicy.restartMode Auto), so
  its pods are supervised. The supervisors (and the kubelet's readiness prober) of the
  simulated pods are played by ``standin_supervisor.StandIn`` in this process: it serves
  the real protocol on every pod IP, verifies the operator's signatures with the job's
  key, and patches the pods' readiness when a "process" starts or ends. The failure: the
  process of one pod exits 1 (Ready turns False). Done when the job is Running as
  attempt 2 and every pod runs attempt 2 and is seen Ready (a pod carried in place keeps
  its label, the attempt it was created for).
- ``recreate``: the same job and the same operator with failurePolicy.restartMode
  Recreate. The failure: the node agent reports the worker container exited 1 (as
  ``pod_creation.py`` does). Done when every pod of attempt 2 is Running and the job is
  Running as attempt 2.
- ``jobset``: JobSet's restart (``pod_creation.trial_jobset``: one replicated Job with
  exclusive placement per node pool; the Job controller recreates the pods).

Sizes and repetitions are interleaved (order rotated per repetition); per size the figures
are medians [min-max] and per-repetition ratios against ``recreate``. All pod and job
times come from one watch per namespace in this process (``kwatch``); the in-place steps
(detection, stop, start, readiness) from the stand-in's log and the same watch.
The operator's API requests per restart come from its own metrics
(``tpu_operator_api_requests_total``), read 2 s after the restart ended (paced status
writes included), as is its CPU. Results: ``bench/results/inplace_restart.json`` at the
end, and every finished trial in ``inplace_restart.partial.json`` as it goes.

    .venv/bin/python bench/inplace_restart.py [--reps N] [--sizes 16 64 256 1024]
        [--variants inplace recreate jobset]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import harness
import pod_creation
from harness import say, spread, summary
from kwatch import Watch, connect
from standin_supervisor import StandIn

from localcluster.agent.kube import Kube
from tpu_operator import contract

TOPOLOGIES = {16: "4x4x4", 64: "4x8x8", 256: "8x8x16", 1024: "16x16x16"}
pod_creation.TOPOLOGIES.update(TOPOLOGIES)  # its JobSet and job builders look sizes up there
NAMESPACE = "bench-ip"
JOBSET_NAMESPACE = pod_creation.NAMESPACES["jobset"]
ATTEMPT = contract.LABEL_RESTART_ATTEMPT
TIMEOUT = 600.0
pod_creation.TIMEOUT = TIMEOUT  # 1,024-host drains and JobSet restarts take minutes
SETTLE = 2.0
"""Seconds before a failure (start-up writes done) and after a restart (paced writes)."""
VARIANTS = ("inplace", "recreate", "jobset")


@dataclass
class Bench:
    pc: pod_creation.Bench
    standin: StandIn
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api(self) -> Kube:
        return self.pc.api

    @property
    def operator(self) -> harness.Operator:
        assert self.pc.operator is not None
        return self.pc.operator


class TrackedWatch(Watch):
    """A pod watch that also keeps, per pod, every (time, attempt label, Ready) it saw,
    and hands each event to a listener (the stand-in)."""

    def __init__(self, api: Kube, path: str, listener: Callable[[str, dict], None]) -> None:
        super().__init__(api, path)
        self.listener = listener
        self.timeline: dict[str, list[tuple[float, str | None, bool]]] = {}

    def _apply(self, kind: str, obj: dict[str, Any], now: float) -> None:
        super()._apply(kind, obj, now)
        meta = obj["metadata"]
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        label = (meta.get("labels") or {}).get(ATTEMPT)
        self.timeline.setdefault(meta["uid"], []).append((now, label, ready))
        self.listener(kind, obj)

    def labelled_at(self, value: str, count: int) -> float | None:
        """When the ``count``-th pod was first seen labelled attempt ``value``."""
        firsts = [next((t for t, label, _ in events if label == value), None)
                  for events in self.timeline.values()]  # fmt: skip
        return Watch.nth(firsts, count)


READY_CHECK_EVERY = 0.1
"""At most one walk of every pod's timeline (``all_ready_at``) per 0.1 s while waiting: its
figure is the latest recorded time, whenever the walk finds it."""


def ready_since(
    events: list[tuple[float, str | None, bool]], start: float, value: str
) -> float | None:
    """When a pod whose process of attempt ``value`` started at ``start`` was first seen
    Ready from then on: at ``start`` if it was last seen Ready before it (a supervisor
    holds readiness across the operator's stop), else its first Ready after it. The
    pod's label is not read: a pod carried in place keeps the attempt it was created for
    (``value`` is kept for the callers)."""
    before = [e for e in events if e[0] <= start]
    if before and before[-1][2]:
        return start
    return next((t for t, _, ready in events if t > start and ready), None)


def all_ready_at(
    standin: StandIn, pods: TrackedWatch, job: str, hosts: int, attempt: int
) -> float | None:
    """When the last pod of ``job`` was seen labelled and Ready with ``attempt`` running."""
    procs = standin.of_job(job)
    if len(procs) < hosts:
        return None
    times = []
    for proc in procs:
        start = proc.started.get(attempt)
        if start is None or proc.attempt != attempt or not proc.running:
            return None
        at = ready_since(pods.timeline.get(proc.uid, []), start, str(attempt))
        if at is None:
            return None
        times.append(at)
    return max(times)


def supervising_operator(cluster: Any, name: str, namespace: str) -> tuple[bytes, harness.Operator]:
    """A new master key in the cluster's directory and an operator started with in-place
    restarts on ``namespace`` using it; the key (the stand-in supervisors verify with it)."""
    master = secrets.token_hex(32).encode()
    key_file = cluster.directory / "control.key"
    key_file.write_bytes(master)
    key_file.chmod(0o600)
    operator = harness.Operator(
        cluster,
        name,
        [f"--namespace={namespace}", "--in-place-restarts", f"--control-key-file={key_file}"],
    )
    operator.start()
    return master, operator


def tpujob(name: str, hosts: int, mode: str) -> dict[str, Any]:
    """pod_creation's one-slice TPUJob with a ``tpu-worker`` command and ``mode``."""
    body = pod_creation.tpujob(name, NAMESPACE, hosts)
    worker = body["spec"]["template"]["spec"]["containers"][0]
    worker["command"] = ["tpu-worker", "run", "-m", "bench_train"]
    body["spec"]["failurePolicy"]["restartMode"] = mode
    return body


LATENCY = "tpu_operator_api_request_duration_seconds"


def operator_counters(operator: harness.Operator) -> dict[str, float]:
    """The operator's API requests by verb so far, and its request-latency sums/counts."""
    text = operator.metrics()
    counters = harness.api_requests(text)
    for verb in ("POST", "PATCH", "DELETE"):
        counters[f"sum_{verb}"] = harness.counter_total(text, f"{LATENCY}_sum", verb=verb)
        counters[f"count_{verb}"] = harness.counter_total(text, f"{LATENCY}_count", verb=verb)
    return counters


def requests_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Requests per verb between two readings, their total, writes, and the mean latency
    of the POSTs, PATCHes and DELETEs in between."""
    delta = {v: after[v] - before[v] for v in after if not v.startswith(("sum_", "count_"))}
    delta["total"] = sum(delta.values())
    delta["writes"] = sum(delta[v] for v in ("POST", "PUT", "PATCH", "DELETE"))
    for verb in ("POST", "PATCH", "DELETE"):
        count = after[f"count_{verb}"] - before[f"count_{verb}"]
        spent = after[f"sum_{verb}"] - before[f"sum_{verb}"]
        delta[f"mean_latency_{verb}"] = spent / count if count else 0.0
    return delta


def offsets(times: list[float], origin: float) -> list[float]:
    """Sorted times after ``origin`` (per-pod step times, for throughput plots)."""
    return sorted(round(t - origin, 3) for t in times)


async def start_job(
    bench: Bench, name: str, hosts: int, mode: str
) -> tuple[TrackedWatch, Watch, str]:
    pods = TrackedWatch(bench.api, f"/api/v1/namespaces/{NAMESPACE}/pods", bench.standin.on_pod)
    await pods.start()
    jobs = await Watch(bench.api, pod_creation.jobs_path(NAMESPACE)).start()
    started = time.monotonic()
    body = tpujob(name, hosts, mode)
    created = await bench.api.call("POST", pod_creation.jobs_path(NAMESPACE), body)
    uid = created["metadata"]["uid"]
    bench.standin.register(name, uid)
    await pods.wait(lambda: pods.running_at(ATTEMPT, "1", hosts), TIMEOUT, f"{name} Running")
    await jobs.wait(lambda: jobs.phase_at(name, "Running", started), TIMEOUT, f"{name} phase")
    return pods, jobs, uid


async def finish(bench: Bench, pods: Watch, jobs: Watch) -> None:
    await jobs.stop()
    paths = [pod_creation.jobs_path(NAMESPACE), pod_creation.jobs_path(NAMESPACE, "tpuslices")]
    await pod_creation.drain(bench.pc, NAMESPACE, pods, paths)


def victim_of(name: str, hosts: int) -> str:
    return contract.pod_name(contract.slice_name(name, 0), hosts // 2)


async def trial_inplace(bench: Bench, hosts: int, rep: int) -> dict[str, Any]:
    name = f"ip{hosts}-{rep}"
    standin = bench.standin
    pods, jobs, _ = await start_job(bench, name, hosts, "Auto")
    await standin.wait(lambda: standin.serving(name) == hosts, TIMEOUT, f"{name} served")
    await asyncio.sleep(SETTLE)
    before, cpu, mark = operator_counters(bench.operator), bench.operator.cpu(), len(standin.events)
    harness.freeze_heap()
    failed = standin.fail(victim_of(name, hosts))
    await jobs.wait(
        lambda: jobs.phase_at(name, "Running", failed, attempt=2), TIMEOUT, f"{name} attempt 2"
    )
    await pods.wait(
        lambda: all_ready_at(standin, pods, name, hosts, 2),
        TIMEOUT,
        f"{name} attempt 2 Ready",
        every=READY_CHECK_EVERY,
    )
    done = all_ready_at(standin, pods, name, hosts, 2)
    job_running = jobs.phase_at(name, "Running", failed, attempt=2)
    assert done is not None and job_running is not None
    await asyncio.sleep(SETTLE)
    requests = requests_delta(before, operator_counters(bench.operator))
    cpu = bench.operator.cpu() - cpu
    events = standin.events[mark:]

    def at(kind: str, attempt: int | None = None, last: bool = False) -> float | None:
        times = [e.at for e in events if e.kind == kind and attempt in (None, e.attempt)]
        if not times:
            return None
        return (max(times) if last else min(times)) - failed

    counts: dict[str, int] = {}
    for event in events:
        counts[event.kind] = counts.get(event.kind, 0) + 1
    starts = [p.started[2] for p in standin.of_job(name) if 2 in p.started]
    per_pod = {
        "stop": offsets([e.at for e in events if e.kind == "stop"], failed),
        "start": offsets(starts, failed),
        "ready_true_written": offsets([e.at for e in events if e.kind == "ready-true"], failed),
    }
    restart = {
        "detected": at("status"),
        "first_stop": at("stop", 1),
        "last_stop": at("stop", 1, last=True),
        "relabelled_pods": sum(
            1 for seen in pods.timeline.values() if any(label == "2" for _, label, _ in seen)
        ),
        "first_start": at("start", 2),
        "last_start": at("start", 2, last=True),
        "all_started": max(starts) - failed,
        "all_new_ready": done - failed,
        "job_running": job_running - failed,
        "same_pods": all(s.deleted is None for s in pods.objects.values()),
        "standin": counts,
        "restart_kind": _last_status(jobs, name).get("restartKind"),
        "in_place_restarts": _last_status(jobs, name).get("inPlaceRestarts"),
        "api_requests": requests,
        "cpu": cpu,
        "per_pod": per_pod,
    }
    await finish(bench, pods, jobs)
    return {"restart": restart}


def _last_status(jobs: Watch, name: str) -> dict[str, Any]:
    return next((s for _, _, n, s in reversed(jobs.history) if n == name), {})


def _since(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


async def trial_recreate(bench: Bench, hosts: int, rep: int) -> dict[str, Any]:
    name = f"rc{hosts}-{rep}"
    pods, jobs, _ = await start_job(bench, name, hosts, "Recreate")
    await asyncio.sleep(SETTLE)
    before, cpu = operator_counters(bench.operator), bench.operator.cpu()
    harness.freeze_heap()
    failed = await pod_creation.kill(bench.pc, NAMESPACE, victim_of(name, hosts))
    await pods.wait(lambda: pods.running_at(ATTEMPT, "2", hosts), TIMEOUT, f"{name} attempt 2")
    await jobs.wait(
        lambda: jobs.phase_at(name, "Running", failed, attempt=2), TIMEOUT, f"{name} phase"
    )
    job_running = jobs.phase_at(name, "Running", failed, attempt=2)
    assert job_running is not None
    await asyncio.sleep(SETTLE)
    restart = pod_creation.restart_figures(pods, ATTEMPT, "1", "2", hosts, failed)
    restart["all_new_ready"] = max(restart["all_new_running"], job_running - failed)
    restart["job_running"] = job_running - failed
    restart["api_requests"] = requests_delta(before, operator_counters(bench.operator))
    restart["cpu"] = bench.operator.cpu() - cpu
    restart["restart_kind"] = _last_status(jobs, name).get("restartKind")
    await finish(bench, pods, jobs)
    return {"restart": restart}


async def trial_jobset(bench: Bench, hosts: int, rep: int) -> dict[str, Any]:
    result = await pod_creation.trial_jobset(bench.pc, hosts, rep, pinned=False)
    result["restart"]["all_new_ready"] = result["restart"]["all_new_running"]
    return result


Trial = Callable[[Bench, int, int], Awaitable[dict[str, Any]]]
TRIALS: dict[str, Trial] = {
    "inplace": trial_inplace,
    "recreate": trial_recreate,
    "jobset": trial_jobset,
}


async def run_trials(bench: Bench, variants: list[str], sizes: list[int], reps: int) -> None:
    say("warm-up: one untimed run of each variant at 16 hosts")
    for variant in variants:
        await TRIALS[variant](bench, 16, 0)
    for rep in range(1, reps + 1):
        for hosts in sizes:
            shift = (rep + sizes.index(hosts)) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                result = await TRIALS[variant](bench, hosts, rep)
                bench.trials.append({"variant": variant, "hosts": hosts, "rep": rep, **result})
                harness.write_results("inplace_restart.partial", {"trials": bench.trials})
                restart = result["restart"]
                api = restart.get("api_requests", {}).get("total")
                say(
                    f"rep {rep} {hosts:>4} hosts {variant:<8} restart -> all ready "
                    f"{restart['all_new_ready']:6.2f} s"
                    + (f"  operator API requests {api:.0f}" if api is not None else "")
                )


# Figures ---------------------------------------------------------------------------------


def pick(trials: list[dict[str, Any]], variant: str, hosts: int) -> dict[int, dict[str, Any]]:
    return {t["rep"]: t for t in trials if t["variant"] == variant and t["hosts"] == hosts}


def restart_stat(trials: dict[int, dict[str, Any]], *keys: str) -> dict[str, Any]:
    values = []
    for trial in trials.values():
        value: Any = trial["restart"]
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        values.append(value)
    return summary(values)


def ratio(mine: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per-repetition ratios of the restart times mine/base."""
    reps = sorted(set(mine) & set(base))
    get = lambda t: t["restart"]["all_new_ready"]  # noqa: E731
    return summary([get(mine[r]) / get(base[r]) for r in reps])


STEPS = (
    "detected", "first_stop", "last_stop", "first_start", "last_start", "all_started",
    "all_new_ready", "job_running",
)  # fmt: skip


def figures(trials: list[dict[str, Any]], variants: list[str], sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for hosts in sizes:
        base = pick(trials, "recreate", hosts)
        for variant in variants:
            mine = pick(trials, variant, hosts)
            entry: dict[str, Any] = {
                "restart_s": restart_stat(mine, "all_new_ready"),
                "vs_recreate": ratio(mine, base),
                "cpu_s": restart_stat(mine, "cpu"),
            }
            if variant != "jobset":
                entry["job_running_s"] = restart_stat(mine, "job_running")
                for verb in ("total", "writes", "GET", "LIST", "POST", "PATCH", "DELETE"):
                    entry[f"api_{verb}"] = restart_stat(mine, "api_requests", verb)
            if variant == "inplace":
                entry["steps"] = {step: restart_stat(mine, step) for step in STEPS}
                for kind in ("status", "stop", "start", "ready-false", "ready-true"):
                    entry[f"control_{kind}"] = restart_stat(mine, "standin", kind)
            else:
                entry["old_gone_s"] = restart_stat(mine, "old_gone")
            out[f"{variant}/{hosts}"] = entry
    if "inplace" in variants and sizes:
        first = out[f"inplace/{sizes[0]}"]["restart_s"]["median"]
        for hosts in sizes:
            entry = out[f"inplace/{hosts}"]
            median = entry["restart_s"]["median"]
            entry["growth_vs_smallest"] = None if not first else median / first
    return out


def report(results: dict[str, Any], variants: list[str], sizes: list[int]) -> None:
    rows = []
    for hosts in sizes:
        for variant in variants:
            f = results[f"{variant}/{hosts}"]
            rows.append([
                str(hosts), variant, spread(f["restart_s"]), spread(f["vs_recreate"]),
                spread(f["job_running_s"]) if "job_running_s" in f else "-",
                spread(f["api_total"], 0) if "api_total" in f else "-",
                spread(f["api_writes"], 0) if "api_writes" in f else "-",
                spread(f["cpu_s"]),
            ])  # fmt: skip
    print()
    print("Gang restart: one worker fails -> every worker of attempt 2 running and Ready")
    print(harness.table(
        ["hosts", "variant", "restart s", "vs recreate", "job Running s",
         "operator API requests", "of them writes", "CPU s"], rows))  # fmt: skip
    if "inplace" not in variants:
        return
    print()
    print("In-place steps, seconds after the failure (median over repetitions)")
    step_rows = []
    for hosts in sizes:
        f = results[f"inplace/{hosts}"]
        step_rows.append(
            [str(hosts)]
            + [harness.fmt(f["steps"][s]["median"]) for s in STEPS]
            + [
                spread(f["control_status"], 0),
                spread(f["control_stop"], 0),
                spread(f["control_start"], 0),
                harness.fmt(f.get("growth_vs_smallest")),
            ]
        )
    print(harness.table(
        ["hosts", "detected", "1st stop", "last stop", "1st start", "last start", "all started",
         "all Ready", "job Running",
         "status reqs", "stop reqs", "start reqs", "time vs smallest"], step_rows))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", choices=sorted(TOPOLOGIES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS)
    args = parser.parse_args()
    sizes = sorted(args.sizes or TOPOLOGIES)
    variants = list(args.variants or VARIANTS)
    pool_sizes = sorted({16, *sizes})  # 16: the warm-up
    pools = [harness.tpu_pool(pod_creation.pool_name(h), TOPOLOGIES[h], h) for h in pool_sizes]
    namespaces = [NAMESPACE] + ([JOBSET_NAMESPACE] if "jobset" in variants else [])
    outcome: dict[str, Any] = {"jobset": None}
    with harness.bench_cluster("inplace", pools, namespaces=namespaces) as cluster:
        master, operator = supervising_operator(cluster, "inplace", NAMESPACE)
        controller = None
        try:
            if "jobset" in variants:
                controller, outcome["jobset"] = pod_creation.start_jobset(cluster)
                if controller is None:
                    variants.remove("jobset")
            pc = pod_creation.Bench(cluster, None, operator, controller)  # type: ignore[arg-type]
            bench = Bench(pc, None)  # type: ignore[arg-type]
            hosts_loop = harness.run_hosts(drive(bench, master, variants, sizes, args.reps))
        finally:
            if controller is not None:
                controller.stop()
            operator.stop()
    results = figures(bench.trials, variants, sizes)
    report(results, variants, sizes)
    harness.write_results(
        "inplace_restart",
        {
            "machine": harness.machine(),
            "settings": {
                "sizes": sizes,
                "topologies": {h: TOPOLOGIES[h] for h in sizes},
                "reps": args.reps,
                "variants": variants,
                "readiness": "stand-in prober reacts at once (a kubelet: within 1 s)",
                "stand_in_loop": hosts_loop,
                "jobset_version": pod_creation.jobset.VERSION,
            },
            "jobset": outcome["jobset"],
            "figures": results,
            "trials": bench.trials,
        },
    )


async def drive(
    bench: Bench, master: bytes, variants: list[str], sizes: list[int], reps: int
) -> None:
    bench.pc.api = connect(bench.pc.cluster)
    bench.standin = StandIn(connect(bench.pc.cluster), master)
    try:
        await run_trials(bench, variants, sizes, reps)
    finally:
        await bench.standin.close()
        await bench.standin.api.close()
        await bench.pc.api.close()


if __name__ == "__main__":
    main()
