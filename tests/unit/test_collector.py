"""The operator process's memory settings (``runtime/collector.py``) on this machine's
glibc: trimming hands freed memory back, the arena limit is accepted, and the runtime trims
after work but not while idle."""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest

from tests.unit.test_runtime_wakes import KUBECONFIG
from tpu_operator.app import OperatorConfig, Runtime
from tpu_operator.runtime import collector
from tpu_operator.runtime.kube import RequestRecord

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


def test_the_runtime_trims_after_work_and_not_while_idle(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    runtime = Runtime(OperatorConfig(kubeconfig=str(path)), slices={}, jobs={})
    trims: list[int] = []
    monkeypatch.setattr(collector, "TRIM_SECONDS", 0.02)
    monkeypatch.setattr(collector, "trim", lambda: trims.append(runtime._decoded))

    async def scenario() -> None:
        task = asyncio.create_task(runtime._trim())
        await asyncio.sleep(0.1)
        assert trims == [], "nothing decoded yet: no trim"
        runtime.pod_watch.count()  # a watch event, as ListWatch counts each
        runtime.pod_watch.count()
        await asyncio.sleep(0.1)
        assert trims == [2], "one trim after the work, none for the idle rounds after it"
        runtime._api_request(RequestRecord("POST", 201, 0.01))  # an API answer
        await asyncio.sleep(0.1)
        assert trims == [2, 3]
        task.cancel()

    asyncio.run(scenario())
    asyncio.run(runtime.kube.close())
