"""Benchmark: the progress sampler's choice of whom to read in a leaders' round.

Most rounds of the progress sampler read worker 0 of each slice of a running job, or, while
no worker answers (a job still starting, an image without metrics), one of them a round
(``runtime/sampler.py``). Two ways of finding them, side by side in one process over the
same pod store:

- ``walk``: what each round did before ``round_targets``: every pod of the job copied out
  of the cache, filtered, and the leaders picked out of those;
- ``index``: ``round_targets``, which reads the job's leaders from their own key of the
  pod store (``listwatch.pod_keys``, ``Caches.leaders_of_job``).

The store holds one job of ``--sizes`` hosts in slices of 64 (v5litepod-256), every pod
Running (``job_assess.filled``). Figures: microseconds per round (the best of
``--repeat`` rounds of ``--number`` calls) and the index's ratio to the walk.

    .venv/bin/python bench/sampler_round.py [--sizes 256 1024 4096 12736]
"""

from __future__ import annotations

import micro
from job_assess import ATTEMPT, JOB, NAMESPACE, filled

from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.sampler import round_targets
from tpu_operator.state.views import PodView

KEY = (NAMESPACE, JOB)


def walk(caches: Caches, round_number: int) -> list[PodView]:
    """The leaders' round as it was: every pod of the job walked to find the leaders."""
    pods = [
        p
        for p in caches.pods_of_job(*KEY)
        if p.attempt == ATTEMPT and p.phase == "Running" and p.pod_ip and not p.deleting
    ]
    leaders = sorted((p for p in pods if p.worker_index == 0), key=lambda p: p.slice_index)
    return [leaders[round_number % len(leaders)]]


def index(caches: Caches, round_number: int) -> list[PodView]:
    return round_targets(caches, KEY, ATTEMPT, False, True, round_number)


def measure(hosts: int, number: int, repeat: int) -> str:
    caches, _, _ = filled(hosts)
    for turn in range(3):
        assert walk(caches, turn) == index(caches, turn), "both read the same leader"
    slow = micro.best_us(lambda turn: walk(caches, turn), number, repeat)
    fast = micro.best_us(lambda turn: index(caches, turn), number, repeat)
    return f"| {hosts:,} | {slow:,.1f} | {fast:,.1f} | {fast / slow:.3f} |"


def main() -> None:
    micro.table(
        __doc__,
        ["hosts", "walk, us per round", "index, us per round", "index / walk"],
        measure,
        sizes=[256, 1024, 4096, 12736],
        number=50,
    )


if __name__ == "__main__":
    main()
