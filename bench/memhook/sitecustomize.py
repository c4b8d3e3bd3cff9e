"""Memory profile of a benchmark's operator: ``tracemalloc`` from interpreter start-up.

``bench/load.py --tracemalloc FILE`` puts this directory on the operator's ``PYTHONPATH``,
so Python imports it before anything else. With ``TPU_BENCH_TRACEMALLOC=FILE`` set, it
traces every allocation and rewrites FILE every ``TPU_BENCH_TRACEMALLOC_PERIOD`` seconds
(default 20) with the live memory by line (and by call stack with
``TPU_BENCH_TRACEMALLOC_FRAMES`` > 1): what holds the operator's
memory at that moment, by the code that allocated it. Tracing costs CPU and about a third
more memory; use it to find where memory goes, never for the figures themselves.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

_OUT = os.environ.get("TPU_BENCH_TRACEMALLOC")
_FRAMES = int(os.environ.get("TPU_BENCH_TRACEMALLOC_FRAMES", "1"))
"""Frames kept per allocation. Grouping by call stack is pure Python and takes minutes at
12 frames with a few million live blocks (the operator stalls meanwhile): 1 by default."""


def _status(field: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return "?"


def _report(path: str) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
        )
    )
    current, peak = tracemalloc.get_traced_memory()
    lines = [
        f"{time.strftime('%H:%M:%S')} traced now {current / 2**20:.1f} MiB, "
        f"peak {peak / 2**20:.1f} MiB; RSS {_status('VmRSS')}, peak {_status('VmHWM')}",
        "",
        "## by line (top 40)",
    ]
    for stat in snapshot.statistics("lineno")[:40]:
        lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks  {stat.traceback[0]}")
    if _FRAMES > 1:
        lines += ["", "## by call stack (top 15, innermost last)"]
        for stat in snapshot.statistics("traceback")[:15]:
            lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks")
            lines += [f"    {frame}" for frame in stat.traceback]
    partial = Path(path + ".tmp")
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(path)


def _loop(path: str, period: float) -> None:
    while True:
        time.sleep(period)
        try:
            _report(path)
        except Exception as exc:  # a report that fails must not stop the operator
            with Path(path + ".error").open("a") as out:
                out.write(f"{exc!r}\n")


if _OUT:
    tracemalloc.start(_FRAMES)
    _period = float(os.environ.get("TPU_BENCH_TRACEMALLOC_PERIOD", "20"))
    threading.Thread(target=_loop, args=(_OUT, _period), daemon=True, name="tracemalloc").start()
