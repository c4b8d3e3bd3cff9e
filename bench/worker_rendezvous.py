"""Benchmark: rendezvous time of 2, 4 and 8 local worker processes.

Each gang runs ``tpu-worker check`` as pods would run it (own hostname and /etc/hosts,
env from the operator's builder; the tests' launcher), which rendezvouses and runs one
cross-process collective. Reported per gang size, as the median over repeats:

- initialize: jax.distributed.initialize + backend creation, slowest process (the
  worker's own log line "rendezvous complete ... initialize Xs");
- spawn to ready: process creation to the last process's "rendezvous complete" line
  (includes Python start and importing JAX, which dominate on this machine);
- spawn to exit: until every process exited after the collective.

Needs root (unshare). Runs one gang at a time.

    .venv/bin/python bench/worker_rendezvous.py [--sizes 2 4 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.worker import launch

READY = re.compile(r"^(\S+ \S+) INFO .*rendezvous complete: .*initialize ([0-9.]+)s", re.M)
TOPOLOGY = {2: "2x4", 4: "4x4", 8: "4x8"}  # v5e slices of 4-chip hosts


def one_gang(size: int, workdir: Path) -> tuple[float, float, float]:
    with launch.gang(launch.wirings(topology=TOPOLOGY[size]), workdir) as gang:
        spawned = time.time()
        gang.start(launch.worker_command("check", "--init-timeout", "300"))
        codes = gang.wait(600)
        exited = time.time()
        if any(codes.values()):
            raise RuntimeError(f"gang of {size} failed: {codes}\n{gang.logs()}")
        initialize, ready = [], []
        for pod in gang.pods:
            match = READY.search(pod.log())
            if match is None:
                raise RuntimeError(f"no rendezvous line in {pod.name}:\n{pod.log()}")
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            ready.append(stamp - spawned)
            initialize.append(float(match.group(2)))
    return max(initialize), max(ready), exited - spawned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not launch.can_isolate():
        raise SystemExit("needs root and unshare --mount --uts")
    results: dict[int, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rendezvous-") as tmp:
        for size in args.sizes:
            runs = [one_gang(size, Path(tmp) / f"{size}-{r}") for r in range(args.repeats)]
            results[size] = tuple(statistics.median(column) for column in zip(*runs, strict=True))
            print(f"  {size} processes: {[tuple(round(x, 2) for x in run) for run in runs]}")
    base = results[args.sizes[0]]
    print(f"rendezvous, median of {args.repeats} runs per size (seconds)")
    print(
        f"{'processes':>9}{'initialize':>12}{'ratio':>7}{'spawn->ready':>14}{'ratio':>7}"
        f"{'spawn->exit':>13}"
    )
    for size, (init, ready, total) in results.items():
        print(
            f"{size:>9}{init:>12.3f}{init / base[0]:>7.2f}{ready:>14.2f}{ready / base[1]:>7.2f}"
            f"{total:>13.2f}"
        )


if __name__ == "__main__":
    main()
