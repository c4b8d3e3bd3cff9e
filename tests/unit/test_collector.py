"""The operator process's memory settings (``runtime/collector.py``) on this machine's
glibc: trimming hands freed memory back, and the arena limit is accepted."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tpu_operator.runtime import collector

pytestmark = pytest.mark.unit
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@glibc
def test_trim_returns_the_pages_a_decoded_list_left_free():
    # Like a decoded list page: many mid-sized blocks, of which a few outlive the rest
    # (the views) and pin the heap's top, so free() alone returns nothing.
    blocks = [bytes(2000) for _ in range(40_000)]  # ~80 MB
    kept = blocks[::20]
    del blocks
    before = rss_mb()
    collector.trim()
    after = rss_mb()
    assert len(kept) == 2000
    assert before - after > 40, (before, after)


@glibc
def test_the_arena_limit_is_set_through_glibc():
    assert collector._LIBC is not None
    assert collector._LIBC.mallopt(collector._M_ARENA_MAX, collector.ARENAS) == 1
    collector.limit_arenas()  # what the operator calls at start
