"""Memory profile of a benchmark's operator: ``tracemalloc`` from interpreter start-up.

``bench/load.py --tracemalloc FILE`` puts this directory on the operator's ``PYTHONPATH``,
so Python imports it before anything else. With ``TPU_BENCH_TRACEMALLOC=FILE`` set, it
traces every allocation and rewrites FILE every ``TPU_BENCH_TRACEMALLOC_PERIOD`` seconds
(default 20) with the live memory by line (and by call stack with
``TPU_BENCH_TRACEMALLOC_FRAMES`` > 1): what holds the operator's
memory at that moment, by the code that allocated it. Between reports it polls the traced
total every 0.5 s and, when it is a quarter above the highest seen so far (and above
32 MiB), writes the same report to FILE.peak: what held the memory near its peak, which
the periodic report misses when the peak is short. Tracing costs CPU and about a third
more memory; use it to find where memory goes, never for the figures themselves.

With ``TPU_BENCH_MALLOCSTATS=FILE`` instead, nothing is traced: every period it writes
pymalloc's statistics (``sys._debugmallocstats``) to FILE and appends one line to FILE.log:
RSS, pymalloc's arenas (1 MiB each), the bytes of its live blocks, the free space it
holds in partly used and in unused pools, and glibc's bytes in use and free
(``mallinfo2``). Live objects against what the allocators keep, at no measurable cost.
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


_PEAK_STEP = 1.25
_PEAK_FLOOR = 32 * 2**20
_POLL = 0.5


def _loop(path: str, period: float) -> None:
    due = time.monotonic() + period
    highest = _PEAK_FLOOR / _PEAK_STEP
    while True:
        time.sleep(_POLL)
        try:
            current = tracemalloc.get_traced_memory()[0]
            if current > highest * _PEAK_STEP:
                highest = current
                _report(path + ".peak")
            if time.monotonic() >= due:
                due = time.monotonic() + period
                _report(path)
        except Exception as exc:  # a report that fails must not stop the operator
            with Path(path + ".error").open("a") as out:
                out.write(f"{exc!r}\n")


if _OUT:
    tracemalloc.start(_FRAMES)
    _period = float(os.environ.get("TPU_BENCH_TRACEMALLOC_PERIOD", "20"))
    threading.Thread(target=_loop, args=(_OUT, _period), daemon=True, name="tracemalloc").start()


_MALLOCSTATS = os.environ.get("TPU_BENCH_MALLOCSTATS")


_SUMMARY = {
    "# arenas allocated current": "arenas",
    "# bytes in allocated blocks": "used",
    "# bytes in available blocks": "free in used pools",
}


def _glibc() -> str:
    """glibc malloc's own figures (``mallinfo2``): what the objects pymalloc does not
    serve (over 512 bytes: large dicts' tables, lists, bytes, native libraries) hold, and
    the free space its heaps keep."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
            )
        ]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    mib = 2**20
    return (
        f"glibc in use {info.uordblks / mib:.1f}, free {info.fordblks / mib:.1f}, "
        f"mmapped {info.hblkhd / mib:.1f}"
    )


def _summary(report: str) -> str:
    """One line of a report, for FILE.log: RSS, pymalloc's arenas (MiB each), the bytes
    its live objects take, and the free space it holds (in partly used and unused pools)."""
    lines = report.splitlines()
    fields = [lines[0]]
    for line in lines[1:]:
        name, _, value = line.partition("=")
        label = _SUMMARY.get(name.strip())
        number = value.strip().replace(",", "")
        if label is not None and number.isdigit():
            amount = int(number) if label == "arenas" else int(number) / 2**20
            fields.append(f"{label} {amount:.1f}" if label != "arenas" else f"arenas {amount}")
        elif "unused pools *" in line and number.isdigit():
            fields.append(f"unused pools {int(number) / 2**20:.1f}")
    fields.append(_glibc())
    return "; ".join(fields)


def _mallocstats(path: str, period: float) -> None:
    import sys

    while True:
        time.sleep(period)
        try:
            # _debugmallocstats writes to C's stderr: point fd 2 at the file meanwhile (a
            # log line another thread writes in that moment lands there too).
            with Path(path + ".tmp").open("w") as out:
                out.write(
                    f"{time.strftime('%H:%M:%S')} RSS {_status('VmRSS')}, peak {_status('VmHWM')}\n"
                )
                out.flush()
                saved = os.dup(2)
                try:
                    os.dup2(out.fileno(), 2)
                    sys._debugmallocstats()
                finally:
                    os.dup2(saved, 2)
                    os.close(saved)
            Path(path + ".tmp").replace(path)
            with Path(path + ".log").open("a") as log:
                log.write(_summary(Path(path).read_text()) + "\n")
        except Exception as exc:  # a report that fails must not stop the operator
            with Path(path + ".error").open("a") as out:
                out.write(f"{exc!r}\n")


if _MALLOCSTATS and not _OUT:
    _period = float(os.environ.get("TPU_BENCH_TRACEMALLOC_PERIOD", "20"))
    threading.Thread(
        target=_mallocstats, args=(_MALLOCSTATS, _period), daemon=True, name="mallocstats"
    ).start()
