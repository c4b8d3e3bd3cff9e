"""The operator's end of the control channel to the workers' supervisors.

Every request is signed with the job's key for one pod (``tpu_operator.supervision``:
HMAC over the method, path, the pod's UID, time, a nonce and the body; the key never
crosses the network) and sent to the pod IP and control port. Its answer counts only if
the supervisor signed it for that request: anything else on the pod's address (a pod that
took over a reused IP, a process on a hostNetwork node) cannot say a process stopped.

Bounded against supervisors that misbehave: every request has a timeout (a stop too: the
supervisor answers it within ``supervision.STOP_ANSWER_WAIT_S``, with state ``stopping``
if the process has not ended yet); answers are read up to ``MAX_ANSWER_BYTES`` and cut
there, never decompressed and never followed to a redirect; requests in flight are
bounded per job (``PER_JOB``) and in total (``CONCURRENCY``), so one job's pods that never
answer hold at most a share of the channel. Commands are idempotent on the supervisor's
side (``stop`` for N stops nothing newer, ``start`` for N does nothing once N runs), so a
reconcile that is cut short simply sends them again.

The requests are plain HTTP/1.1 written on a connection of their own (asyncio streams),
one request per connection, answered with a ``Content-Length`` or up to the close, as the
supervisor (``tpu_worker.control``) answers. A general HTTP client (aiohttp) costs about
twice the CPU per request (connection pooling, cookies, URL handling, none of which this
channel uses), and a restart of a 4,096-host job sends over 8,000 of them
(bench/HISTORY.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tpu_operator import contract, supervision

log = logging.getLogger(__name__)
X = TypeVar("X")
R = TypeVar("R")

CONCURRENCY = 128
"""Requests in flight at once, over all jobs (a 1,024-host restart sends 2 per pod)."""
PER_JOB = 64
"""Requests in flight at once for one job: one job's supervisors, answering or not, never
hold more than half of the channel."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""Any request, from connecting to the last byte of the answer."""
MAX_ANSWER_BYTES = supervision.MAX_BODY_BYTES
"""An answer's body, at most (a status is under 16 KiB); a longer one is cut and refused."""
KEY_BYTES = 32


class ControlError(Exception):
    """A supervisor could not be asked, or refused: ``conflict`` for its 409 guards."""

    def __init__(
        self, message: str, *, status: int | None = None, state: ProcessState | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.state = state
        """The supervisor's status, when it refused with one (409)."""

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclass(frozen=True)
class ProcessState:
    """A supervisor's answer: the state of its training process."""

    state: str
    """running, stopping, exited or idle."""
    attempt: int
    exit_code: int | None = None
    exit_reason: str | None = None
    exited_at: float | None = None

    @classmethod
    def parse(cls, raw: object) -> ProcessState:
        if not isinstance(raw, dict):
            raise ControlError(f"the supervisor answered {type(raw).__name__}, not an object")
        state, attempt = raw.get("state"), raw.get("attempt")
        if not isinstance(state, str) or not isinstance(attempt, int):
            raise ControlError(
                f"the supervisor's answer lacks state/attempt: {printable(repr(raw))}"
            )
        code = raw.get("exit_code")
        reason = raw.get("exit_reason")
        exited = raw.get("exited_at")
        return cls(
            state=state,
            attempt=attempt,
            exit_code=code if isinstance(code, int) else None,
            exit_reason=printable(reason, 100) if isinstance(reason, str) else None,
            exited_at=float(exited) if isinstance(exited, int | float) else None,
        )

    @property
    def running(self) -> bool:
        return self.state in ("running", "stopping")


def printable(text: str, limit: int = 200) -> str:
    """``text`` from a pod, fit for a log line or a status message: printable ASCII only,
    at most ``limit`` characters."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text.strip()[: limit + 1])
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."


@dataclass(frozen=True)
class Answer:
    """An HTTP answer as read within the bounds: its code, signature and (whole) body."""

    status: int
    signature: str | None
    body: bytes


ANSWER_LINE_BYTES = 8192
"""The status line or one header line of an answer, at most."""
ANSWER_HEADERS = 64
"""Header lines of an answer, at most."""


async def read_answer(reader: asyncio.StreamReader, limit: int) -> Answer:
    """One HTTP/1.1 answer from ``reader``: its body refused (ControlError) once it passes
    ``limit`` bytes, whatever Content-Length says; compressed bodies are refused unread.
    A body without a Content-Length is read up to the close (framing, such as chunks,
    stays in it and fails the signature)."""
    line = await reader.readline()
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ControlError(f"not an HTTP answer: {printable(line.decode('latin-1'), 80)!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for _ in range(ANSWER_HEADERS + 1):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    else:
        raise ControlError(f"the answer has over {ANSWER_HEADERS} header lines; not read")
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding not in ("", "identity"):
        raise ControlError(f"the answer is compressed ({printable(encoding, 40)}); not read")
    signature = headers.get(supervision.ANSWER_HEADER.lower())
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ControlError(f"the answer's Content-Length is {printable(declared, 40)!r}")
        if int(declared) > limit:
            raise ControlError(
                f"the answer has {declared} bytes, over the {limit}-byte cap; not read"
            )
        return Answer(status, signature, await reader.readexactly(int(declared)))
    data = await reader.read(limit + 1)
    while data and len(data) <= limit:
        more = await reader.read(limit + 1 - len(data))
        if not more:
            break
        data += more
    if len(data) > limit:
        raise ControlError(f"the answer passed the {limit}-byte cap; cut there")
    return Answer(status, signature, data)


def load_master_key(path: str | None) -> bytes:
    """The operator's master key (every job's key is derived from it): the file's bytes,
    else a random key for this process, with a warning (in-place restarts after an
    operator restart then fall back to recreating pods: the supervisors hold old keys)."""
    if path:
        key = Path(path).read_bytes().strip()
        if len(key) < 16:
            raise SystemExit(f"--control-key-file {path}: the key must have at least 16 bytes")
        return key
    log.warning(
        "no --control-key-file: using a random control key for this process; after an "
        "operator restart, running jobs restart by recreating pods rather than in place"
    )
    return secrets.token_bytes(KEY_BYTES)


async def fan_out(
    items: Sequence[X], call: Callable[[X], Awaitable[R]], limit: int = PER_JOB
) -> list[R | Exception]:
    """``call`` on every item, ``limit`` at a time (by that many workers, not a task per
    item), the results in the items' order with an exception in place of a result, as
    ``asyncio.gather(..., return_exceptions=True)`` gives them; cancellation propagates.
    One job's requests are bounded by ``PER_JOB`` anyway: a task per pod only queued on
    the channel's semaphore, and a restart of 4,096 pods made 4,096 tasks (about 0.2 s at
    4,096 hosts) before its first request went out."""
    results: list[R | Exception] = [RuntimeError("not called")] * len(items)
    pending = iter(range(len(items)))

    async def worker() -> None:
        for index in pending:
            try:
                results[index] = await call(items[index])
            except Exception as exc:  # handed to the caller, as gather hands it
                results[index] = exc

    await asyncio.gather(*(worker() for _ in range(min(limit, len(items)))))
    return results


class ControlChannel:
    """Signed requests to supervisors, a connection each; bounded concurrency."""

    def __init__(
        self,
        master_key: bytes,
        *,
        concurrency: int = CONCURRENCY,
        per_job: int = PER_JOB,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        port: int = contract.DEFAULT_CONTROL_PORT,
    ) -> None:
        self.master_key = master_key
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.port = port
        self._limit = asyncio.Semaphore(concurrency)
        self._per_job = per_job
        self._jobs: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}
        """Per job: its semaphore and how many requests use it (dropped at 0)."""

    def key_for(self, job_uid: str) -> bytes:
        return supervision.derive_job_key(self.master_key, job_uid)

    async def close(self) -> None:
        """Nothing is kept open between requests; here for the owner's shutdown."""

    @contextlib.asynccontextmanager
    async def _slot(self, job_uid: str) -> AsyncIterator[None]:
        """A place among the job's requests, then among all (a job waiting for its own
        share holds none of the others')."""
        entry = self._jobs.get(job_uid)
        if entry is None:
            entry = self._jobs[job_uid] = (asyncio.Semaphore(self._per_job), [0])
        semaphore, users = entry
        users[0] += 1
        try:
            async with semaphore, self._limit:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._jobs[job_uid]

    async def _request(
        self,
        job_uid: str,
        pod_uid: str,
        pod_ip: str | None,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
    ) -> ProcessState:
        if not pod_ip:
            raise ControlError("the pod has no IP")
        if not pod_uid:
            raise ControlError("the pod has no UID")
        try:  # it goes into the request's Host line: nothing but an address
            ipaddress.ip_address(pod_ip)
        except ValueError:
            raise ControlError(
                f"the pod's IP {printable(pod_ip, 60)!r} is not an address"
            ) from None
        body = json.dumps(payload).encode() if payload is not None else b""
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"http://{host}:{self.port}{path}"
        key = self.key_for(job_uid)
        async with self._slot(job_uid):
            # Signed once its turn came, not when queued: a supervisor takes a timestamp
            # within 30 s, and a restart of thousands of pods queues thousands of commands.
            nonce = supervision.new_nonce()
            authorization = supervision.sign(key, method, path, body, pod=pod_uid, nonce=nonce)
            request = (
                f"{method} {path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
                f"Authorization: {authorization}\r\nContent-Type: application/json\r\n"
                f"Accept-Encoding: identity\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode("latin-1") + body
            try:
                async with asyncio.timeout(self.timeout):
                    answer = await self._send(pod_ip, request)
            except ControlError as exc:
                raise ControlError(f"{method} {url}: {exc}") from None
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                what = f"{type(exc).__name__}: {printable(str(exc))}".rstrip(": ")
                if isinstance(exc, TimeoutError):
                    what = f"no answer within {self.timeout:g} s"
                raise ControlError(f"{method} {url}: {what}") from None
        return self._parse(key, pod_uid, nonce, method, url, answer)

    async def _send(self, ip: str, request: bytes) -> Answer:
        """Write ``request`` on a new connection to the pod, read the answer, close."""
        reader, writer = await asyncio.open_connection(ip, self.port, limit=ANSWER_LINE_BYTES)
        done = False
        try:
            writer.write(request)
            answer = await read_answer(reader, self.max_answer_bytes)
            done = True
            return answer
        finally:
            if done:
                writer.close()
            else:  # cut short (timeout, cap, a bad answer): drop it at once
                writer.transport.abort()

    def _parse(
        self, key: bytes, pod_uid: str, nonce: str, method: str, url: str, answer: Answer
    ) -> ProcessState:
        where = f"{method} {url}"
        if answer.status not in (200, 409):
            text = printable(answer.body.decode("utf-8", "replace"))
            raise ControlError(f"{where}: HTTP {answer.status}: {text}", status=answer.status)
        try:
            supervision.verify_answer(
                key,
                pod_uid,
                nonce,
                answer.status,
                answer.body,
                answer.signature,
            )
        except supervision.AuthError as exc:
            raise ControlError(
                f"{where}: HTTP {answer.status} not from the pod's supervisor: {exc}"
            ) from None
        try:
            state = ProcessState.parse(json.loads(answer.body))
        except ValueError as exc:
            raise ControlError(f"{where}: the answer is not JSON: {printable(str(exc))}") from None
        if answer.status == 409:
            raise ControlError(
                f"{where}: HTTP 409: refused in state {state.state} of attempt {state.attempt}",
                status=409,
                state=state,
            )
        return state

    async def status(self, job_uid: str, pod_uid: str, pod_ip: str | None) -> ProcessState:
        return await self._request(job_uid, pod_uid, pod_ip, "GET", supervision.STATUS_PATH, None)

    async def stop(
        self, job_uid: str, pod_uid: str, pod_ip: str | None, attempt: int, grace: float
    ) -> ProcessState:
        """Stop the process of ``attempt`` or older; the answer says ``stopping`` while it
        still runs (ask again)."""
        payload = {"attempt": attempt, "grace_seconds": grace}
        return await self._request(job_uid, pod_uid, pod_ip, "POST", supervision.STOP_PATH, payload)

    async def start(
        self, job_uid: str, pod_uid: str, pod_ip: str | None, attempt: int, env: dict[str, str]
    ) -> ProcessState:
        try:
            allowed = supervision.check_start_env(env, attempt)
        except supervision.MessageError as exc:
            raise ControlError(str(exc)) from None
        payload = {"attempt": attempt, "env": allowed}
        return await self._request(
            job_uid, pod_uid, pod_ip, "POST", supervision.START_PATH, payload
        )

    async def checkpoint(
        self, job_uid: str, pod_uid: str, pod_ip: str | None, attempt: int, request_id: str
    ) -> ProcessState:
        payload = {"attempt": attempt, "id": request_id}
        return await self._request(
            job_uid, pod_uid, pod_ip, "POST", supervision.CHECKPOINT_PATH, payload
        )
