"""Benchmark: the goodput of a real-JAX multislice job under a seeded schedule of node
losses, with slice-level recovery against recreating the whole job, in the same run.

On a local control plane with one run-mode v4 2x2x2 node pool (2 VMs) per slice and one
more held as a spare (labelled, named in the job's ``spec.placement.spares``), one TPUJob
of N slices (``v4-16``, 2 hosts each) runs ``tpu-worker demo`` under the supervisor: real
multi-process JAX on CPU, ``jax.distributed`` across every slice, a checkpoint every
``--checkpoint-every`` steps, each step slowed to ``--step-sleep`` seconds so that the
six processes of three slices share two cores. The operator runs with
``--in-place-restarts`` and publishes progress every 2 s.

Once the job saved its first checkpoint (the origin of the schedule and of the window:
training has begun, whatever its start-up took), ``--losses`` node losses follow a schedule
drawn from ``--seed`` (the same for every variant of a repetition): loss k at about
``(k + 1/2) * window / losses`` seconds (jittered by up to a tenth of the spacing), on one
host of a slice drawn at random. A loss makes the host's node NotReady (the node agent's
kubelet reports Ready=False; its processes keep running, as on a real VM whose kubelet or
network failed) and heals it ``--heal`` seconds later; the operator ends the attempt as
soon as it sees the node not ready (reason NodeLost).

- ``slice``: ``failurePolicy.restartMode: Auto``: the lost node's slice is recreated (on
  the spare, its pool being unhealthy), the other slices' processes restart in place in
  the pods they have (``restartKind: Mixed``).
- ``recreate``: ``restartMode: Recreate``: every pod of the job is deleted and created
  again (the lost slice also on the spare).

Both resume from the last checkpoint. At ``--window`` seconds after that first checkpoint
the job's ``status.goodput`` (the operator's account: productive step time over wall time
since the job was created, badput by category) is read, with the highest
``status.progress.step`` seen (the status is polled every half second), and the job is
deleted. The trial fails unless every restart was of the variant's kind and there was one
restart per node loss (so the two variants met the same faults). Figures per variant:
goodput fraction, steps reached, restarts, badput by category (medians over
repetitions), and per repetition the ratio of the slice variant's goodput and steps to
recreation's. One job runs first to its first checkpoint, unmeasured (the first JAX
processes of a run read their files cold). With ``--compile-cache`` the workers use JAX's
persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``, a fresh directory per job): a
restarted process may load the programs the attempt before it compiled (here on CPU only
process 0 finds them, JAX writing entries from process 0 alone; it then waits in its first
step for the others, booked as ``firstStep``). Results:
``bench/results/goodput.json`` (``goodput-cache.json`` with ``--compile-cache``).

    .venv/bin/python bench/goodput.py [--reps 2] [--slices 3] [--window 300] [--losses 3]
        [--seed 1] [--variants slice recreate] [--compile-cache]
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import say, spread, summary

from localcluster.api import ApiError, SyncApi
from localcluster.cluster import Cluster
from localcluster.pools import Pool
from localcluster.testing import wait_until
from tpu_operator import contract
from tpu_worker.demo import checkpoint

SPARE_LABEL = "bench.tpu-operator.dev/pool-role"
NAMESPACE = "goodput"
CHECKPOINTS = Path("/var/tmp/tpu-operator-bench/goodput")
COMPILE_CACHES = Path("/var/tmp/tpu-operator-bench/goodput-compile-cache")
KINDS = {"slice": "Mixed", "recreate": "Recreate"}
"""The restart kind each variant's restarts must have (``status.restartKind``)."""
VMS = 2


@dataclass(frozen=True)
class Loss:
    """One scheduled node loss: ``at`` seconds after the job first ran, the node of the
    pod of worker ``worker`` of slice ``slice``."""

    at: float
    slice: int
    worker: int


def schedule(seed: int, losses: int, window: float, slices: int) -> list[Loss]:
    """The node losses of one repetition (the same for every variant of it)."""
    rng = random.Random(seed)
    spacing = window / losses
    return [
        Loss(
            at=round((k + 0.5) * spacing + rng.uniform(-0.1, 0.1) * spacing, 1),
            slice=rng.randrange(slices),
            worker=rng.randrange(VMS),
        )
        for k in range(losses)
    ]


def pools(slices: int) -> list[Pool]:
    """A run-mode v4 2x2x2 pool per slice and one spare (named to sort first: a placement
    that did not keep it in reserve would take it)."""
    main = [
        Pool(
            name=f"gp-{chr(ord('a') + i)}",
            vms=VMS,
            accelerator="tpu-v4-podslice",
            topology="2x2x2",
            chips_per_vm=4,
        )
        for i in range(slices)
    ]
    spare = Pool(
        name="gp-0-spare",
        vms=VMS,
        accelerator="tpu-v4-podslice",
        topology="2x2x2",
        chips_per_vm=4,
        labels={SPARE_LABEL: "spare"},
    )
    return [spare, *main]


def tpujob(name: str, slices: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    directory = CHECKPOINTS / name
    shutil.rmtree(directory, ignore_errors=True)
    env = []
    if args.compile_cache:
        # JAX's persistent compilation cache (its own setting, read from the env): a
        # restarted process loads what the attempt before it compiled.
        cache = COMPILE_CACHES / name
        shutil.rmtree(cache, ignore_errors=True)
        env.append({"name": "JAX_COMPILATION_CACHE_DIR", "value": str(cache)})
    worker = {
        "name": "worker",
        "image": "unused.local/worker",
        "command": [
            "tpu-worker",
            "demo",
            "--steps=1000000",
            "--log-every=50",
            "--batch-size=12",
            "--layers=1",
            "--d-model=64",
            "--heads=2",
            "--d-ff=128",
            "--seq-len=32",
            f"--checkpoint-dir={directory}",
            f"--checkpoint-every={args.checkpoint_every}",
            f"--step-sleep={args.step_sleep}",
        ],
        "env": env,
    }
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "slice": {"type": "v4-16"},
            "numSlices": slices,
            "template": {"spec": {"terminationGracePeriodSeconds": 10, "containers": [worker]}},
            "monitoring": {"sampleInterval": "2s"},
            "placement": {"spares": {"selector": {"matchLabels": {SPARE_LABEL: "spare"}}}},
            "failurePolicy": {
                "backoffSeconds": 0,
                "maxRestarts": 100,
                "restartMode": mode,
            },
        },
    }


class Jobs:
    """TPUJob and pod reads and writes of the benchmark's namespace."""

    def __init__(self, api: SyncApi) -> None:
        self.api = api
        self.base = f"/apis/{contract.API_VERSION}/namespaces/{NAMESPACE}/{contract.JOB_PLURAL}"

    def create(self, body: dict[str, Any]) -> None:
        self.api.call("POST", self.base, body)

    def status(self, name: str) -> dict[str, Any]:
        return self.api.get(f"{self.base}/{name}").get("status") or {}

    def delete(self, name: str) -> None:
        try:
            self.api.call("DELETE", f"{self.base}/{name}")
        except ApiError as error:
            if "404" not in str(error):
                raise

    def pods(self) -> list[dict[str, Any]]:
        return self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]

    def node_of(self, pod: str) -> str | None:
        for item in self.pods():
            if item["metadata"]["name"] == pod and not item["metadata"].get("deletionTimestamp"):
                return item["spec"].get("nodeName")
        return None


def gone(jobs: Jobs, name: str) -> None:
    """Wait until no pod of the job ``name`` is left."""
    wait_until(
        lambda: not any(p["metadata"]["name"].startswith(f"{name}-") for p in jobs.pods()),
        timeout=180,
        interval=0.5,
        message=f"the pods of {name} to be gone",
    )


def reported_step(status: dict[str, Any]) -> int:
    """The step a job's status reports (0: none yet)."""
    return int((status.get("progress") or {}).get("step") or 0)


def trial(
    cluster: Cluster,
    jobs: Jobs,
    variant: str,
    rep: int,
    losses: list[Loss] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    name = f"gp-{variant}-{rep}" if rep >= 0 else "gp-warmup"
    mode = "Auto" if variant == "slice" else "Recreate"
    jobs.create(tpujob(name, args.slices, mode, args))
    created = time.monotonic()
    say(f"{name}: created; waiting for it to run")
    wait_until(
        lambda: checkpoint.saved_steps(CHECKPOINTS / name),
        timeout=300,
        interval=0.5,
        message=f"{name}'s first checkpoint",
    )
    first = time.monotonic()
    say(f"{name}: first checkpoint {first - created:.1f} s after its creation")
    if losses is None:  # the warm-up
        jobs.delete(name)
        gone(jobs, name)
        return {}
    kinds: dict[int, tuple[str, list[int]]] = {}
    pending = sorted(losses, key=lambda loss: loss.at)
    down: list[tuple[float, str]] = []
    applied: list[dict[str, Any]] = []
    end = first + args.window
    step = 0
    """The highest step the job's status reported (a new attempt's starts again from its
    checkpoint's)."""
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            if pending and now - first >= pending[0].at:
                loss = pending.pop(0)
                pod = contract.pod_name(contract.slice_name(name, loss.slice), loss.worker)
                node = jobs.node_of(pod)
                if node is None:
                    say(f"{name}: loss at {loss.at:.0f} s skipped: pod {pod} has no node now")
                else:
                    cluster.agent.make_node_not_ready(node, "bench: seeded node loss")
                    down.append((now + args.heal, node))
                    applied.append({"at": round(now - first, 1), "slice": loss.slice, "node": node})
                    say(
                        f"{name}: node {node} of slice {loss.slice} NotReady at {now - first:.0f} s"
                    )
            for due, node in [d for d in down if d[0] <= now]:
                cluster.agent.heal_node(node)
                down.remove((due, node))
            status = jobs.status(name)
            step = max(step, reported_step(status))
            attempt = int(status.get("attempt") or 0)
            if attempt > 1 and attempt not in kinds and status.get("restartKind"):
                kinds[attempt] = (status["restartKind"], list(status.get("recreatedSlices") or []))
                say(f"{name}: attempt {attempt}: {kinds[attempt][0]} {kinds[attempt][1]}")
            time.sleep(0.5)
        status = jobs.status(name)
    finally:
        for _, node in down:
            cluster.agent.heal_node(node)
    jobs.delete(name)
    gone(jobs, name)
    goodput = status.get("goodput") or {}
    wrong = {a: k for a, (k, _) in kinds.items() if k != KINDS[variant]}
    if wrong:
        raise AssertionError(f"{name}: restarts of another kind than {KINDS[variant]}: {wrong}")
    if int(status.get("restarts") or 0) != len(applied):
        # A restart no loss caused (or a loss no restart followed): not the same faults.
        raise AssertionError(
            f"{name}: {status.get('restarts')} restarts for {len(applied)} node losses"
        )
    result = {
        "variant": variant,
        "rep": rep,
        "losses": applied,
        "to_first_checkpoint": round(first - created, 2),
        "restarts": int(status.get("restarts") or 0),
        "attempt": int(status.get("attempt") or 0),
        "kinds": {str(a): {"kind": k, "recreated": r} for a, (k, r) in kinds.items()},
        "step": max(step, reported_step(status)),
        "fraction": goodput.get("fraction"),
        "wall": goodput.get("wallSeconds"),
        "productive": goodput.get("productiveSeconds"),
        "badput": goodput.get("badputSeconds") or {},
    }
    say(
        f"{name}: goodput {result['fraction']}, step {result['step']}, "
        f"{result['restarts']} restarts, badput {result['badput']}"
    )
    return result


def report(trials: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    by = {v: [t for t in trials if t["variant"] == v] for v in variants}
    figures: dict[str, Any] = {}
    rows = []
    for variant, done in by.items():
        figures[variant] = {
            key: summary([t[key] for t in done if t[key] is not None])
            for key in ("fraction", "step", "restarts", "productive", "wall")
        }
        categories = sorted({c for t in done for c in t["badput"]})
        figures[variant]["badput"] = {
            c: summary([t["badput"].get(c, 0.0) for t in done]) for c in categories
        }
        rows.append(
            [
                variant,
                spread(figures[variant]["fraction"], 3),
                spread(figures[variant]["step"], 0),
                spread(figures[variant]["restarts"], 0),
                ", ".join(
                    f"{c} {figures[variant]['badput'][c]['median']:.0f}"
                    for c in categories
                    if figures[variant]["badput"][c]["median"]
                ),
            ]
        )
    print(harness.table(["variant", "goodput", "steps", "restarts", "badput (s, median)"], rows))
    if set(variants) >= {"slice", "recreate"}:
        recreated = {t["rep"]: t for t in by["recreate"]}
        pairs = [(s, recreated[s["rep"]]) for s in by["slice"] if s["rep"] in recreated]
        figures["ratio"] = {
            "fraction": summary([s["fraction"] / r["fraction"] for s, r in pairs if r["fraction"]]),
            "step": summary([s["step"] / r["step"] for s, r in pairs if r["step"]]),
        }
        print(
            f"slice / recreate, same repetition: goodput {spread(figures['ratio']['fraction'])}, "
            f"steps {spread(figures['ratio']['step'])}"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--slices", type=int, default=3)
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--losses", type=int, default=3)
    parser.add_argument("--heal", type=float, default=30.0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--compile-cache",
        action="store_true",
        help="the workers use JAX's persistent compilation cache (a directory per job)",
    )
    parser.add_argument("--variants", nargs="+", default=["slice", "recreate"], choices=KINDS)
    args = parser.parse_args()
    trials: list[dict[str, Any]] = []
    with harness.bench_cluster("goodput", pools(args.slices), namespaces=[NAMESPACE]) as cluster:
        key = cluster.directory / "control.key"
        key.write_bytes(b"bench-goodput-control-master-key")
        operator = harness.Operator(
            cluster,
            "goodput",
            ["--progress-publish-seconds=2", "--in-place-restarts", f"--control-key-file={key}"],
        )
        operator.start()
        jobs = Jobs(cluster.api())
        try:
            say("warm-up: one job until its first checkpoint (not measured)")
            trial(cluster, jobs, "slice", -1, None, args)
            for rep in range(args.reps):
                losses = schedule(args.seed + rep, args.losses, args.window, args.slices)
                say(f"repetition {rep + 1}: losses {[(x.at, x.slice) for x in losses]}")
                order = args.variants if rep % 2 == 0 else list(reversed(args.variants))
                for variant in order:
                    trials.append(trial(cluster, jobs, variant, rep, losses, args))
        finally:
            operator.stop()
    figures = report(trials, args.variants)
    harness.write_results(
        "goodput-cache" if args.compile_cache else "goodput",
        {"machine": harness.machine(), "args": vars(args), "trials": trials, "figures": figures},
    )


if __name__ == "__main__":
    main()
