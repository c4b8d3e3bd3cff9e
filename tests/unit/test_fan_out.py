"""``runtime/control.fan_out``: a call on every item by a bounded number of workers, the
results in order with exceptions in their place, as ``gather(return_exceptions=True)``."""

from __future__ import annotations

import asyncio

import pytest

from tpu_operator.runtime.control import ControlError, fan_out

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("count", "limit"), [(0, 4), (1, 4), (3, 4), (10, 4), (10, 1)])
def test_every_item_is_called_once_at_most_limit_at_a_time_and_answered_in_order(
    count: int, limit: int
) -> None:
    busy, peak, calls = 0, 0, []

    async def call(item: int) -> int:
        nonlocal busy, peak
        calls.append(item)
        busy += 1
        peak = max(peak, busy)
        await asyncio.sleep(0.001 * (item % 3))  # answers out of order
        busy -= 1
        if item % 4 == 3:
            raise ControlError(f"item {item}")
        return item * 10

    results = asyncio.run(fan_out(list(range(count)), call, limit))
    assert sorted(calls) == list(range(count))
    assert peak == min(limit, count)
    for item, result in enumerate(results):
        if item % 4 == 3:
            assert isinstance(result, ControlError) and str(result) == f"item {item}"
        else:
            assert result == item * 10


def test_a_cancelled_fan_out_cancels_its_calls() -> None:
    cancelled = []

    async def call(item: int) -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise
        return item

    async def scenario() -> None:
        task = asyncio.create_task(fan_out(list(range(8)), call, 3))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert sorted(cancelled) == [0, 1, 2], "only the calls in flight were begun"
