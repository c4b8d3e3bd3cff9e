"""The supervisor's control server: HTTP on the pod IP and the control port.

``GET /readyz`` is open (it answers only "ok" or "not running"); every other path needs a
request signed with the job's control key (``tpu_operator.supervision``). A refused
request changes nothing and is logged (at most one line per second, with a count of the
refusals in between). Bodies over ``MAX_BODY_BYTES`` are refused with 413.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from tpu_operator import supervision as sv

log = logging.getLogger("tpu_worker.supervisor")

REFUSAL_LOG_INTERVAL_S = 1.0


class Controller(Protocol):
    """What the control server asks of the supervisor; each returns (HTTP code, status)."""

    def ready(self) -> bool: ...

    def status(self) -> sv.SupervisorStatus: ...

    def stop(self, request: sv.StopRequest) -> tuple[int, sv.SupervisorStatus]: ...

    def start(self, request: sv.StartRequest) -> tuple[int, sv.SupervisorStatus]: ...

    def checkpoint(self, request: sv.CheckpointRequest) -> tuple[int, sv.SupervisorStatus]: ...


def key_loader(path: Path) -> Callable[[], bytes | None]:
    """Read the key file, again only when it changed (a Secret volume is updated in place
    by swapping a symlink: the stat of the resolved file changes). None: no key."""
    cache: dict[str, object] = {}
    lock = threading.Lock()

    def load() -> bytes | None:
        try:
            stat = path.stat()
        except OSError:
            return None
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with lock:
            if cache.get("stamp") != stamp:
                try:
                    cache["key"] = path.read_bytes() or None
                except OSError:
                    return None
                cache["stamp"] = stamp
            return cache["key"]  # type: ignore[return-value]

    return load


class _RefusalLog:
    """One log line per interval for refused requests; the rest are counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0.0
        self._suppressed = 0

    def refused(self, client: str, method: str, path: str, reason: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < REFUSAL_LOG_INTERVAL_S:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        more = f" ({suppressed} more refused since the last line)" if suppressed else ""
        log.warning("refused %s %s from %s: %s%s", method, path, client, reason, more)


_POSTS: dict[str, type[sv.StopRequest] | type[sv.StartRequest] | type[sv.CheckpointRequest]] = {
    sv.STOP_PATH: sv.StopRequest,
    sv.START_PATH: sv.StartRequest,
    sv.CHECKPOINT_PATH: sv.CheckpointRequest,
}


def _handler(
    controller: Controller, verifier: sv.Verifier, refusals: _RefusalLog
) -> type[BaseHTTPRequestHandler]:
    class ControlHandler(BaseHTTPRequestHandler):
        server_version = "tpu-worker-supervisor"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def _error(self, code: int, message: str) -> None:
            self._send(code, json.dumps({"error": message}).encode())

        def _status(self, code: int, status: sv.SupervisorStatus) -> None:
            self._send(code, status.to_json())

        def _body(self) -> bytes | None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._error(400, "bad Content-Length")
                return None
            if length < 0 or length > sv.MAX_BODY_BYTES:
                self._error(413, f"body over {sv.MAX_BODY_BYTES} bytes")
                return None
            return self.rfile.read(length) if length else b""

        def _authentic(self, method: str, path: str, body: bytes) -> bool:
            try:
                verifier.verify(self.headers.get("Authorization"), method, path, body)
            except sv.AuthError as error:
                refusals.refused(self.client_address[0], method, path, str(error))
                self._error(401, str(error))
                return False
            return True

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == sv.READY_PATH:
                ready = controller.ready()
                self._send(200 if ready else 503, b"ok" if ready else b"not running", "text/plain")
                return
            if path != sv.STATUS_PATH:
                self._error(404, f"no such path {path!r}")
                return
            if self._authentic("GET", path, b""):
                self._status(200, controller.status())

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            kind = _POSTS.get(path)
            if kind is None:
                self._error(404, f"no such path {path!r}")
                return
            body = self._body()
            if body is None or not self._authentic("POST", path, body):
                return
            try:
                request = kind.from_json(body)
            except sv.MessageError as error:
                self._error(400, str(error))
                return
            if isinstance(request, sv.StopRequest):
                code, status = controller.stop(request)
            elif isinstance(request, sv.StartRequest):
                code, status = controller.start(request)
            else:
                code, status = controller.checkpoint(request)
            self._status(code, status)

        def log_message(self, format: str, *args: object) -> None:
            pass  # readiness probes every second would drown the log

    return ControlHandler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class ControlServer:
    """The running control endpoint; ``close()`` stops it."""

    def __init__(
        self, controller: Controller, verifier: sv.Verifier, address: str, port: int
    ) -> None:
        server_class = _Server
        if ":" in address:

            class _Server6(_Server):
                address_family = socket.AF_INET6

            server_class = _Server6
        handler = _handler(controller, verifier, _RefusalLog())
        self._server = server_class((address, port), handler)
        self.address, self.port = address, int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tpu-worker-control", daemon=True
        )
        self._thread.start()
        log.info("serving the control channel on %s:%d", address, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
