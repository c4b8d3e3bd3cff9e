"""A 429's Retry-After holds the work queue's retry of the key back (the fault proxy's 429
storm showed the first retry 0.5 s after a "Retry-After: 1")."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tpu_operator.runtime.kube import ApiError, retry_after
from tpu_operator.runtime.workqueue import WorkQueue, retry_delay

pytestmark = pytest.mark.unit

THROTTLED = {
    "kind": "Status",
    "status": "Failure",
    "reason": "TooManyRequests",
    "code": 429,
    "details": {"retryAfterSeconds": 3},
}


def test_retry_after_is_read_from_the_status_details() -> None:
    assert retry_after(THROTTLED) == 3.0
    assert retry_after({"reason": "InternalError", "code": 500}) is None
    assert retry_after({"details": {"retryAfterSeconds": 0}}) is None
    assert retry_after({"details": {"retryAfterSeconds": "soon"}}) is None
    assert retry_after({"details": None}) is None


@pytest.mark.parametrize(
    ("failures", "after", "expected"),
    [
        (1, None, 0.5),  # plain exponential backoff
        (3, None, 2.0),
        (10, None, 60.0),  # capped
        (1, 3.0, 3.0),  # the apiserver asked for longer
        (5, 3.0, 8.0),  # the backoff is longer already
        (1, 600.0, 60.0),  # never beyond the cap
    ],
)
def test_the_retry_waits_at_least_as_long_as_the_apiserver_asked(
    failures: int, after: float | None, expected: float
) -> None:
    assert retry_delay(failures, 0.5, 60.0, after) == expected


def test_a_throttled_reconcile_is_retried_after_the_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    async def handler(key: str) -> float | None:
        calls.append(key)
        raise ApiError("POST", "/api/v1/pods", 429, "TooManyRequests", "slow down", 2.0)

    async def scenario() -> None:
        failed = asyncio.Event()  # the observer runs after the failure was logged
        queue: WorkQueue[str] = WorkQueue(
            "t",
            handler,
            base_retry=0.01,
            quiet=(ApiError,),
            observer=lambda name, seconds, ok: failed.set(),
        )
        queue.start()
        queue.add("a")
        await failed.wait()
        await queue.stop()

    with caplog.at_level(logging.WARNING):
        asyncio.run(asyncio.wait_for(scenario(), 10))
    assert calls == ["a"]
    assert "retrying in 2.0 s" in caplog.text, caplog.text
