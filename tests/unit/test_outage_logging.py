"""What an apiserver outage logs: one line per failed reconcile naming the request and the
retry, no traceback; a bug still logs its traceback."""

from __future__ import annotations

import asyncio
import logging
import socket

import aiohttp
import pytest

from tpu_operator.runtime.kube import ApiError, _transport_error
from tpu_operator.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


def _run_failing_once(error: Exception) -> None:
    async def scenario() -> None:
        done = asyncio.Event()
        calls = 0

        async def handler(key: tuple[str, str]) -> float | None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise error
            done.set()
            return None

        queue: WorkQueue[tuple[str, str]] = WorkQueue(
            "TPUJob", handler, workers=1, base_retry=0.01, quiet=(ApiError,)
        )
        queue.start()
        queue.add(("ml", "train"))
        await asyncio.wait_for(done.wait(), 5)
        await queue.stop()

    asyncio.run(scenario())


def test_a_failed_request_logs_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = ApiError("PATCH", "/apis/x/status", 0, "ClientConnectorError", "[Errno 111] refused")
    with caplog.at_level(logging.WARNING, logger="tpu_operator.runtime.workqueue"):
        _run_failing_once(refused)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "TPUJob ml/train: reconcile failed (PATCH /apis/x/status: 0 ClientConnectorError: "
        "[Errno 111] refused); retrying in 0.0 s"
    )


def test_a_bug_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tpu_operator.runtime.workqueue"):
        _run_failing_once(KeyError("spec"))
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None


def test_a_refused_connection_is_described_by_its_cause() -> None:
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 6443)")
    error = aiohttp.ClientConnectorError(None, refused)  # type: ignore[arg-type]
    assert _transport_error(error, 30) == ("ClientConnectorError", "[Errno 111] Connection refused")
    unknown = socket.gaierror(-2, "Name or service not known")
    error = aiohttp.ClientConnectorDNSError(None, unknown)  # type: ignore[arg-type]
    assert _transport_error(error, 30) == (
        "ClientConnectorDNSError",
        "[Errno -2] Name or service not known",
    )
    assert _transport_error(TimeoutError(), 30) == ("TimeoutError", "no answer within 30 s")
    assert _transport_error(TimeoutError("timed out"), 30) == ("TimeoutError", "timed out")
