"""A stand-in for the workers' supervisors (and the kubelet's readiness prober) of
simulate-mode pods, for benchmarking in-place gang restarts at hundreds of hosts.

Simulate-mode pods run no process, so nothing would answer the operator's control channel.
This stand-in runs in the benchmark's process (asyncio, no threads): for every Running pod
of the watched namespace that carries ``tpu-operator.dev/supervised=true`` it listens on
``<podIP>:contract.DEFAULT_CONTROL_PORT`` (every 127.x.y.z address is local on Linux) and
speaks the supervisor's protocol (``tpu_operator.supervision``): ``GET /readyz``, and the
HMAC-signed ``GET /v1/status``, ``POST /v1/stop``, ``POST /v1/start`` and
``POST /v1/checkpoint``, verified with ``supervision.Verifier`` for the pod's UID and the
job's key ``derive_job_key(master, job_uid)``, its answers signed. Its "training
process" is a state per pod with the real supervisor's rules (``tpu_worker.supervisor``):
a stop ends the process of that attempt or older at once (409 for a newer one); a start
runs the attempt unless that attempt or a newer one runs or ran (409 while an older one
still runs); a pod created while its job restarts in place (``TPU_OPERATOR_AWAIT_START``)
runs nothing until its start.

It also plays the kubelet's readiness prober for those pods: whenever a process starts or
ends it patches the pod's ``Ready`` and ``ContainersReady`` conditions (status
subresource, strategic merge, with ``lastTransitionTime``) and the worker container's
``ready``. It reacts at once, where a kubelet notices within one probe period (the
operator's probe: 1 s). Writes of one pod never overlap and coalesce: a pod whose process
stopped and started again before the first write went out gets no write at all, as a
prober that did not probe in between would report nothing. The simulate-mode node agent
writes a simulated pod's status only when it starts and when it ends, so these conditions
are not overwritten in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localcluster.agent.kube import STRATEGIC_PATCH, Kube
from localcluster.agent.status import now as stamp_now
from tpu_operator import contract
from tpu_operator import supervision as sv

log = logging.getLogger("standin")

WRITE_CONCURRENCY = 32
"""Readiness writes in flight at once (the node agent's writer uses 16 per agent)."""
_PIDS = itertools.count(1000)


@dataclass
class Process:
    """One pod's supervisor and its training process, as the stand-in keeps them."""

    namespace: str
    name: str
    uid: str
    ip: str
    job: str
    attempt: int
    pod: dict[str, Any]
    state: sv.State = "running"
    pid: int = field(default_factory=lambda: next(_PIDS))
    started_at: float = field(default_factory=time.time)
    exit_code: int | None = None
    exit_reason: str | None = None
    exited_at: float | None = None
    started: dict[int, float] = field(default_factory=dict)
    """Monotonic time each attempt's process started here."""
    server: asyncio.Server | None = None
    written_ready: bool = True
    """Readiness as last written (the node agent reports a simulated pod Ready at start)."""
    writing: bool = False
    held: bool = False
    """Stopped on the operator's command: readiness stays up until the next start, as the
    real supervisor's does (tpu_worker.supervisor.is_ready)."""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def ready(self) -> bool:
        return self.running or self.held

    def status(self) -> sv.SupervisorStatus:
        return sv.SupervisorStatus(
            state=self.state,
            attempt=self.attempt,
            pid=self.pid,
            started_at=self.started_at,
            exit_code=self.exit_code,
            exit_reason=self.exit_reason,
            exited_at=self.exited_at,
        )

    def end(self, code: int, reason: str) -> None:
        self.state, self.exit_code, self.exit_reason = "exited", code, reason
        self.exited_at = time.time()

    def begin(self, attempt: int) -> None:
        self.attempt, self.state, self.pid = attempt, "running", next(_PIDS)
        self.started_at, self.exit_code, self.exit_reason, self.exited_at = (
            time.time(), None, None, None,
        )  # fmt: skip
        self.started[attempt] = time.monotonic()
        self.held = False


def pod_attempt(pod: dict[str, Any]) -> int:
    """The attempt the pod's supervisor starts first (its env, as the real supervisor)."""
    for container in pod["spec"].get("containers") or []:
        if container.get("name") != contract.WORKER_CONTAINER:
            continue
        for env in container.get("env") or []:
            if env.get("name") == contract.ENV_RESTART_ATTEMPT:
                with contextlib.suppress(TypeError, ValueError):
                    return max(0, int(env.get("value") or 0))
    return 0


def awaits_start(pod: dict[str, Any]) -> bool:
    """The pod's supervisor waits for the operator's start (``contract.ENV_AWAIT_START``)."""
    for container in pod["spec"].get("containers") or []:
        if container.get("name") != contract.WORKER_CONTAINER:
            continue
        for env in container.get("env") or []:
            if env.get("name") == contract.ENV_AWAIT_START:
                return str(env.get("value") or "").lower() == "true"
    return False


def ready_patch(pod: dict[str, Any], ready: bool) -> dict[str, Any]:
    """The kubelet's status patch after a readiness probe changed its verdict."""
    since = stamp_now()
    value = "True" if ready else "False"
    conditions = []
    for kind in ("ContainersReady", "Ready"):
        condition: dict[str, Any] = {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": since,
        }
        if not ready:
            condition["reason"] = "ContainersNotReady"
            condition["message"] = f"containers with unready status: [{contract.WORKER_CONTAINER}]"
        conditions.append(condition)
    containers = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        status = dict(status)
        if status.get("name") == contract.WORKER_CONTAINER:
            status["ready"] = ready
        containers.append(status)
    body: dict[str, Any] = {"metadata": {"uid": pod["metadata"]["uid"]}, "status": {}}
    body["status"]["conditions"] = conditions
    if containers:
        body["status"]["containerStatuses"] = containers
    return body


@dataclass
class Event:
    """One thing the stand-in did or was asked (monotonic time)."""

    at: float
    kind: str
    """status, stop, start, checkpoint, refused, ready-true, ready-false, fail."""
    pod: str
    attempt: int


class StandIn:
    """Supervisors for every supervised simulated pod of one namespace."""

    def __init__(self, api: Kube, master_key: bytes, port: int = contract.DEFAULT_CONTROL_PORT):
        self.api = api
        self.master_key = master_key
        self.port = port
        self.procs: dict[str, Process] = {}
        self.keys: dict[str, bytes] = {}
        self.verifiers: dict[str, sv.Verifier] = {}
        """By pod UID."""
        self.job_uids: dict[str, str] = {}
        self.events: list[Event] = []
        self.errors: list[str] = []
        self._limit = asyncio.Semaphore(WRITE_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    # Jobs and pods ---------------------------------------------------------------------

    def register(self, job_name: str, job_uid: str) -> None:
        """The job whose pods are served (its key is derived from its UID)."""
        self.job_uids[job_name] = job_uid
        self.keys[job_name] = sv.derive_job_key(self.master_key, job_uid)

    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        """A watch event of a pod of the namespace (called by the benchmark's watch)."""
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self._forget(uid)
            return
        proc = self.procs.get(uid)
        if proc is not None:
            proc.pod = pod
            return
        annotations = meta.get("annotations") or {}
        status = pod.get("status") or {}
        if annotations.get(contract.ANNOTATION_SUPERVISED) != "true":
            return
        if status.get("phase") != "Running" or not status.get("podIP"):
            return
        job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME, "")
        proc = Process(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=uid,
            ip=status["podIP"],
            job=job,
            attempt=pod_attempt(pod),
            pod=pod,
        )
        if awaits_start(pod):  # created while its job restarts in place: no process yet
            proc.state, proc.attempt = "idle", 0
            self._readiness(proc)
        else:
            proc.started[proc.attempt] = time.monotonic()
        self.procs[uid] = proc
        self._spawn(self._listen(proc))

    def serving(self, job: str) -> int:
        """How many pods of ``job`` are listened for."""
        return sum(1 for p in self.procs.values() if p.job == job and p.server is not None)

    def of_job(self, job: str) -> list[Process]:
        return [p for p in self.procs.values() if p.job == job]

    async def wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while not check():
            if self.errors:
                raise RuntimeError(f"stand-in supervisor: {self.errors[0]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))

    def fail(self, name: str, exit_code: int = 1) -> float:
        """The training process of pod ``name`` exits with ``exit_code``; the monotonic time
        just before."""
        proc = next((p for p in self.procs.values() if p.name == name), None)
        if proc is None or not proc.running:
            raise LookupError(f"pod {name}: no running stand-in process")
        started = time.monotonic()
        proc.end(exit_code, "Exited")
        self._record("fail", proc)
        self._readiness(proc)
        return started

    async def close(self) -> None:
        for uid in list(self.procs):
            self._forget(uid)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _forget(self, uid: str) -> None:
        proc = self.procs.pop(uid, None)
        self.verifiers.pop(uid, None)
        if proc is not None and proc.server is not None:
            proc.server.close()
            proc.server = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record(self, kind: str, proc: Process, attempt: int | None = None) -> None:
        at = proc.attempt if attempt is None else attempt
        self.events.append(Event(time.monotonic(), kind, proc.name, at))
        self._changed.set()

    # Control channel -------------------------------------------------------------------

    async def _listen(self, proc: Process) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # Idle keep-alive connections are cancelled when the benchmark ends.
            with contextlib.suppress(asyncio.CancelledError):
                await self._connection(proc, reader, writer)

        try:
            server = await asyncio.start_server(handle, proc.ip, self.port, reuse_address=True)
        except OSError as exc:
            self.errors.append(f"cannot listen on {proc.ip}:{self.port} for {proc.name}: {exc}")
            self._changed.set()
            return
        if self.procs.get(proc.uid) is not proc:  # deleted while binding
            server.close()
            return
        proc.server = server
        self._changed.set()

    async def _connection(
        self, proc: Process, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:  # keep-alive: the operator's client reuses connections
                line = await reader.readline()
                if not line.strip():
                    return
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    raw = await reader.readline()
                    if raw in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = raw.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                path = target.split("?", 1)[0]
                code, payload, content_type, signature = self._answer(
                    proc, method, path, headers.get("authorization"), body
                )
                signed = f"{sv.ANSWER_HEADER}: {signature}\r\n" if signature else ""
                head = (
                    f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\n{signed}"
                    f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n"
                )
                writer.write(head.encode() + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    def _answer(
        self, proc: Process, method: str, path: str, auth: str | None, body: bytes
    ) -> tuple[int, bytes, str, str | None]:
        """The answer: code, body, content type and signature."""
        if method == "GET" and path == sv.READY_PATH:
            ok = proc.ready
            return (
                (200, b"ok", "text/plain", None)
                if ok
                else (503, b"not running", "text/plain", None)
            )
        if path not in sv.AUTHENTICATED_PATHS:
            error = json.dumps({"error": f"no such path {path!r}"}).encode()
            return 404, error, "application/json", None
        try:
            accepted = self._verifier(proc).verify(auth, method, path, body)
        except sv.AuthError as exc:
            self._record("refused", proc)
            return 401, json.dumps({"error": str(exc)}).encode(), "application/json", None
        try:
            code = self._command(proc, method, path, body)
        except sv.MessageError as exc:
            error = json.dumps({"error": str(exc)}).encode()
            return 400, error, "application/json", accepted.sign_answer(400, error)
        payload = proc.status().to_json()
        return code, payload, "application/json", accepted.sign_answer(code, payload)

    def _verifier(self, proc: Process) -> sv.Verifier:
        verifier = self.verifiers.get(proc.uid)
        if verifier is None:
            key = self.keys.get(proc.job)
            key_id = sv.key_id(key) if key else ""
            verifier = self.verifiers[proc.uid] = sv.Verifier(lambda: key, proc.uid, key_id)
        return verifier

    def _command(self, proc: Process, method: str, path: str, body: bytes) -> int:
        """Apply one authenticated command (the real supervisor's rules); the HTTP code."""
        if path == sv.STATUS_PATH and method == "GET":
            self._record("status", proc)
            return 200
        if method != "POST":
            return 405
        if path == sv.STOP_PATH:
            stop = sv.StopRequest.from_json(body)
            self._record("stop", proc, stop.attempt)
            if not proc.running:
                return 200
            if proc.attempt > stop.attempt:
                return 409
            proc.held = True
            proc.end(128 + 15, "Signaled: SIGTERM")
            self._readiness(proc)
            return 200
        if path == sv.START_PATH:
            start = sv.StartRequest.from_json(body)
            self._record("start", proc, start.attempt)
            if proc.attempt >= start.attempt:
                return 200
            if proc.running:
                return 409
            proc.begin(start.attempt)
            self._readiness(proc)
            return 200
        if path == sv.CHECKPOINT_PATH:
            request = sv.CheckpointRequest.from_json(body)
            self._record("checkpoint", proc, request.attempt)
            return 200 if proc.running and proc.attempt == request.attempt else 409
        return 404

    # Readiness -------------------------------------------------------------------------

    def _readiness(self, proc: Process) -> None:
        if not proc.writing and proc.ready != proc.written_ready:
            proc.writing = True
            self._spawn(self._write_ready(proc))

    async def _write_ready(self, proc: Process) -> None:
        path = f"/api/v1/namespaces/{proc.namespace}/pods/{proc.name}/status"
        try:
            while proc.ready != proc.written_ready and self.procs.get(proc.uid) is proc:
                ready = proc.ready
                async with self._limit:
                    await self.api.call(
                        "PATCH",
                        path,
                        ready_patch(proc.pod, ready),
                        content_type=STRATEGIC_PATCH,
                        ok=(404, 409),
                    )
                proc.written_ready = ready
                self._record("ready-true" if ready else "ready-false", proc)
        except Exception as exc:  # reported by wait(): the run stops
            self.errors.append(f"readiness write for {proc.name}: {exc!r}")
            self._changed.set()
        finally:
            proc.writing = False
