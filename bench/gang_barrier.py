"""Benchmark: the gang barrier a TPUSlice checks on every reconcile, by job size.

Before a job-owned slice creates the pods of an attempt, it asks whether any pod of an
older attempt is left anywhere in the job (rule 2 of ``reconcile/slices.py``). Two ways
of answering, side by side in one process over the same pod store:

- ``walk``: copy the job's pods out of the store and look at each one's attempt (what the
  slice reconciler did before the store counted attempts);
- ``counts``: read the job's per-attempt counts the store keeps (``Store(tally=...)``,
  ``Caches.attempts_of_job``).

The store holds one job of ``--sizes`` hosts in slices of 64 (v5litepod-256), every pod of
attempt 2, so the answer is "none left" and the walk has to look at every pod. Figures:
microseconds per check (the best of 5 repetitions of 200 checks each) and counts / walk.
Multiplied by the slice reconciles per pod (the operator's
``tpu_operator_reconcile_duration_seconds_count{kind="TPUSlice"}`` over its pods: about
1.4 while one 12,736-host job starts), that is the CPU per pod the check costs.

    .venv/bin/python bench/gang_barrier.py [--sizes 1024 4096 12736]
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any

from tpu_operator import contract
from tpu_operator.runtime.caches import Caches, identity_of
from tpu_operator.runtime.listwatch import PODS
from tpu_operator.state.views import pod_view

NAMESPACE, JOB, HOSTS_PER_SLICE, ATTEMPT = "bench", "big", 64, 2


def worker_pod(index: int) -> dict[str, Any]:
    slice_name = contract.slice_name(JOB, index // HOSTS_PER_SLICE)
    worker = index % HOSTS_PER_SLICE
    return {
        "metadata": {
            "name": contract.pod_name(slice_name, worker),
            "namespace": NAMESPACE,
            "uid": f"uid-{index}",
            "labels": {
                contract.LABEL_SLICE_NAME: slice_name,
                contract.LABEL_JOB_NAME: JOB,
                contract.LABEL_WORKER_INDEX: str(worker),
                contract.LABEL_RESTART_ATTEMPT: str(ATTEMPT),
            },
        },
        "spec": {"nodeName": f"node-{index}"},
        "status": {"phase": "Running"},
    }


def filled(hosts: int) -> Caches:
    store = PODS.store()
    for index in range(hosts):
        body = worker_pod(index)
        view = pod_view(body)
        assert view is not None
        store.put(identity_of(body), view)
    return Caches(pods=store, slices={}, jobs={}, nodes={})


def best_us(check: Any) -> float:
    return min(timeit.repeat(check, number=200, repeat=5)) / 200 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 12736])
    args = parser.parse_args()
    print("| hosts | walk, us per check | counts, us per check | counts / walk |")
    print("|---|---|---|---|")
    for hosts in args.sizes:
        caches = filled(hosts)

        def walk(caches: Caches = caches) -> bool:
            return bool([p for p in caches.pods_of_job(NAMESPACE, JOB) if p.attempt < ATTEMPT])

        def counts(caches: Caches = caches) -> bool:
            return any(a < ATTEMPT for a in caches.attempts_of_job(NAMESPACE, JOB))

        assert walk() is counts() is False
        slow, fast = best_us(walk), best_us(counts)
        print(f"| {hosts:,} | {slow:.0f} | {fast:.2f} | {fast / slow:.4f} |")


if __name__ == "__main__":
    main()
