"""Benchmark: the cost of remembering each requested pod deletion, per pod, by job size.

A gang restart deletes every pod of the job's old attempt, and the operator remembers
each deletion it sent until the pod is seen going (``reconcile/expectations.DeletedPods``,
over ``runtime/stamps.Stamps``), so that no reconcile sends it again. A 12,736-pod job's
deletions all go out within seconds. This times ``DeletedPods.requested`` for every pod of
one restart at each size, in one process, and prints microseconds per pod and the ratio to
the smallest size: flat is 1.0. (The map rebuilt itself on every mark once it held more
than 4,096 entries: 3.6 s for the 12,736 marks of one restart on this machine, against
5 ms now; bench/HISTORY.md, entry 131e700.)

    .venv/bin/python bench/deletion_marks.py [--sizes 256 4096 12736] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

from tpu_operator.reconcile.expectations import DeletedPods


def one_restart(pods: int) -> float:
    """CPU seconds to record the deletion of ``pods`` pods, one after another."""
    deleted = DeletedPods()
    uids = [f"6f1c2a4e-0000-4000-8000-{n:012d}" for n in range(pods)]
    started = time.process_time()
    for uid in uids:
        deleted.requested(uid)
    elapsed = time.process_time() - started
    assert all(deleted.awaited(uid) for uid in uids), "a deletion was forgotten within its TTL"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096, 12736])
    parser.add_argument("--repeat", type=int, default=5, help="rounds per size; the best counts")
    args = parser.parse_args()
    base = None
    print("| pods | us per pod (best of rounds) | vs smallest |")
    print("|---|---|---|")
    for pods in sorted(args.sizes):
        per_pod = min(one_restart(pods) for _ in range(args.repeat)) / pods * 1e6
        base = base or per_pod
        print(f"| {pods:,} | {per_pod:.2f} | {per_pod / base:.2f} |")


if __name__ == "__main__":
    main()
