"""Set the operator's profiles of one phase at two job sizes side by side, per pod.

``scale.py --profile DIR`` records each phase of each trial on its own
(``DIR/<trial>-<phase>.txt``, py-spy's collapsed stacks at 100 Hz of the thread that holds
the GIL). A sample is then 10 ms of the operator's Python CPU. This script files every
sample under what the event loop or a worker thread was running at the time (the frame
just below the loop's ``Handle._run`` or the thread pool's ``_worker``: a watch, a work
queue's worker, a request's thread) and under the operator function nearest the leaf,
and prints each one's CPU per pod at both sizes and their ratio: a term that grows with
the size of the job shows as a ratio above 1.

    .venv/bin/python bench/profile_phases.py /tmp/prof --phase restart \\
        --trial op256-1=256 --trial op12736-1=12736

The figures are samples, not a CPU clock: a phase of 1 CPU-second has only about 100
of them, so a small job's rows move by several percent from run to run.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

SAMPLE_MS = 10.0
"""py-spy's interval at ``--rate 100`` (harness.profile)."""
DISPATCH = ("Handle._run (asyncio/events.py", "_worker (concurrent/futures/thread.py")
"""Frames below which a sample's work is named: the event loop running a callback or a
task's step, and the thread pool running a work item."""
OWN = "tpu_operator/"
QUEUE = "WorkQueue._work"
"""A work queue's worker: named with the handler it runs (slices or jobs)."""
ENTRY = ("tpu_operator/__main__.py", "tpu_operator/cli.py", "tpu_operator/controllers.py")
"""The operator's start-up frames, below everything it runs: not where a sample's CPU went."""


def frames_of(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    if not count.isdigit():
        return [], 0
    return [f.strip() for f in stack.split(";") if f.strip()], int(count)


def function(frame: str) -> str:
    """``Name.method (path.py:12)`` without its line number."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def work_of(frames: list[str]) -> str:
    """What the loop or a thread was running: the frame below the last dispatch frame;
    the loop's own polling and timers when there is none."""
    for index in range(len(frames) - 1, -1, -1):
        if frames[index].startswith(DISPATCH) and index + 1 < len(frames):
            named = function(frames[index + 1])
            if named.startswith(QUEUE) and index + 2 < len(frames):
                named += " > " + function(frames[index + 2])  # which queue's handler
            return named
    if any("BaseEventLoop._run_once" in f for f in frames):
        return "(event loop: polling, timers)"
    if any("threading.py" in f for f in frames):
        return "(threads: other)"
    return "(other)"


def own_leaf(frames: list[str]) -> str:
    """The operator's function nearest the leaf (where its own code spent the sample)."""
    for frame in reversed(frames):
        if OWN in frame and not any(entry in frame for entry in ENTRY):
            return function(frame)
    return "(libraries and the event loop only)"


def load(path: Path) -> tuple[Counter[str], Counter[str], int]:
    work: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        frames, count = frames_of(line)
        if not frames:
            continue
        work[work_of(frames)] += count
        leaves[own_leaf(frames)] += count
        total += count
    return work, leaves, total


def table(
    title: str, counts: list[Counter[str]], pods: list[int], labels: list[str], rows: int
) -> None:
    per_pod = [
        {key: n * SAMPLE_MS / size for key, n in c.items()}
        for c, size in zip(counts, pods, strict=True)
    ]
    keys = sorted(set().union(*per_pod), key=lambda k: -max(p.get(k, 0.0) for p in per_pod))
    print(f"\n{title} (ms of CPU per pod)")
    print("  " + "".join(f"{label:>12}" for label in labels) + "       ratio  what")
    for key in keys[:rows]:
        values = [p.get(key, 0.0) for p in per_pod]
        ratio = f"{values[-1] / values[0]:9.2f}" if values[0] else "        -"
        cells = "".join(f"{v:12.3f}" for v in values)
        print(f"  {cells}   {ratio}  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--phase", default="restart", help="create, steady, restart or delete")
    parser.add_argument(
        "--trial",
        action="append",
        required=True,
        metavar="NAME=PODS",
        help="a trial's name and its number of pods; the last is compared with the first",
    )
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    names, pods = [], []
    for item in args.trial:
        name, _, size = item.partition("=")
        if not size.isdigit():
            parser.error(f"--trial {item!r}: expected NAME=PODS, e.g. op256-1=256")
        names.append(name)
        pods.append(int(size))
    loaded = []
    for name in names:
        path = args.directory / f"{name}-{args.phase}.txt"
        if not path.exists():
            parser.error(f"no profile at {path} (scale.py --profile {args.directory})")
        loaded.append(load(path))
    labels = [f"{size:,} pods" for size in pods]
    totals = [t for _, _, t in loaded]
    print(f"phase {args.phase}: " + ", ".join(
        f"{name} {t:,} samples = {t * SAMPLE_MS / size:.2f} ms per pod"
        for name, t, size in zip(names, totals, pods, strict=True)
    ))  # fmt: skip
    table("By what ran", [w for w, _, _ in loaded], pods, labels, args.rows)
    table("By the operator's function nearest the leaf", [lf for _, lf, _ in loaded], pods,
          labels, args.rows)  # fmt: skip


if __name__ == "__main__":
    main()
