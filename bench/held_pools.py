"""Benchmark: who holds a node pool, asked on every allocation, by the number of jobs.

Each TPUJob or standalone TPUSlice that chooses node pools asks, pool by pool, who holds
each candidate (``reconcile/pools.HeldPools``). Rule 2 of that answer is the holders' own
records: active jobs' ``status.nodePools`` and active standalone slices'
``status.nodePool``. Two ways of reading them, side by side in one process over the same
caches:

- ``scan``: read every cached job and slice once per allocation and build the map of
  records, then look the pools up in it (what ``HeldPools`` did before the job and slice
  indexes filed records by pool);
- ``index``: ``HeldPools`` as it is, which reads the records of the pools it is asked
  about from the indexes (``Caches.pool_records``).

The caches hold ``--jobs`` running TPUJobs, each with one slice and one recorded pool, as
the operator's own kopf index functions file them. An allocation asks about 4 pools (a
free one is found after the held ones). Figures: microseconds per allocation (the best of
5 repetitions of 200 allocations), index / scan, and the CPU a burst in which every job
allocates once would spend on it (per allocation x jobs).

    .venv/bin/python bench/held_pools.py [--jobs 100 1000 5000]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.fakeapi import run_sync
from tpu_operator import contract, controllers
from tpu_operator.api.status import TERMINAL_PHASES, Phase
from tpu_operator.reconcile.context import Context, Reservations
from tpu_operator.reconcile.pools import HeldPools, job_holder, slice_holder
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.listwatch import Store
from tpu_operator.runtime.ownership import slice_job_name

NAMESPACE = "bench"
ASKED = 4


def filled(jobs: int) -> Caches:
    job_index: defaultdict[Any, list[Any]] = defaultdict(list)
    slice_index: defaultdict[Any, list[Any]] = defaultdict(list)
    for i in range(jobs):
        name = f"j{i}"
        job = {
            "metadata": {"namespace": NAMESPACE, "name": name, "uid": f"job-{i}"},
            "spec": {},
            "status": {"phase": "Running", "nodePools": [f"pool-{i}"]},
        }
        owner = {"kind": contract.JOB_KIND, "name": name, "controller": True}
        slice_name = contract.slice_name(name, 0)
        slice_ = {
            "metadata": {
                "namespace": NAMESPACE,
                "name": slice_name,
                "uid": f"slice-{i}",
                "ownerReferences": [owner],
            },
            "spec": {},
            "status": {"phase": "Running"},
        }
        for key, value in run_sync(
            controllers.tpu_jobs(body=job, namespace=NAMESPACE, name=name)
        ).items():
            job_index[key].append(value)
        keys = run_sync(controllers.tpu_slices(body=slice_, namespace=NAMESPACE, name=slice_name))
        for key, value in keys.items():
            slice_index[key].append(value)
    return Caches(pods=Store(), slices=slice_index, jobs=job_index, nodes={})


def scanned_records(caches: Caches, exclude: str) -> dict[str, str]:
    """Rule 2 by reading every job and slice (the way before the indexes by pool)."""
    records: dict[str, str] = {}
    for job in caches.jobs():
        status, meta = job.get("status") or {}, job["metadata"]
        holder = job_holder(meta["namespace"], meta["name"])
        phase = status.get("phase")
        if holder == exclude or phase in TERMINAL_PHASES or phase == Phase.SUSPENDED:
            continue
        for pool in status.get("nodePools") or []:
            records.setdefault(pool, holder)
    for body in caches.all_slices():
        meta, status = body["metadata"], body.get("status") or {}
        holder = slice_holder(meta["namespace"], meta["name"])
        if holder == exclude or slice_job_name(body) is not None:
            continue
        if status.get("nodePool") and status.get("phase") not in TERMINAL_PHASES:
            records.setdefault(status["nodePool"], holder)
    return records


def measure(jobs: int) -> dict[str, float]:
    caches = filled(jobs)
    ctx = cast(Context, SimpleNamespace(caches=caches, reservations=Reservations()))
    rounds = 200
    asked = [[f"pool-{(a + k) % (jobs + 1)}" for k in range(ASKED)] for a in range(rounds)]
    exclude = job_holder(NAMESPACE, "new")

    def scan() -> None:
        for pools in asked:
            records = scanned_records(caches, exclude)
            for pool in pools:
                records.get(pool)

    def index() -> None:
        for pools in asked:
            held = HeldPools(ctx, exclude, {})
            for pool in pools:
                held.get(pool)

    # Both ways name the same holders.
    for pools in asked[:20]:
        records, held = scanned_records(caches, exclude), HeldPools(ctx, exclude, {})
        assert [records.get(p) for p in pools] == [held.get(p) for p in pools], pools
    return {
        name: min(timeit.repeat(way, number=1, repeat=5)) / rounds * 1e6
        for name, way in (("scan", scan), ("index", index))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 5000])
    args = parser.parse_args()
    print(
        "| jobs | scan (us per allocation) | index | index / scan "
        "| a burst of every job: scan / index (s) |"
    )
    print("|---|---|---|---|---|")
    for jobs in args.jobs:
        figures = measure(jobs)
        scan, index = figures["scan"], figures["index"]
        print(
            f"| {jobs:,} | {scan:.1f} | {index:.2f} | {index / scan:.4f} "
            f"| {scan * jobs / 1e6:.2f} / {index * jobs / 1e6:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
