"""Benchmark: TPUJob create -> pods created -> Running, and gang restart latency.

On a local control plane with simulate-mode v5p node pools of 16, 64 and 256 VMs (pods
go Running as soon as they are bound, no processes), three ways of running one slice of
N hosts, interleaved in each repetition (order rotated):

- ``operator``: ``tpu-operator run`` (a subprocess watching namespace bench-op) gets one
  TPUJob; timed from the POST of the TPUJob.
- ``bare``: the practical limit. A separate process with the official ``kubernetes``
  client in 32 threads (the operator's default --api-concurrency; raw JSON, no model
  deserialization) POSTs the same N pods (built with the operator's ``worker_pod``, owned
  by a TPUSlice object no controller watches); timed from the go signal.
- ``jobset``: JobSet (built from its Go module, see ``jobset.py``) with one replicated
  Job of N Indexed pods, as GKE's TPU guides write it: exclusive placement per node pool
  through the ``alpha.jobset.sigs.k8s.io/exclusive-topology`` annotation. The Job
  controller of the real kube-controller-manager (client QPS 200 here) creates the pods.
  ``jobset-pinned`` (optional) pins the node pool with a nodeSelector instead.

Then one worker is failed (the agent reports exit code 1) and the time until every pod of
the next attempt is Running is measured: the operator's gang restart (backoffSeconds 0);
the bare client's minimal gang restart (watch, concurrent DELETE of every pod, wait until
all are gone, recreate); JobSet's failurePolicy restart (Job backoffLimit 0).

All times come from one watch per namespace in this process (``kwatch``). Figures are
ratios against the bare client of the same size and repetition; medians and [min-max]
over the repetitions.

    .venv/bin/python bench/pod_creation.py [--quick] [--reps N] [--sizes 16 64 256]
        [--variants operator bare jobset jobset-pinned]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import jobset
from harness import say, spread, summary
from kwatch import Watch, connect

from localcluster import Cluster
from localcluster.agent.kube import Kube
from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.slices import job_slice
from tpu_operator.builders.wiring import PodWiring

ACCELERATOR = "tpu-v5p-slice"
TOPOLOGIES = {16: "4x4x4", 64: "4x8x8", 256: "8x8x16", 1024: "16x16x16"}
NAMESPACES = {
    "operator": "bench-op",
    "bare": "bench-bare",
    "bare-collection": "bench-barec",
    "jobset": "bench-js",
    "jobset-pinned": "bench-jsp",
    "operator-b": "bench-opb",
}
ATTEMPT = contract.LABEL_RESTART_ATTEMPT
CONCURRENCY = 32
TEMPLATE = harness.WORKER_TEMPLATE
TIMEOUT = 180.0


def pool_name(hosts: int) -> str:
    return f"v5p-{hosts}"


def shape(hosts: int) -> catalog.SliceShape:
    return catalog.shape(ACCELERATOR, TOPOLOGIES[hosts])


@dataclass
class Bench:
    cluster: Cluster
    api: Kube
    operator: harness.Operator | None
    jobset: jobset.JobSetController | None
    operator_b: harness.Operator | None = None
    """``operator-b``: a second operator with ``--b-args``, for an A/B in the same run."""
    trials: list[dict[str, Any]] = field(default_factory=list)
    profile: Path | None = None
    """Where py-spy writes the operator's stacks per timed trial (``--profile``)."""

    def kcm_pid(self) -> int:
        return int(self.cluster.status()["processes"]["kube-controller-manager"]["pid"])


# Shared steps ----------------------------------------------------------------------------


async def pod_watch(bench: Bench, namespace: str) -> Watch:
    return await Watch(bench.api, f"/api/v1/namespaces/{namespace}/pods").start()


async def kill(bench: Bench, namespace: str, pod: str) -> float:
    """Fail one worker (the agent reports exit code 1); the monotonic time just before."""
    started = time.monotonic()
    await asyncio.to_thread(bench.cluster.agent.kill_pod, namespace, pod, exit_code=1)
    return started


async def drain(bench: Bench, namespace: str, pods: Watch, collections: list[str]) -> None:
    """Delete what a trial left (owners first, then any pods) and wait until it is gone."""
    for path in collections:
        await bench.api.call(
            "DELETE",
            f"{path}?propagationPolicy=Background",
            ok=(404,),
        )
    try:
        await bench.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", ok=(404,))
    except TimeoutError:
        # The apiserver works through a collection DELETE serially and keeps going after
        # the client's timeout (1,024 pods take longer than it); the watch below waits.
        say(f"collection DELETE of the pods of {namespace} timed out; waiting for them")
    await pods.wait(lambda: not pods.alive(), TIMEOUT, f"the pods of {namespace} to be gone")
    for path in collections:
        await wait_empty(bench, path)
    await pods.stop()


async def wait_empty(bench: Bench, path: str) -> None:
    """Poll a collection until it is empty (the garbage collector works in the background)."""
    deadline = time.monotonic() + TIMEOUT
    while (await bench.api.call("GET", path)).get("items"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} still has items after {TIMEOUT:.0f} s")
        await asyncio.sleep(0.2)


def restart_figures(pods: Watch, label: str, old: str, new: str, hosts: int, t: float):
    def since(value: float | None) -> float | None:
        return None if value is None else value - t

    return {
        "first_deleting": since(pods.deleting_at(label, old)),
        "all_deleting": since(pods.deleting_at(label, old, hosts)),
        "old_gone": since(pods.gone_at(label, old)),
        "first_new_created": since(pods.created_at(label, new, 1)),
        "all_new_created": since(pods.created_at(label, new, hosts)),
        "all_new_running": since(pods.running_at(label, new, hosts)),
    }


# Operator --------------------------------------------------------------------------------


def tpujob(name: str, namespace: str, hosts: int) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "slice": {"accelerator": ACCELERATOR, "topology": TOPOLOGIES[hosts]},
            "template": copy.deepcopy(TEMPLATE),
            "failurePolicy": {"maxRestarts": 1000, "backoffSeconds": 0},
        },
    }


def jobs_path(namespace: str, plural: str = contract.JOB_PLURAL) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{plural}"


async def trial_operator(bench: Bench, hosts: int, rep: int, variant: str = "operator"):
    operator = bench.operator_b if variant == "operator-b" else bench.operator
    assert operator is not None
    namespace = NAMESPACES[variant]
    name = f"{'opb' if variant == 'operator-b' else 'op'}{hosts}-{rep}"
    pods = await pod_watch(bench, namespace)
    jobs = await Watch(bench.api, jobs_path(namespace)).start()
    profiler = await harness.profile(operator.pid, bench.profile, f"{name}.txt")
    cpu, counters = operator.cpu(), operator.counters()
    started = time.monotonic()
    await bench.api.call("POST", jobs_path(namespace), tpujob(name, namespace, hosts))
    await pods.wait(lambda: pods.running_at(ATTEMPT, "1", hosts), TIMEOUT, f"{name} Running")
    await jobs.wait(lambda: jobs.phase_at(name, "Running", started), TIMEOUT, f"{name} phase")
    result = {
        "created": pods.created_at(ATTEMPT, "1", hosts) - started,  # type: ignore[operator]
        "running": pods.running_at(ATTEMPT, "1", hosts) - started,  # type: ignore[operator]
        "job_running": jobs.phase_at(name, "Running", started) - started,  # type: ignore[operator]
        "cpu": operator.cpu() - cpu,
        "counters": harness.deltas(operator.counters(), counters),
    }
    victim = contract.pod_name(contract.slice_name(name, 0), hosts // 2)
    cpu, counters = operator.cpu(), operator.counters()
    failed = await kill(bench, namespace, victim)
    await pods.wait(lambda: pods.running_at(ATTEMPT, "2", hosts), TIMEOUT, f"{name} attempt 2")
    await jobs.wait(
        lambda: jobs.phase_at(name, "Running", failed, attempt=2), TIMEOUT, f"{name} phase"
    )
    restart = restart_figures(pods, ATTEMPT, "1", "2", hosts, failed)
    restart["job_running"] = jobs.phase_at(name, "Running", failed, attempt=2) - failed  # type: ignore[operator]
    restart["cpu"] = operator.cpu() - cpu
    restart["counters"] = harness.deltas(operator.counters(), counters)
    result["restart"] = restart
    if profiler is not None:
        await profiler.stop()
    await jobs.stop()
    await drain(bench, namespace, pods, [jobs_path(namespace), jobs_path(namespace, "tpuslices")])
    return result


# Bare client -----------------------------------------------------------------------------


def slice_pod(
    name: str,
    namespace: str,
    hosts: int,
    worker: int,
    attempt: int,
    owner: Owner,
    placement: NodePlacement,
) -> dict[str, Any]:
    """Worker ``worker`` of a one-slice job named ``name``, built by the operator's code."""
    wiring = PodWiring(
        job_name=name,
        service=name,
        slice_name=contract.slice_name(name, 0),
        shape=shape(hosts),
        num_slices=1,
        slice_index=0,
        worker_index=worker,
        attempt=attempt,
    )
    return worker_pod(
        namespace=namespace, wiring=wiring, template=TEMPLATE, owner=owner, placement=placement
    )


def bare_pods(name: str, namespace: str, hosts: int, owner: Owner, attempt: int):
    placement = NodePlacement(node_pool=pool_name(hosts))
    return [
        slice_pod(name, namespace, hosts, worker, attempt, owner, placement)
        for worker in range(hosts)
    ]


async def bare_owner(bench: Bench, name: str, namespace: str, hosts: int) -> Owner:
    """A TPUSlice as the pods' owner (same ownerReference as the operator's pods); no
    controller watches this namespace, so it stays inert."""
    body = job_slice(
        job_name=name,
        namespace=namespace,
        job_spec=tpujob(name, namespace, hosts)["spec"],
        index=0,
        attempt=1,
        owner=Owner(contract.API_VERSION, contract.JOB_KIND, name, "0"),
        node_pool=pool_name(hosts),
        not_before=None,
        suspend=False,
    )
    del body["metadata"]["ownerReferences"]
    created = await bench.api.call("POST", jobs_path(namespace, "tpuslices"), body)
    return Owner(contract.API_VERSION, contract.SLICE_KIND, body["metadata"]["name"],
                 created["metadata"]["uid"])  # fmt: skip


class BareProcess:
    """bare_client.py as a subprocess, one line of JSON per event."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, bench: Bench, namespace: str, pods_file: Path, delete: str) -> BareProcess:
        log = open(bench.cluster.logs_dir / "bare-client.log", "ab")  # noqa: ASYNC230, SIM115
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).with_name("bare_client.py")),
            f"--kubeconfig={bench.cluster.kubeconfig}",
            f"--namespace={namespace}",
            f"--pods={pods_file}",
            f"--concurrency={CONCURRENCY}",
            "--restart",
            f"--delete={delete}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        log.close()
        bare = cls(process)
        await bare.expect("ready")
        return bare

    async def expect(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), TIMEOUT)
            if not line:
                raise RuntimeError(f"the bare client exited before {event!r}")
            message = json.loads(line)
            if message["event"] == event:
                return message

    async def go(self) -> float:
        assert self.process.stdin is not None
        started = time.monotonic()
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()
        return started

    async def close(self) -> None:
        """Let it finish (it exits after ``recreated``); kill it if it does not."""
        if self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def trial_bare(bench: Bench, hosts: int, rep: int, delete: str = "each") -> dict[str, Any]:
    variant = "bare" if delete == "each" else "bare-collection"
    namespace, name = NAMESPACES[variant], f"bare{hosts}-{rep}"
    owner = await bare_owner(bench, name, namespace, hosts)
    pods_file = bench.cluster.directory / f"{name}.pods.json"
    pods_file.write_text(
        json.dumps(
            {
                "first": bare_pods(name, namespace, hosts, owner, 1),
                "second": bare_pods(name, namespace, hosts, owner, 2),
            }
        )
    )
    pods = await pod_watch(bench, namespace)
    bare = await BareProcess.start(bench, namespace, pods_file, delete)
    try:
        result = await bare_run(bench, bare, pods, namespace, name, hosts)
    finally:
        await bare.close()
        pods_file.unlink()
    await drain(bench, namespace, pods, [jobs_path(namespace, "tpuslices")])
    return result


async def bare_run(
    bench: Bench, bare: BareProcess, pods: Watch, namespace: str, name: str, hosts: int
) -> dict[str, Any]:
    started = await bare.go()
    go = await bare.expect("go")
    await pods.wait(lambda: pods.running_at(ATTEMPT, "1", hosts), TIMEOUT, f"{name} Running")
    created = await bare.expect("created")
    result = {
        "created": pods.created_at(ATTEMPT, "1", hosts) - started,  # type: ignore[operator]
        "running": pods.running_at(ATTEMPT, "1", hosts) - started,  # type: ignore[operator]
        "client_done": created["t"] - started,
        "cpu": created["cpu"] - go["cpu"],
    }
    victim = contract.pod_name(contract.slice_name(name, 0), hosts // 2)
    failed = await kill(bench, namespace, victim)
    await pods.wait(lambda: pods.running_at(ATTEMPT, "2", hosts), TIMEOUT, f"{name} attempt 2")
    recreated = await bare.expect("recreated")
    result["restart"] = restart_figures(pods, ATTEMPT, "1", "2", hosts, failed)
    result["restart"]["cpu"] = recreated["cpu"] - created["cpu"]
    return result


# JobSet ----------------------------------------------------------------------------------


def jobset_manifest(name: str, namespace: str, hosts: int, pinned: bool) -> dict[str, Any]:
    """The equivalent JobSet: one slice = one Indexed Job of ``hosts`` pods, the same pod
    spec as the operator's worker 0."""
    placement = NodePlacement(node_pool=pool_name(hosts) if pinned else None)
    owner = Owner("v1", "None", "none", "0")  # dropped: the Job owns its pods
    pod = slice_pod(name, namespace, hosts, 0, 1, owner, placement)
    return jobset.manifest(name, namespace, pod, hosts=hosts, slices=1, exclusive=not pinned)


async def trial_jobset(bench: Bench, hosts: int, rep: int, pinned: bool) -> dict[str, Any]:
    assert bench.jobset is not None
    variant = "jobset-pinned" if pinned else "jobset"
    namespace, name = NAMESPACES[variant], f"js{hosts}-{rep}"
    label = jobset.ATTEMPT_LABEL
    path = f"{jobset.API}/namespaces/{namespace}/jobsets"
    pods = await pod_watch(bench, namespace)
    cpu = bench.jobset.cpu() + harness.cpu_seconds(bench.kcm_pid())
    started = time.monotonic()
    await bench.api.call("POST", path, jobset_manifest(name, namespace, hosts, pinned))
    await pods.wait(lambda: pods.running_at(label, "0", hosts), TIMEOUT, f"{name} Running")
    result = {
        "created": pods.created_at(label, "0", hosts) - started,  # type: ignore[operator]
        "running": pods.running_at(label, "0", hosts) - started,  # type: ignore[operator]
        "cpu": bench.jobset.cpu() + harness.cpu_seconds(bench.kcm_pid()) - cpu,
    }
    victim = sorted(s.name for s in pods.group(label, "0"))[hosts // 2]
    cpu = bench.jobset.cpu() + harness.cpu_seconds(bench.kcm_pid())
    failed = await kill(bench, namespace, victim)
    await pods.wait(lambda: pods.running_at(label, "1", hosts), TIMEOUT, f"{name} attempt 2")
    result["restart"] = restart_figures(pods, label, "0", "1", hosts, failed)
    result["restart"]["cpu"] = bench.jobset.cpu() + harness.cpu_seconds(bench.kcm_pid()) - cpu
    batch = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    await drain(bench, namespace, pods, [path, batch])
    return result


# Runs ------------------------------------------------------------------------------------

Trial = Callable[[Bench, int, int], Awaitable[dict[str, Any]]]
TRIALS: dict[str, Trial] = {
    "operator": trial_operator,
    "operator-b": lambda b, h, r: trial_operator(b, h, r, variant="operator-b"),
    "bare": trial_bare,
    "bare-collection": lambda b, h, r: trial_bare(b, h, r, delete="collection"),
    "jobset": lambda b, h, r: trial_jobset(b, h, r, pinned=False),
    "jobset-pinned": lambda b, h, r: trial_jobset(b, h, r, pinned=True),
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
                say(
                    f"rep {rep} {hosts:>3} hosts {variant:<13} created "
                    f"{result['created']:6.2f} s  running {result['running']:6.2f} s  "
                    f"restart->running {result['restart']['all_new_running']:6.2f} s"
                )


Getter = Callable[[dict[str, Any]], float]


def pick(trials: list[dict[str, Any]], variant: str, hosts: int) -> dict[int, dict[str, Any]]:
    return {t["rep"]: t for t in trials if t["variant"] == variant and t["hosts"] == hosts}


def restart_value(key: str) -> Getter:
    return lambda trial: trial["restart"][key]


def field_value(key: str) -> Getter:
    return lambda trial: trial[key]


def times(trials: dict[int, dict[str, Any]], get: Getter) -> dict[str, Any]:
    return summary([get(t) for t in trials.values()])


def ratios(
    mine: dict[int, dict[str, Any]],
    base: dict[int, dict[str, Any]],
    get: Getter,
    base_get: Getter | None = None,
    inverse: bool = False,
) -> dict[str, Any]:
    """Per-repetition ratios mine/base (base/mine when ``inverse``: rates from times)."""
    base_get = base_get or get
    values = [get(mine[r]) / base_get(base[r]) for r in sorted(set(mine) & set(base))]
    return summary([1 / v for v in values] if inverse else values)


def figures(trials: list[dict[str, Any]], variants: list[str], sizes: list[int]):
    """Per size and variant: medians of the times and of the per-repetition ratios."""
    out: dict[str, Any] = {}
    for hosts in sizes:
        base = pick(trials, "bare", hosts)
        for variant in variants:
            mine = pick(trials, variant, hosts)
            created, running = field_value("created"), field_value("running")
            restarted = restart_value("all_new_running")
            entry = {
                "created_s": times(mine, created),
                "running_s": times(mine, running),
                "pods_per_s": times(mine, lambda t, h=hosts: h / t["created"]),
                "create_rate_ratio": ratios(mine, base, created, inverse=True),
                "running_time_ratio": ratios(mine, base, running),
                "cpu_s": times(mine, field_value("cpu")),
                "restart_running_s": times(mine, restarted),
                "restart_reaction_s": times(mine, restart_value("first_deleting")),
                "restart_old_gone_s": times(mine, restart_value("old_gone")),
                "restart_time_ratio": ratios(mine, base, restarted),
                "restart_cpu_s": times(mine, restart_value("cpu")),
            }
            if variant.startswith("operator"):
                job_running = field_value("job_running")
                entry["job_running_s"] = times(mine, job_running)
                entry["job_running_ratio"] = ratios(mine, base, job_running, running)
                entry["restart_job_running_s"] = times(mine, restart_value("job_running"))
            out[f"{variant}/{hosts}"] = entry
    return out


def report(results: dict[str, Any], variants: list[str], sizes: list[int]) -> None:
    rows, restart_rows = [], []
    for hosts in sizes:
        for variant in variants:
            f = results[f"{variant}/{hosts}"]
            rows.append([
                str(hosts), variant, spread(f["created_s"]), spread(f["pods_per_s"], 0),
                spread(f["create_rate_ratio"]), spread(f["running_s"]),
                spread(f["running_time_ratio"]),
                spread(f["job_running_s"]) if "job_running_s" in f else "-",
            ])  # fmt: skip
            restart_rows.append([
                str(hosts), variant, spread(f["restart_reaction_s"]),
                spread(f["restart_old_gone_s"]), spread(f["restart_running_s"]),
                spread(f["restart_time_ratio"]),
            ])  # fmt: skip
    print()
    print("Pod creation (median [min-max] over repetitions; ratios per repetition vs bare)")
    print(harness.table(
        ["hosts", "variant", "all created s", "pods/s", "rate vs bare", "all Running s",
         "time vs bare", "job phase Running s"], rows))  # fmt: skip
    print()
    print("Gang restart: one worker fails -> every pod of the next attempt Running")
    print(harness.table(
        ["hosts", "variant", "first old pod deleted s", "old pods gone s", "all new Running s",
         "time vs bare"],
        restart_rows))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 and 64 hosts, 2 repetitions")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", choices=sorted(TOPOLOGIES))
    parser.add_argument("--variants", nargs="+", choices=list(TRIALS))
    parser.add_argument(
        "--b-args",
        default="",
        help="flags of the operator-b variant (a second operator run side by side for an "
        "A/B of an operator setting), e.g. --b-args='--gc-threshold=0'",
    )
    parser.add_argument(
        "--b-source",
        type=Path,
        metavar="DIR",
        help="run the operator-b variant from another checkout (e.g. `git worktree add "
        "/tmp/base HEAD~3`), for an A/B of two versions of the operator in the same run",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record the operator with py-spy during each timed trial (create and restart) "
        "into DIR/<trial>.txt (collapsed stacks) and print the top functions",
    )
    args = parser.parse_args()
    sizes = args.sizes or ([16, 64] if args.quick else [16, 64, 256])
    reps = 2 if args.quick and args.reps == 5 else args.reps
    variants = args.variants or ["operator", "bare", "bare-collection", "jobset"]
    # The 16-host pool is always there: the warm-up runs on it.
    pools = [harness.tpu_pool(pool_name(h), TOPOLOGIES[h], h) for h in sorted({16, *sizes})]
    outcome: dict[str, Any] = {"jobset": None}
    with harness.bench_cluster(
        "pods", pools, namespaces=[NAMESPACES[v] for v in variants]
    ) as cluster:
        operator = None
        if "operator" in variants:
            operator = harness.Operator(cluster, "pods", [f"--namespace={NAMESPACES['operator']}"])
            operator.start()
        operator_b = None
        if "operator-b" in variants:
            operator_b = harness.Operator(
                cluster,
                "pods-b",
                [f"--namespace={NAMESPACES['operator-b']}", *args.b_args.split()],
                source=args.b_source,
            )
            operator_b.start()
        controller = None
        try:
            if any(v.startswith("jobset") for v in variants):
                controller, outcome["jobset"] = start_jobset(cluster)
                if controller is None:
                    variants = [v for v in variants if not v.startswith("jobset")]
            bench = Bench(
                cluster,
                None,  # type: ignore[arg-type]
                operator,
                controller,
                operator_b=operator_b,
                profile=args.profile,
            )
            asyncio.run(drive(bench, variants, sizes, reps))
        finally:
            if controller is not None:
                controller.stop()
            for process in (operator, operator_b):
                if process is not None:
                    process.stop()
    results = figures(bench.trials, variants, sizes)
    report(results, variants, sizes)
    harness.write_results(
        "pod_creation",
        {
            "machine": harness.machine(),
            "settings": settings(sizes, reps, variants),
            "jobset": outcome["jobset"],
            "figures": results,
            "trials": bench.trials,
        },
    )


def settings(sizes: list[int], reps: int, variants: list[str]) -> dict[str, Any]:
    return {
        "sizes": sizes,
        "reps": reps,
        "variants": variants,
        "bare_client": f"official kubernetes client, {CONCURRENCY} threads, raw JSON",
        "operator_api_concurrency": CONCURRENCY,
        "jobset_version": jobset.VERSION,
    }


def start_jobset(cluster: Cluster) -> tuple[jobset.JobSetController | None, str]:
    try:
        controller = jobset.JobSetController(cluster)
        controller.start()
    except jobset.JobSetUnavailable as exc:
        say(f"JobSet left out: {exc}")
        return None, f"unavailable: {exc}"
    return controller, f"JobSet {jobset.VERSION} built from Go modules, webhooks on"


async def drive(bench: Bench, variants: list[str], sizes: list[int], reps: int) -> None:
    bench.api = connect(bench.cluster)
    try:
        await run_trials(bench, variants, sizes, reps)
    finally:
        await bench.api.close()


if __name__ == "__main__":
    main()
