"""Benchmark: one job's choice of a node pool on a shared cluster, by the number of jobs.

A job's allocation (``placement/pools.allocate``) walks the free-looking pools of its
shape in a fixed order and takes the first no one holds, so the n-th job of a shape passes
over the pools of the n-1 jobs before it: the walk grows with the number of jobs. What
each pool passed over costs is the question here. Two ways, side by side in one process
over the same caches:

- ``named``: every pool passed over is asked for its holder in words (``HeldPools.get``:
  its pods counted by holder, the holder named), as every allocation did until the
  holders were named only for a request that waits;
- ``asked``: ``HeldPools`` as allocations use it now: ``pool in held`` for the pools
  passed over (the first pod not of the asking job answers), the words only when the
  request waits.

The caches hold ``--jobs`` running single-slice TPUJobs of one shape (v5p-16 by default:
2 pods each), each on its own pool, filed as the operator's pod watch files them, and a
few free pools; one more job allocates. Figures: microseconds per allocation (the best of
5 repetitions), asked / named, and the CPU a burst of that many jobs would spend (the
n-th job passes over n-1 pools: per allocation x jobs / 2).

    .venv/bin/python bench/allocation.py [--jobs 100 1000 5000] [--hosts 2]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpu_operator import catalog, contract
from tpu_operator.placement.pools import PoolView, Request, allocate, pools_by_shape
from tpu_operator.reconcile.context import Context, Reservations
from tpu_operator.reconcile.expectations import PodsInFlight
from tpu_operator.reconcile.pools import HeldPools, job_holder
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.listwatch import Store, pod_keys
from tpu_operator.state.views import PodView

NAMESPACE = "bench"
FREE = 3
"""Free pools beyond the held ones."""


def filled(jobs: int, hosts: int) -> Caches:
    pods = Store(pod_keys)
    for i in range(jobs):
        name = f"j{i}"
        slice_name = contract.slice_name(name, 0)
        for worker in range(hosts):
            pod = PodView(
                name=contract.pod_name(slice_name, worker),
                namespace=NAMESPACE,
                uid=f"pod-{i}-{worker}",
                job_name=name,
                slice_name=slice_name,
                slice_index=0,
                worker_index=worker,
                attempt=0,
                phase="Running",
                ready=True,
                deletion_deadline=None,
                node=f"pool-{i:05d}-n{worker}",
                pool=f"pool-{i:05d}",
                pod_ip=None,
                exit_code=None,
                exit_reason=None,
                disruption=None,
                unschedulable=None,
                created=None,
                started=None,
                finished=None,
            )
            pods.put((NAMESPACE, pod.name), pod)
    return Caches(pods=pods, slices={}, jobs={}, nodes={})


class Named(HeldPools):
    """Every pool passed over named in words, the way allocations asked before."""

    def __contains__(self, pool: object) -> bool:
        return isinstance(pool, str) and self.get(pool) is not None


def measure(jobs: int, hosts: int) -> dict[str, float]:
    shape = next(
        s
        for s in (catalog.shape("tpu-v5p-slice", t) for t in ("2x2x1", "2x2x2", "2x2x4", "2x4x4"))
        if s.hosts == hosts
    )
    caches = filled(jobs, hosts)
    ctx = cast(
        Context,
        SimpleNamespace(caches=caches, reservations=Reservations(), pods_in_flight=PodsInFlight()),
    )
    pools = {
        f"pool-{i:05d}": PoolView(
            f"pool-{i:05d}",
            shape.accelerator,
            shape.topology,
            nodes=hosts,
            ready=hosts,
            chips_per_vm=shape.chips_per_host,
        )
        for i in range(jobs + FREE)
    }
    requests = [Request(shape)]
    exclude = job_holder(NAMESPACE, "new")
    free = f"pool-{jobs:05d}"
    index = pools_by_shape(pools)  # kept per node change, as the operator keeps it
    for way in (Named, HeldPools):
        chosen = allocate(requests, pools, way(ctx, exclude, pools), index).pools
        assert chosen == [free], (way.__name__, chosen)
    rounds = max(1, 20_000 // jobs)

    def run(way: type[HeldPools]) -> Any:
        return lambda: [
            allocate(requests, pools, way(ctx, exclude, pools), index) for _ in range(rounds)
        ]

    return {
        name: min(timeit.repeat(run(way), number=1, repeat=5)) / rounds * 1e6
        for name, way in (("named", Named), ("asked", HeldPools))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--hosts", type=int, default=2, choices=(1, 2, 4, 8))
    args = parser.parse_args()
    print(
        "| jobs | named (us per allocation) | asked | asked / named "
        "| a burst of every job: named / asked (s) |"
    )
    print("|---|---|---|---|---|")
    for jobs in args.jobs:
        figures = measure(jobs, args.hosts)
        named, asked = figures["named"], figures["asked"]
        print(
            f"| {jobs:,} | {named:.1f} | {asked:.1f} | {asked / named:.3f} "
            f"| {named * jobs / 2e6:.2f} / {asked * jobs / 2e6:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
