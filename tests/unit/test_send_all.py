"""``runtime/kube.send_all``: requests in groups, each group answered before the next is
sent; every request sent whatever the others answer; the first failure raised after."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable

import pytest

from tpu_operator.runtime.kube import send_all

pytestmark = pytest.mark.unit


def test_a_group_is_answered_before_the_next_is_sent_and_a_failure_stops_none():
    log: list[str] = []

    async def request(name: str, fail: bool = False) -> None:
        log.append(f"sent {name}")
        await asyncio.sleep(0.01 if name.startswith("a") else 0)
        log.append(f"answered {name}")
        if fail:
            raise ValueError(name)

    async def main() -> None:
        first: list[Awaitable[None]] = [request("a1", fail=True), request("a2")]
        then: list[Awaitable[None]] = [request("b1", fail=True), request("b2")]
        with pytest.raises(ValueError, match="a1"):  # the first failure, of either group
            await send_all(first, then)

    asyncio.run(main())
    assert log.index("answered a1") < log.index("sent b1")
    assert log.index("answered a2") < log.index("sent b1")
    assert {"answered b1", "answered b2"} <= set(log)  # sent despite a1's failure


def test_one_group_sends_everything_at_once():
    log: list[str] = []

    async def request(name: str) -> None:
        log.append(f"sent {name}")
        await asyncio.sleep(0)
        log.append(f"answered {name}")

    asyncio.run(send_all(request(n) for n in ("x", "y", "z")))
    assert log[:3] == ["sent x", "sent y", "sent z"]
    assert len(log) == 6


def test_cancelled_it_closes_the_requests_of_the_groups_not_yet_sent():
    async def request() -> None:
        await asyncio.sleep(10)

    later = [request(), request()]

    async def main() -> None:
        task = asyncio.create_task(send_all([request()], later))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # Closed, never started: no "coroutine was never awaited" warning when collected.
    assert [inspect.getcoroutinestate(c) for c in later] == [inspect.CORO_CLOSED] * 2
