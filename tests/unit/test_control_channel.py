"""The operator's control channel (``runtime/control.py``) against supervisors that lie,
flood or stall: answers must be signed for their request, are read up to a cap, never
decompressed or redirected, every request ends within its timeout, and one job's requests
never take the whole channel.

Each "supervisor" is a small asyncio HTTP server in this process on 127.0.0.1 (the real
supervisor and hostile ones as separate processes: tests/worker/test_supervisor_attacks.py).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Awaitable, Callable

import pytest

from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator.runtime.control import ControlChannel, ControlError, printable

pytestmark = pytest.mark.unit

MASTER = b"master-key-for-the-channel-tests"
JOB = "job-uid-1"
POD = "pod-uid-1"
STATUS = {"state": "exited", "attempt": 1, "exit_code": 1, "checkpoints": []}

Respond = Callable[[asyncio.StreamWriter, dict[str, str], bytes], Awaitable[None]]


class Server:
    """An HTTP/1.1 server answering every request with ``respond``; counts requests and
    the requests in flight."""

    def __init__(self, respond: Respond, host: str = "127.0.0.1", port: int = 0) -> None:
        self.respond = respond
        self.host = host
        self.requests = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.server: asyncio.Server | None = None
        self._arrived = asyncio.Condition()
        self.port = port

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def until(self, check: Callable[[], bool]) -> None:
        """Until ``check()`` holds, looked at as each request arrives."""
        async with self._arrived:
            await self._arrived.wait_for(check)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        async with self._arrived:
            self._arrived.notify_all()
        try:
            await reader.readline()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length") or 0))
            await self.respond(writer, headers, body)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.in_flight -= 1
            writer.close()


def answer(
    code: int, body: bytes, extra: dict[str, str] | None = None
) -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    async def send(writer: asyncio.StreamWriter) -> None:
        lines = [f"HTTP/1.1 {code} X", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()

    return send


def signed_answer(
    code: int = 200, body: bytes | None = None, *, pod: str = POD, nonce: str | None = None
) -> Respond:
    """The real supervisor's answer: signed for the request's pod and nonce."""

    async def respond(writer: asyncio.StreamWriter, headers: dict[str, str], _: bytes) -> None:
        payload = json.dumps(STATUS).encode() if body is None else body
        key = sv.derive_job_key(MASTER, JOB)
        accepted = sv.Accepted(key, pod, nonce or sv.nonce_of(headers["authorization"]))
        signature = accepted.sign_answer(code, payload)
        await answer(code, payload, {sv.ANSWER_HEADER: signature})(writer)

    return respond


def channel(port: int, **options: object) -> ControlChannel:
    return ControlChannel(MASTER, port=port, **options)  # type: ignore[arg-type]


def test_a_signed_answer_is_taken() -> None:
    asyncio.run(_test_a_signed_answer_is_taken())


async def _test_a_signed_answer_is_taken() -> None:
    async with Server(signed_answer()) as server:
        control = channel(server.port)
        try:
            state = await control.status(JOB, POD, "127.0.0.1")
        finally:
            await control.close()
    assert (state.state, state.attempt, state.exit_code) == ("exited", 1, 1)


@pytest.mark.parametrize(
    ("respond", "message"),
    [
        (
            lambda w, h, b: answer(200, json.dumps(STATUS).encode())(w),
            "not from the pod's supervisor: the answer has no TPU-Signature header",
        ),
        (signed_answer(pod="another-pod"), "bad answer signature"),
        (signed_answer(nonce="0" * 32), "bad answer signature"),  # an old answer replayed
    ],
    ids=["unsigned", "another pod's", "another request's"],
)
def test_an_answer_not_signed_for_the_request_is_refused(respond: Respond, message: str) -> None:
    asyncio.run(_test_an_answer_not_signed_for_the_request_is_refused(respond, message))


async def _test_an_answer_not_signed_for_the_request_is_refused(
    respond: Respond, message: str
) -> None:
    async with Server(respond) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError, match=message):
                await control.stop(JOB, POD, "127.0.0.1", 1, 10.0)
        finally:
            await control.close()


def test_a_409_counts_only_signed() -> None:
    asyncio.run(_test_a_409_counts_only_signed())


async def _test_a_409_counts_only_signed() -> None:
    running = json.dumps({**STATUS, "state": "running", "attempt": 3}).encode()
    async with Server(signed_answer(409, running)) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError) as refused:
                await control.stop(JOB, POD, "127.0.0.1", 1, 10.0)
        finally:
            await control.close()
    assert refused.value.conflict and refused.value.state is not None
    assert refused.value.state.attempt == 3


def test_a_long_answer_is_cut_at_the_cap() -> None:
    asyncio.run(_test_a_long_answer_is_cut_at_the_cap())


async def _test_a_long_answer_is_cut_at_the_cap() -> None:
    """A supervisor that streams a huge answer (no Content-Length, chunks without end):
    the operator reads just past the cap and drops the connection."""
    sent = [0]

    async def flood(writer: asyncio.StreamWriter, *_: object) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(16 * 1024):  # 1 GiB if it were all read
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent[0] += len(chunk)

    async with Server(flood) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError, match="passed the 65536-byte cap; cut there"):
                await control.status(JOB, POD, "127.0.0.1")
        finally:
            await control.close()
    assert sent[0] < 64 * 1024 * 1024, sent  # it could not push more than the buffers hold


def test_a_declared_long_answer_is_not_read() -> None:
    asyncio.run(_test_a_declared_long_answer_is_not_read())


async def _test_a_declared_long_answer_is_not_read() -> None:
    async def declared(writer: asyncio.StreamWriter, *_: object) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
        await writer.drain()

    async with Server(declared) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError, match="1073741824 bytes, over the 65536-byte cap"):
                await control.status(JOB, POD, "127.0.0.1")
        finally:
            await control.close()


def test_a_compressed_answer_is_not_decompressed() -> None:
    asyncio.run(_test_a_compressed_answer_is_not_decompressed())


async def _test_a_compressed_answer_is_not_decompressed() -> None:
    bomb = gzip.compress(b"{" + b" " * (10 * 1024 * 1024) + b"}")  # 10 MiB from ~10 KiB

    async def zipped(writer: asyncio.StreamWriter, headers: dict[str, str], _: bytes) -> None:
        assert headers.get("accept-encoding") == "identity"
        await answer(200, bomb, {"Content-Encoding": "gzip"})(writer)

    async with Server(zipped) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError, match="the answer is compressed \\(gzip\\); not read"):
                await control.status(JOB, POD, "127.0.0.1")
        finally:
            await control.close()


def test_a_redirect_is_not_followed() -> None:
    asyncio.run(_test_a_redirect_is_not_followed())


async def _test_a_redirect_is_not_followed() -> None:
    async with Server(signed_answer()) as target:

        async def redirect(writer: asyncio.StreamWriter, *_: object) -> None:
            location = f"http://127.0.0.1:{target.port}{sv.STATUS_PATH}"
            await answer(302, b"", {"Location": location})(writer)

        async with Server(redirect) as server:
            control = channel(server.port)
            try:
                with pytest.raises(ControlError, match="HTTP 302"):
                    await control.status(JOB, POD, "127.0.0.1")
            finally:
                await control.close()
    assert target.requests == 0


def test_a_supervisor_that_never_answers_ends_in_the_timeout() -> None:
    asyncio.run(_test_a_supervisor_that_never_answers_ends_in_the_timeout())


async def _test_a_supervisor_that_never_answers_ends_in_the_timeout() -> None:
    async def silent(*_: object) -> None:
        await asyncio.Event().wait()

    async with Server(silent) as server:
        control = channel(server.port, timeout=0.5)
        try:
            with pytest.raises(ControlError, match=r"no answer within 0\.5 s"):
                await control.stop(JOB, POD, "127.0.0.1", 1, 3600.0)
        finally:
            await control.close()


def test_one_jobs_silent_supervisors_hold_only_its_share_of_the_channel() -> None:
    asyncio.run(_test_one_jobs_silent_supervisors_hold_only_its_share_of_the_channel())


async def _test_one_jobs_silent_supervisors_hold_only_its_share_of_the_channel() -> None:
    release = asyncio.Event()

    async def silent(*_: object) -> None:
        await release.wait()

    async with (
        Server(silent, "127.0.0.2") as hostile,
        Server(signed_answer(), "127.0.0.3", hostile.port) as honest,
    ):
        control = channel(hostile.port, concurrency=6, per_job=3, timeout=60)
        stuck = [asyncio.create_task(control.status("job-a", POD, "127.0.0.2")) for _ in range(20)]
        try:
            await hostile.until(lambda: hostile.in_flight == 3)
            done = await asyncio.gather(*(control.status(JOB, POD, "127.0.0.3") for _ in range(5)))
            assert [s.state for s in done] == ["exited"] * 5
            assert not any(t.done() for t in stuck)
            assert hostile.most_in_flight == 3 and honest.requests == 5
        finally:
            release.set()
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
            await control.close()
    assert not control._jobs, "per-job limits are dropped once a job has no requests"


def test_a_start_with_other_variables_is_never_sent() -> None:
    asyncio.run(_test_a_start_with_other_variables_is_never_sent())


async def _test_a_start_with_other_variables_is_never_sent() -> None:
    async with Server(signed_answer()) as server:
        control = channel(server.port)
        try:
            for env in ({"LD_PRELOAD": "/tmp/x.so"}, {contract.ENV_RESTART_ATTEMPT: "9"}):
                with pytest.raises(ControlError, match="start request: env"):
                    await control.start(JOB, POD, "127.0.0.1", 2, env)
            ok = await control.start(JOB, POD, "127.0.0.1", 2, {contract.ENV_RESTART_ATTEMPT: "2"})
        finally:
            await control.close()
    assert ok.state == "exited"
    assert server.requests == 1


def test_text_from_a_pod_is_made_printable_and_short() -> None:
    assert printable("ok\x1b[31m\nforged log line") == "ok?[31m?forged log line"
    assert printable("x" * 500) == "x" * 200 + "..."


def test_a_queued_command_is_signed_when_its_turn_comes() -> None:
    asyncio.run(_test_a_queued_command_is_signed_when_its_turn_comes())


async def _test_a_queued_command_is_signed_when_its_turn_comes() -> None:
    """A supervisor takes a signature's timestamp within 30 s. A restart of thousands of
    pods queues thousands of commands behind the job's share of the channel, so one signed
    when queued could be stale by its turn: each is signed when it is sent. Here one
    command in flight at a time, the first answered after 2.2 s: the second's timestamp is
    from after that wait, not from when both were queued."""
    stamps: list[int] = []
    answered = signed_answer()

    async def slow_first(
        writer: asyncio.StreamWriter, headers: dict[str, str], body: bytes
    ) -> None:
        stamps.append(int(re.search(r"ts=(\d+)", headers["authorization"]).group(1)))  # type: ignore[union-attr]
        if len(stamps) == 1:
            await asyncio.sleep(2.2)
        await answered(writer, headers, body)

    async with Server(slow_first) as server:
        control = channel(server.port, per_job=1)
        try:
            await asyncio.gather(*(control.status(JOB, POD, "127.0.0.1") for _ in range(2)))
        finally:
            await control.close()
    assert len(stamps) == 2 and stamps[1] - stamps[0] >= 2, stamps


def test_a_pod_ip_that_is_not_an_address_is_never_sent() -> None:
    asyncio.run(_test_a_pod_ip_that_is_not_an_address_is_never_sent())


async def _test_a_pod_ip_that_is_not_an_address_is_never_sent() -> None:
    async with Server(signed_answer()) as server:
        control = channel(server.port)
        try:
            with pytest.raises(ControlError, match="is not an address"):
                await control.status(JOB, POD, "127.0.0.1\r\nX-Injected: 1")
        finally:
            await control.close()
    assert server.requests == 0
