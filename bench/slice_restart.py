"""Benchmark: a multislice job loses one pod; its slice recovered alone (a mixed restart)
against recreating every pod, and against JobSet's restart.

On a local control plane with one simulate-mode node pool of 64 VMs per slice
(``v5litepod-256``, tpu-v5-lite-podslice 16x16; pods go Running as soon as they are bound,
no processes), one multislice job of N slices x 64 hosts runs, then the pod of worker 32 of
its middle slice is deleted (``DELETE`` of the pod, default grace). The time until every
process of the next attempt runs and every pod of it is Ready is measured for:

- ``mixed``: ``tpu-operator run --in-place-restarts --control-key-file FILE`` and a TPUJob
  whose worker command is ``tpu-worker ...`` (failurePolicy.restartMode Auto), so its pods
  are supervised. The supervisors (and the kubelet's readiness prober) of the simulated
  pods are played by ``standin_supervisor.StandIn`` in this process (the real protocol on
  every pod IP, the operator's signatures verified); a pod created anew while its job
  restarts in place waits for the operator's start, as the real supervisor does
  (``TPU_OPERATOR_AWAIT_START``). The operator recreates the pods of the lost pod's
  slice and restarts the other slices' processes in place. Done when the job is Running
  as attempt 2 and every pod runs attempt 2 and is seen Ready (the kept pods keep their
  label, the attempt they were created for: their slice's record carries them). The
  trial fails unless the job's status says ``restartKind: Mixed`` and ``recreatedSlices``
  is the one slice, the other slices' pods kept their UIDs, and the slice's pods are new.
  The job's phase (Running as attempt 2) is recorded apart, waited for at most
  ``JOB_RUNNING_WAIT`` seconds after that.
- ``inplace``: the same job, but the training process of that pod exits 1 (the stand-in's
  ``fail``: Ready turns False) instead of its pod being deleted: every slice's processes
  restart in place. Done as ``mixed``; fails unless ``restartKind`` is InPlace and every
  pod kept its UID.
- ``recreate``: the same job with failurePolicy.restartMode Recreate (every pod is
  deleted and created again). Done when every pod of attempt 2 is Running (its process
  starts with its container; a simulated pod is Ready when it starts); the job's phase
  Running as attempt 2 is recorded apart. Fails unless ``restartKind`` is Recreate and
  no pod of attempt 1 is left.
- ``jobset``: the equivalent JobSet (``jobset.py``, built from its Go module): one
  replicated Job of N replicas, each an Indexed Job of 64 pods with exclusive placement
  per node pool, failurePolicy maxRestarts; Job backoffLimit 0, so the lost pod fails its
  Job and JobSet recreates every Job. Done when every pod of restart attempt 1 is Running.

Sizes (``--sizes``): 256 (4 slices), 1,024 (16), 4,096 (64) hosts; a 2-slice job (128
hosts) of each variant runs first as an untimed warm-up. Sizes and repetitions are
interleaved (the order of the variants rotated per repetition); per size the figures are
medians [min-max] and per-repetition ratios against ``recreate``. The cluster has the
node pools of the largest size, with the scale benchmark's settings for thousands of
nodes (``harness.SCALE_ARGS``, ``harness.quiet_grace``). All pod and job times come from
one watch per namespace in this process (``kwatch``); the supervisor steps from the
stand-in's log. The operator's API requests and CPU per restart are read 2 s after it
ended. Results: ``bench/results/slice_restart.json`` at the end, every finished trial in
``slice_restart.partial.json`` as it goes.

    .venv/bin/python bench/slice_restart.py [--reps N] [--sizes 256 1024 4096]
        [--variants mixed inplace recreate jobset] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import inplace_restart as ip
import jobset
import pod_creation
from harness import say, spread, summary
from kwatch import Watch, connect
from standin_supervisor import StandIn

from localcluster.agent.kube import Kube
from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring

SLICE_TYPE = "v5litepod-256"
ACCELERATOR, TOPOLOGY = catalog.short_types()[SLICE_TYPE]
HOSTS_PER_SLICE = catalog.shape(ACCELERATOR, TOPOLOGY).hosts
SIZES = {128: 2, 256: 4, 1024: 16, 4096: 64}
"""Hosts -> slices of v5litepod-256 (128: the warm-up)."""
WARMUP = 128
NAMESPACE = "bench-slice"
JOBSET_NAMESPACE = "bench-slice-js"
ATTEMPT = contract.LABEL_RESTART_ATTEMPT
SLICE_INDEX = contract.LABEL_SLICE_INDEX
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
SETTLE = 2.0
"""Seconds before the failure (start-up writes done) and after the restart (paced writes)."""
VARIANTS = ("mixed", "inplace", "recreate", "jobset")
JOB_RUNNING_WAIT = 10.0
"""Seconds the mixed trial waits, once every process runs, for the job's phase to say
Running as the next attempt (recorded as not seen if later)."""
WARMUP_TIMEOUT = 3600.0
"""The first job includes the operator's start-up (its caches of every TPU node)."""


def timeout_for(hosts: int) -> float:
    """Seconds a phase of ``hosts`` pods may take before the trial counts as failed."""
    return 180.0 + 0.15 * hosts


def pool_name(index: int) -> str:
    return f"v5e-{index:03d}"


def victim_slice(hosts: int) -> int:
    return SIZES[hosts] // 2


class TrialFailed(RuntimeError):
    """The restart was not what the variant measures (the message says how)."""


@dataclass
class Bench:
    api: Kube
    standin: StandIn
    operator: harness.Operator
    cluster: Any
    jobset: jobset.JobSetController | None
    trials: list[dict[str, Any]] = field(default_factory=list)
    profile: Path | None = None
    """Where py-spy writes the stacks of the operator and of this process (the stand-in
    supervisors and the watches) during each timed supervised restart (``--profile``)."""


# Observation -----------------------------------------------------------------------------


class SliceWatch(ip.TrackedWatch):
    """A pod watch that keeps, besides ``TrackedWatch``'s timelines, per label value (the
    value a pod had when first seen) the times pods were first seen, first seen Running,
    first seen deleting and seen gone, in order: the checks while waiting are O(1) where
    ``Watch``'s scan every pod (thousands of them, on the machine the cluster runs on)."""

    def __init__(
        self, api: Kube, path: str, label: str, listener: Callable[[str, dict], None]
    ) -> None:
        super().__init__(api, path, listener)
        self.label = label
        self.state: dict[str, list[Any]] = {}
        """uid -> [label value, slice, running seen, deleting seen, gone]."""
        self.times: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.live = 0

    def _apply(self, kind: str, obj: dict[str, Any], now: float) -> None:
        super()._apply(kind, obj, now)
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        state = self.state.get(meta["uid"])
        if state is None:
            value = labels.get(self.label, "")
            where = labels.get(SLICE_INDEX, labels.get(JOBSET_INDEX, ""))
            state = self.state[meta["uid"]] = [value, where, False, False, False]
            self.times["created", value].append(now)
            self.live += 1
        value = state[0]
        if not state[2] and (obj.get("status") or {}).get("phase") == "Running":
            state[2] = True
            self.times["running", value].append(now)
        if not state[3] and (meta.get("deletionTimestamp") or kind == "DELETED"):
            state[3] = True
            self.times["deleting", value].append(now)
        if kind == "DELETED" and not state[4]:
            state[4] = True
            self.times["gone", value].append(now)
            self.live -= 1

    def at(self, event: str, value: str, count: int) -> float | None:
        """When the ``count``-th pod first seen with ``value`` got to ``event``."""
        times = self.times.get((event, value), [])
        return times[count - 1] if len(times) >= count else None

    def alive_by_slice(self) -> dict[str, set[str]]:
        """UIDs of the pods not deleted, by slice (index label)."""
        out: dict[str, set[str]] = defaultdict(set)
        for uid, state in self.state.items():
            if not state[3]:
                out[state[1]].add(uid)
        return out


def since(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


def status_when(jobs: Watch, name: str, when: float) -> dict[str, Any]:
    """The job's status as last seen at or before ``when``."""
    found: dict[str, Any] = {}
    for at, _, seen_name, status in jobs.history:
        if at > when:
            break
        if seen_name == name:
            found = status
    return found


def committed_at(jobs: Watch, name: str, since_: float, attempt: int) -> float | None:
    """First time after ``since_`` the job's status carried ``attempt``."""
    return next(
        (
            at
            for at, _, seen_name, status in jobs.history
            if at >= since_ and seen_name == name and status.get("attempt") == attempt
        ),
        None,
    )


async def lose_pod(api: Kube, namespace: str, name: str) -> float:
    """Delete one pod (default grace); the monotonic time just before."""
    started = time.monotonic()
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return started


async def drain(bench: Bench, namespace: str, pods: SliceWatch, owners: list[str]) -> None:
    """Delete what a trial left (owners first, then any pods) and wait until it is gone."""
    for path in owners:
        await bench.api.call("DELETE", f"{path}?propagationPolicy=Background", ok=(404,))
    try:
        await bench.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", ok=(404,))
    except TimeoutError:
        say(f"collection DELETE of the pods of {namespace} timed out; waiting for them")
    await pods.wait(lambda: pods.live == 0, 900.0, f"the pods of {namespace} to be gone")
    deadline = time.monotonic() + 300.0
    for path in owners:
        while (await bench.api.call("GET", f"{path}?limit=1")).get("items"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} still has items")
            await asyncio.sleep(0.5)
    await pods.stop()


# The operator's job --------------------------------------------------------------------


def tpujob(name: str, hosts: int, mode: str) -> dict[str, Any]:
    """The TPUJob a user writes for ``hosts`` hosts of v5litepod-256 slices, its worker
    run by ``tpu-worker``."""
    template = copy.deepcopy(harness.WORKER_TEMPLATE)
    template["spec"]["containers"][0]["command"] = ["tpu-worker", "run", "-m", "bench_train"]
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "slice": {"type": SLICE_TYPE},
            "numSlices": SIZES[hosts],
            "template": template,
            "failurePolicy": {"maxRestarts": 1000, "backoffSeconds": 0, "restartMode": mode},
        },
    }


def job_paths() -> list[str]:
    return [pod_creation.jobs_path(NAMESPACE), pod_creation.jobs_path(NAMESPACE, "tpuslices")]


async def start_job(
    bench: Bench, name: str, hosts: int, mode: str, limit: float
) -> tuple[SliceWatch, Watch]:
    pods = SliceWatch(
        bench.api, f"/api/v1/namespaces/{NAMESPACE}/pods", ATTEMPT, bench.standin.on_pod
    )
    await pods.start()
    jobs = await Watch(bench.api, pod_creation.jobs_path(NAMESPACE)).start()
    started = time.monotonic()
    created = await bench.api.call(
        "POST", pod_creation.jobs_path(NAMESPACE), tpujob(name, hosts, mode)
    )
    bench.standin.register(name, created["metadata"]["uid"])
    await pods.wait(lambda: pods.at("running", "1", hosts), limit, f"{name} Running")
    await jobs.wait(lambda: jobs.phase_at(name, "Running", started), limit, f"{name} phase")
    say(f"  {name}: {hosts} pods Running {time.monotonic() - started:.1f} s after the POST")
    return pods, jobs


def victim_pod(name: str, hosts: int) -> str:
    """Worker 32 of the middle slice."""
    return contract.pod_name(contract.slice_name(name, victim_slice(hosts)), HOSTS_PER_SLICE // 2)


def kept_check(
    before: dict[str, set[str]], after: dict[str, set[str]], lost: str, hosts: int
) -> list[str]:
    """What is wrong with the pods after a mixed restart: every slice but ``lost`` keeps
    exactly its pods, ``lost`` has ``HOSTS_PER_SLICE`` pods none of which it had."""
    problems = []
    for index in range(SIZES[hosts]):
        key = str(index)
        if key == lost:
            if before.get(key, set()) & after.get(key, set()):
                problems.append(f"slice {key} (recreated) kept some of its pods")
            if len(after.get(key, ())) != HOSTS_PER_SLICE:
                problems.append(f"slice {key} has {len(after.get(key, ()))} pods")
        elif before.get(key) != after.get(key):
            changed = len(before.get(key, set()) ^ after.get(key, set()))
            problems.append(f"slice {key} (kept) has {changed} pod UIDs changed")
    return problems


async def trial_mixed(bench: Bench, hosts: int, rep: int, limit: float) -> dict[str, Any]:
    return await trial_supervised(bench, hosts, rep, limit, in_place=False)


async def trial_inplace(bench: Bench, hosts: int, rep: int, limit: float) -> dict[str, Any]:
    return await trial_supervised(bench, hosts, rep, limit, in_place=True)


async def trial_supervised(
    bench: Bench, hosts: int, rep: int, limit: float, *, in_place: bool
) -> dict[str, Any]:
    """``mixed`` (the pod deleted) or ``inplace`` (its training process exits 1)."""
    name = f"{'ip' if in_place else 'mx'}{hosts}-{rep}"
    standin = bench.standin
    pods, jobs = await start_job(bench, name, hosts, "Auto", limit)
    await standin.wait(lambda: standin.serving(name) == hosts, limit, f"{name} served")
    await asyncio.sleep(SETTLE)
    lost = "" if in_place else str(victim_slice(hosts))
    before_uids = pods.alive_by_slice()
    harness.freeze_heap()  # before the profiles start: the collection is not the restart's
    before, cpu, mark = (
        ip.operator_counters(bench.operator),
        bench.operator.cpu(),
        len(standin.events),
    )
    profilers = []
    if rep > 0:  # not the warm-up
        for pid, what in ((bench.operator.pid, "operator"), (os.getpid(), "bench")):
            profilers.append(await harness.profile(pid, bench.profile, f"{name}-{what}.txt"))
    try:
        if in_place:
            failed = standin.fail(victim_pod(name, hosts))
        else:
            failed = await lose_pod(bench.api, NAMESPACE, victim_pod(name, hosts))
        await pods.wait(
            lambda: ip.all_ready_at(standin, pods, name, hosts, 2),
            limit,
            f"{name} attempt 2 Ready",
            every=ip.READY_CHECK_EVERY,
        )
    finally:  # a trial that times out leaves no py-spy attached
        for profiler in profilers:
            if profiler is not None:
                await profiler.stop()
    done = ip.all_ready_at(standin, pods, name, hosts, 2)
    assert done is not None
    with contextlib.suppress(TimeoutError):
        await jobs.wait(
            lambda: jobs.phase_at(name, "Running", failed, attempt=2),
            JOB_RUNNING_WAIT,
            f"{name} Running as attempt 2",
        )
    job_running = jobs.phase_at(name, "Running", failed, attempt=2)
    status = status_when(jobs, name, job_running or time.monotonic())
    await asyncio.sleep(SETTLE)
    requests = ip.requests_delta(before, ip.operator_counters(bench.operator))
    cpu = bench.operator.cpu() - cpu
    events = standin.events[mark:]
    problems = kept_check(before_uids, pods.alive_by_slice(), lost, hosts)
    kind = "InPlace" if in_place else "Mixed"
    if status.get("restartKind") != kind:
        problems.append(f"restartKind {status.get('restartKind')!r}: {status.get('message')}")
    recreated = [] if in_place else [int(lost)]
    if (status.get("recreatedSlices") or []) != recreated:
        problems.append(f"recreatedSlices {status.get('recreatedSlices')!r}, not {recreated}")

    def at(kind: str, attempt: int, last: bool = False) -> float | None:
        times = [e.at for e in events if e.kind == kind and e.attempt == attempt]
        return ((max(times) if last else min(times)) - failed) if times else None

    counts: dict[str, int] = {}
    for event in events:
        counts[event.kind] = counts.get(event.kind, 0) + 1
    starts = [p.started[2] for p in standin.of_job(name) if 2 in p.started]
    kept = set().union(*(v for k, v in before_uids.items() if k != lost))
    relabelled = [uid for uid in kept if any(label == "2" for _, label, _ in pods.timeline[uid])]
    restart = {
        "committed": since(committed_at(jobs, name, failed, 2), failed),
        "first_stop": at("stop", 1),
        "last_stop": at("stop", 1, last=True),
        "kept_relabelled": len(relabelled),
        "first_deleted": since(pods.at("deleting", "1", 2), failed),
        "all_deleted": since(pods.at("deleting", "1", HOSTS_PER_SLICE), failed),
        "old_gone": since(pods.at("gone", "1", HOSTS_PER_SLICE), failed),
        "first_new_created": since(pods.at("created", "2", 1), failed),
        "all_new_created": since(pods.at("created", "2", HOSTS_PER_SLICE), failed),
        "all_new_running": since(pods.at("running", "2", HOSTS_PER_SLICE), failed),
        "first_start": at("start", 2),
        "last_start": at("start", 2, last=True),
        "all_started": max(starts) - failed,
        "all_new_ready": done - failed,
        "job_running": since(job_running, failed),
        "restart_kind": status.get("restartKind"),
        "recreated_slices": status.get("recreatedSlices"),
        "kept_pods": sum(len(v) for k, v in before_uids.items() if k != lost),
        "standin": counts,
        "api_requests": requests,
        "cpu": cpu,
    }
    await jobs.stop()
    await drain(bench, NAMESPACE, pods, job_paths())
    if problems:
        raise TrialFailed("; ".join(problems))
    return {"restart": restart}


async def trial_recreate(bench: Bench, hosts: int, rep: int, limit: float) -> dict[str, Any]:
    name = f"rc{hosts}-{rep}"
    pods, jobs = await start_job(bench, name, hosts, "Recreate", limit)
    await asyncio.sleep(SETTLE)
    before_uids = pods.alive_by_slice()
    before, cpu = ip.operator_counters(bench.operator), bench.operator.cpu()
    harness.freeze_heap()
    failed = await lose_pod(bench.api, NAMESPACE, victim_pod(name, hosts))
    await jobs.wait(
        lambda: jobs.phase_at(name, "Running", failed, attempt=2), limit, f"{name} attempt 2"
    )
    await pods.wait(lambda: pods.at("running", "2", hosts), limit, f"{name} attempt 2 Running")
    job_running = jobs.phase_at(name, "Running", failed, attempt=2)
    assert job_running is not None
    status = status_when(jobs, name, job_running)
    await asyncio.sleep(SETTLE)
    requests = ip.requests_delta(before, ip.operator_counters(bench.operator))
    cpu = bench.operator.cpu() - cpu
    problems = []
    if status.get("restartKind") != "Recreate":
        problems.append(f"restartKind {status.get('restartKind')!r}")
    old = set().union(*before_uids.values())
    if old & set().union(*pods.alive_by_slice().values()):
        problems.append("pods of attempt 1 are still there")
    running = pods.at("running", "2", hosts)
    assert running is not None
    restart = {
        "committed": since(committed_at(jobs, name, failed, 2), failed),
        "first_deleting": since(pods.at("deleting", "1", 1), failed),
        "old_gone": since(pods.at("gone", "1", hosts), failed),
        "first_new_created": since(pods.at("created", "2", 1), failed),
        "all_new_created": since(pods.at("created", "2", hosts), failed),
        "all_new_running": running - failed,
        "all_new_ready": running - failed,
        "job_running": job_running - failed,
        "restart_kind": status.get("restartKind"),
        "api_requests": requests,
        "cpu": cpu,
    }
    await jobs.stop()
    await drain(bench, NAMESPACE, pods, job_paths())
    if problems:
        raise TrialFailed("; ".join(problems))
    return {"restart": restart}


# JobSet ----------------------------------------------------------------------------------


def jobset_manifest(name: str, hosts: int) -> dict[str, Any]:
    """The equivalent JobSet: one replicated Job of one Indexed Job per slice, each of 64
    pods with exclusive placement per node pool; the same pod spec as the operator's
    worker 0."""
    wiring = PodWiring(
        job_name=name,
        service=name,
        slice_name=contract.slice_name(name, 0),
        shape=catalog.shape(ACCELERATOR, TOPOLOGY),
        num_slices=SIZES[hosts],
        slice_index=0,
        worker_index=0,
        attempt=1,
    )
    pod = worker_pod(
        namespace=JOBSET_NAMESPACE,
        wiring=wiring,
        template=harness.WORKER_TEMPLATE,
        owner=Owner("v1", "None", "none", "0"),  # dropped: the Job owns its pods
        placement=NodePlacement(node_pool=None),
    )
    return jobset.manifest(
        name,
        JOBSET_NAMESPACE,
        pod,
        hosts=HOSTS_PER_SLICE,
        slices=SIZES[hosts],
        exclusive=True,
    )


def jobset_cpu(bench: Bench) -> float:
    assert bench.jobset is not None
    kcm = int(bench.cluster.status()["processes"]["kube-controller-manager"]["pid"])
    return bench.jobset.cpu() + harness.cpu_seconds(kcm)


async def trial_jobset(bench: Bench, hosts: int, rep: int, limit: float) -> dict[str, Any]:
    name = f"js{hosts}-{rep}"
    label = jobset.ATTEMPT_LABEL
    path = f"{jobset.API}/namespaces/{JOBSET_NAMESPACE}/jobsets"
    pods = SliceWatch(
        bench.api, f"/api/v1/namespaces/{JOBSET_NAMESPACE}/pods", label, lambda k, o: None
    )
    await pods.start()
    started = time.monotonic()
    await bench.api.call("POST", path, jobset_manifest(name, hosts))
    await pods.wait(lambda: pods.at("running", "0", hosts), limit, f"{name} Running")
    say(f"  {name}: {hosts} pods Running {time.monotonic() - started:.1f} s after the POST")
    await asyncio.sleep(SETTLE)
    lost, index = str(victim_slice(hosts)), str(HOSTS_PER_SLICE // 2)
    victim = next(
        s.name
        for s in pods.objects.values()
        if s.labels.get(JOBSET_INDEX) == lost and s.labels.get(COMPLETION_INDEX) == index
    )
    cpu = jobset_cpu(bench)
    harness.freeze_heap()
    failed = await lose_pod(bench.api, JOBSET_NAMESPACE, victim)
    await pods.wait(lambda: pods.at("running", "1", hosts), limit, f"{name} attempt 2 Running")
    running = pods.at("running", "1", hosts)
    assert running is not None
    await asyncio.sleep(SETTLE)
    restart = {
        "first_deleting": since(pods.at("deleting", "0", 2), failed),
        "old_gone": since(pods.at("gone", "0", hosts), failed),
        "first_new_created": since(pods.at("created", "1", 1), failed),
        "all_new_created": since(pods.at("created", "1", hosts), failed),
        "all_new_running": running - failed,
        "all_new_ready": running - failed,
        "cpu": jobset_cpu(bench) - cpu,
    }
    batch = f"/apis/batch/v1/namespaces/{JOBSET_NAMESPACE}/jobs"
    await drain(bench, JOBSET_NAMESPACE, pods, [path, batch])
    return {"restart": restart}


# Runs ------------------------------------------------------------------------------------

Trial = Callable[[Bench, int, int, float], Awaitable[dict[str, Any]]]
TRIALS: dict[str, Trial] = {
    "mixed": trial_mixed,
    "inplace": trial_inplace,
    "recreate": trial_recreate,
    "jobset": trial_jobset,
}


async def run_trials(bench: Bench, variants: list[str], sizes: list[int], reps: int) -> None:
    say(f"warm-up: one untimed run of each variant at {WARMUP} hosts ({SIZES[WARMUP]} slices)")
    for variant in variants:
        await TRIALS[variant](bench, WARMUP, 0, WARMUP_TIMEOUT)
    for rep in range(1, reps + 1):
        for hosts in sizes:
            shift = (rep + sizes.index(hosts)) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                say(f"rep {rep}: {hosts:,} hosts ({SIZES[hosts]} slices), {variant}")
                entry: dict[str, Any] = {"variant": variant, "hosts": hosts, "rep": rep}
                try:
                    result = await TRIALS[variant](bench, hosts, rep, timeout_for(hosts))
                except (TrialFailed, TimeoutError) as error:
                    say(f"TRIAL FAILED: rep {rep} {hosts} hosts {variant}: {error}")
                    bench.trials.append({**entry, "error": str(error)})
                    harness.write_results("slice_restart.partial", {"trials": bench.trials})
                    if isinstance(error, TimeoutError):
                        raise
                    continue
                bench.trials.append({**entry, **result})
                harness.write_results("slice_restart.partial", {"trials": bench.trials})
                restart = result["restart"]
                api = restart.get("api_requests", {}).get("total")
                say(
                    f"rep {rep} {hosts:>5} hosts {variant:<8} failure -> every process of "
                    f"attempt 2 running, every pod Ready {restart['all_new_ready']:7.2f} s"
                    + (f"  operator API requests {api:.0f}" if api is not None else "")
                )


# Figures ---------------------------------------------------------------------------------


def pick(trials: list[dict[str, Any]], variant: str, hosts: int) -> dict[int, dict[str, Any]]:
    return {
        t["rep"]: t
        for t in trials
        if t["variant"] == variant and t["hosts"] == hosts and "error" not in t
    }


STEPS = {
    "mixed": (
        "committed", "first_stop", "last_stop", "first_deleted", "all_deleted", "old_gone",
        "all_new_created",
        "all_new_running", "first_start", "last_start", "all_started", "all_new_ready",
        "job_running",
    ),
    "inplace": (
        "committed", "first_stop", "last_stop", "first_start", "last_start", "all_started",
        "all_new_ready", "job_running",
    ),
    "recreate": (
        "committed", "first_deleting", "old_gone", "first_new_created", "all_new_created",
        "all_new_running", "job_running",
    ),
    "jobset": ("first_deleting", "old_gone", "first_new_created", "all_new_created",
               "all_new_running"),
}  # fmt: skip


def figures(trials: list[dict[str, Any]], variants: list[str], sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for hosts in sizes:
        base = pick(trials, "recreate", hosts)
        for variant in variants:
            mine = pick(trials, variant, hosts)
            reps = sorted(set(mine) & set(base))
            entry: dict[str, Any] = {
                "restart_s": ip.restart_stat(mine, "all_new_ready"),
                "vs_recreate": summary(
                    [
                        mine[r]["restart"]["all_new_ready"] / base[r]["restart"]["all_new_ready"]
                        for r in reps
                    ]
                ),
                "cpu_s": ip.restart_stat(mine, "cpu"),
                "steps": {step: ip.restart_stat(mine, step) for step in STEPS[variant]},
                "failed": [
                    t["error"]
                    for t in trials
                    if t["variant"] == variant and t["hosts"] == hosts and "error" in t
                ],
            }
            if variant != "jobset":
                for verb in ("total", "writes"):
                    entry[f"api_{verb}"] = ip.restart_stat(mine, "api_requests", verb)
            out[f"{variant}/{hosts}"] = entry
    if "mixed" in variants and sizes:
        first = out[f"mixed/{sizes[0]}"]["restart_s"]["median"]
        for hosts in sizes:
            entry = out[f"mixed/{hosts}"]
            median = entry["restart_s"]["median"]
            entry["growth_vs_smallest"] = None if not first or median is None else median / first
    return out


def report(results: dict[str, Any], variants: list[str], sizes: list[int]) -> None:
    rows = []
    for hosts in sizes:
        for variant in variants:
            f = results[f"{variant}/{hosts}"]
            rows.append([
                f"{hosts:,} ({SIZES[hosts]})", variant, str(f["restart_s"]["n"]),
                spread(f["restart_s"]), spread(f["vs_recreate"], 3),
                spread(f["steps"]["job_running"]) if "job_running" in f["steps"] else "-",
                spread(f["api_total"], 0) if "api_total" in f else "-",
                spread(f["api_writes"], 0) if "api_writes" in f else "-",
                spread(f["cpu_s"]), str(len(f["failed"])),
            ])  # fmt: skip
    print()
    print("Worker 32 of the middle slice lost (its pod deleted; inplace: its process exits 1)"
          " -> every process of attempt 2 running, every pod Ready (median [min-max]; ratios"
          " per repetition)")  # fmt: skip
    print(harness.table(
        ["hosts (slices)", "variant", "reps", "restart s", "vs recreate", "job Running s",
         "operator API requests", "of them writes", "CPU s", "failed"], rows))  # fmt: skip
    for variant in variants:
        print()
        print(f"{variant}: steps, seconds after the pod was deleted (median)")
        step_rows = []
        for hosts in sizes:
            f = results[f"{variant}/{hosts}"]
            step_rows.append(
                [f"{hosts:,}"] + [harness.fmt(f["steps"][s]["median"]) for s in STEPS[variant]]
            )
        print(harness.table(["hosts", *STEPS[variant]], step_rows))
    if "mixed" in variants:
        growth = ", ".join(
            f"{hosts:,}: {harness.fmt(results[f'mixed/{hosts}'].get('growth_vs_smallest'))}"
            for hosts in sizes
        )
        print(f"\nmixed restart time against the smallest size: {growth}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", choices=[h for h in SIZES if h != WARMUP])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS)
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the operator and this process (the stand-ins) with py-spy during each "
        "timed mixed and in-place restart, from the failure until every pod is Ready, into "
        "DIR/<trial>-operator.txt and DIR/<trial>-bench.txt",
    )
    args = parser.parse_args()
    sizes = sorted(args.sizes or [1024, 4096])
    variants = list(args.variants or VARIANTS)
    slices = SIZES[max(sizes)]
    nodes = slices * HOSTS_PER_SLICE
    grace = harness.quiet_grace(nodes)
    pools = [
        harness.tpu_pool(pool_name(i), TOPOLOGY, HOSTS_PER_SLICE, ACCELERATOR)
        for i in range(slices)
    ]
    say(f"{slices} node pools of {HOSTS_PER_SLICE} VMs ({nodes:,} nodes), grace {grace:,.0f} s")
    namespaces = [NAMESPACE] + ([JOBSET_NAMESPACE] if "jobset" in variants else [])
    outcome: dict[str, Any] = {"jobset": None}
    with harness.bench_cluster(
        "slice",
        pools,
        grace=grace,
        namespaces=namespaces,
        timeout=600 + 0.2 * nodes,
        component_args=harness.SCALE_ARGS,
    ) as cluster:
        master, operator = ip.supervising_operator(cluster, "slice", NAMESPACE)
        controller = None
        try:
            if "jobset" in variants:
                controller, outcome["jobset"] = pod_creation.start_jobset(cluster)
                if controller is None:
                    variants.remove("jobset")
            bench = Bench(None, None, operator, cluster, controller, profile=args.profile)  # type: ignore[arg-type]
            hosts_loop = harness.run_hosts(drive(bench, master, variants, sizes, args.reps))
        finally:
            if controller is not None:
                controller.stop()
            operator.stop()
    results = figures(bench.trials, variants, sizes)
    report(results, variants, sizes)
    harness.write_results(
        "slice_restart",
        {
            "machine": harness.machine(),
            "settings": {
                "sizes": sizes,
                "slices": {h: SIZES[h] for h in sizes},
                "slice_type": SLICE_TYPE,
                "reps": args.reps,
                "variants": variants,
                "nodes": nodes,
                "node_monitor_grace_period": grace,
                "fault": "DELETE of worker 32's pod of the middle slice (default grace)",
                "readiness": "stand-in prober reacts at once (a kubelet: within 1 s)",
                "stand_in_loop": hosts_loop,
                "jobset_version": jobset.VERSION,
            },
            "jobset": outcome["jobset"],
            "figures": results,
            "trials": bench.trials,
        },
    )


async def drive(
    bench: Bench, master: bytes, variants: list[str], sizes: list[int], reps: int
) -> None:
    bench.api = connect(bench.cluster)
    bench.standin = StandIn(connect(bench.cluster), master)
    try:
        await run_trials(bench, variants, sizes, reps)
    finally:
        await bench.standin.close()
        await bench.standin.api.close()
        await bench.api.close()


if __name__ == "__main__":
    main()
