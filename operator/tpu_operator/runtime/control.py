"""The operator's end of the control channel to the workers' supervisors (aiohttp).

Every request is signed with the job's key (``tpu_operator.supervision``: HMAC over the
method, path, time, a nonce and the body; the key never crosses the network), sent to the
pod IP and control port, bounded in concurrency across all jobs and in time per request.
Commands are idempotent on the supervisor's side (``stop`` for attempt N stops nothing
newer, ``start`` for N does nothing once N runs), so a reconcile that is cut short simply
sends them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tpu_operator import contract, supervision

log = logging.getLogger(__name__)

CONCURRENCY = 64
"""Requests in flight at once, over all jobs (a 1,024-host restart sends 2 per pod)."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""A status or start request; a stop may take the worker's termination grace on top."""
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
            raise ControlError(f"the supervisor's answer lacks state/attempt: {raw!r:.200}")
        code = raw.get("exit_code")
        reason = raw.get("exit_reason")
        exited = raw.get("exited_at")
        return cls(
            state=state,
            attempt=attempt,
            exit_code=code if isinstance(code, int) else None,
            exit_reason=reason if isinstance(reason, str) else None,
            exited_at=float(exited) if isinstance(exited, int | float) else None,
        )

    @property
    def running(self) -> bool:
        return self.state in ("running", "stopping")


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


class ControlChannel:
    """Signed requests to supervisors; one aiohttp session, bounded concurrency."""

    def __init__(
        self,
        master_key: bytes,
        *,
        concurrency: int = CONCURRENCY,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self.master_key = master_key
        self.timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None

    def key_for(self, job_uid: str) -> bytes:
        return supervision.derive_job_key(self.master_key, job_uid)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self,
        job_uid: str,
        pod_ip: str | None,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
        seconds: float,
    ) -> ProcessState:
        if not pod_ip:
            raise ControlError("the pod has no IP")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), trust_env=False
            )
        body = json.dumps(payload).encode() if payload is not None else b""
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"http://{host}:{contract.DEFAULT_CONTROL_PORT}{path}"
        headers = {
            "Authorization": supervision.sign(self.key_for(job_uid), method, path, body),
            "Content-Type": "application/json",
        }
        async with self._limit:
            try:
                async with self._session.request(
                    method,
                    url,
                    data=body or None,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=seconds),
                ) as response:
                    text = await response.text()
                    if response.status == 200:
                        return ProcessState.parse(json.loads(text))
                    state = None
                    if response.status == 409:
                        with contextlib.suppress(ValueError, ControlError):
                            state = ProcessState.parse(json.loads(text))
                    raise ControlError(
                        f"{method} {path}: HTTP {response.status}: {text.strip()[:200]}",
                        status=response.status,
                        state=state,
                    )
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
                raise ControlError(
                    f"{method} {url}: {type(exc).__name__}: {exc}".rstrip(": ")
                ) from None

    async def status(self, job_uid: str, pod_ip: str | None) -> ProcessState:
        return await self._request(
            job_uid, pod_ip, "GET", supervision.STATUS_PATH, None, self.timeout
        )

    async def stop(
        self, job_uid: str, pod_ip: str | None, attempt: int, grace: float
    ) -> ProcessState:
        payload = {"attempt": attempt, "grace_seconds": grace}
        return await self._request(
            job_uid, pod_ip, "POST", supervision.STOP_PATH, payload, self.timeout + grace
        )

    async def start(
        self, job_uid: str, pod_ip: str | None, attempt: int, env: dict[str, str]
    ) -> ProcessState:
        payload = {"attempt": attempt, "env": env}
        return await self._request(
            job_uid, pod_ip, "POST", supervision.START_PATH, payload, self.timeout
        )

    async def checkpoint(
        self, job_uid: str, pod_ip: str | None, attempt: int, request_id: str
    ) -> ProcessState:
        payload = {"attempt": attempt, "id": request_id}
        return await self._request(
            job_uid, pod_ip, "POST", supervision.CHECKPOINT_PATH, payload, self.timeout
        )
