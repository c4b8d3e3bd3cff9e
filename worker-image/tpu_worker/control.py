"""The supervisor's control server: HTTP on the pod IP and the control port.

``GET /readyz`` is open (it answers only "ok" or "not running"); every other path needs a
request signed with the job's control key for this pod (``tpu_operator.supervision``),
and the answers to those are signed in turn. A refused request changes nothing and is
logged (at most one line per second, with a count of the refusals in between). Bodies
over ``MAX_BODY_BYTES`` are refused with 413.

Bounded against clients that never finish a request (slow-loris): one request per
connection, at most ``MAX_HEAD_BYTES`` of request line and headers, ``READ_TIMEOUT_S``
between reads and ``REQUEST_DEADLINE_S`` to send the whole request, and at most
``MAX_CONNECTIONS`` connections at once. A new connection beyond that closes the oldest
one still sending its request, so the kubelet's readiness probe (a whole request at once)
is answered under a flood of half-sent requests.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from tpu_operator import supervision as sv

log = logging.getLogger("tpu_worker.supervisor")

REFUSAL_LOG_INTERVAL_S = 1.0
MAX_CONNECTIONS = 64
"""Connections open at once; a new one beyond closes the oldest still sending."""
READ_TIMEOUT_S = 5.0
"""Longest wait for the next bytes of a request."""
REQUEST_DEADLINE_S = 10.0
"""Longest time to send a whole request (then the connection is closed)."""
MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers, at most."""


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
        timeout = READ_TIMEOUT_S
        server: _Server
        accepted: sv.Accepted | None = None
        bounded: _Bounded

        def setup(self) -> None:
            super().setup()
            self.rfile = self.bounded = _Bounded(self.rfile, MAX_HEAD_BYTES)

        def handle(self) -> None:
            self.handle_one_request()  # one request per connection

        def _read(self) -> None:
            """The request is in: this connection is no longer one still sending."""
            self.server.read_done(self.request)

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.accepted is not None:
                self.send_header(sv.ANSWER_HEADER, self.accepted.sign_answer(code, body))
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
            self.bounded.allow(length)
            body = self.rfile.read(length) if length else b""
            if len(body) != length:
                self.close_connection = True
                return None  # the client went away, or took too long
            self._read()
            return body

        def _authentic(self, method: str, path: str, body: bytes) -> bool:
            try:
                self.accepted = verifier.verify(
                    self.headers.get("Authorization"), method, path, body
                )
            except sv.AuthError as error:
                refusals.refused(self.client_address[0], method, path, str(error))
                self._error(401, str(error))
                return False
            return True

        def do_GET(self) -> None:
            self._read()
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


class _Bounded(io.BufferedIOBase):
    """A request's input stream that ends after ``limit`` bytes (the request line and
    headers), then after the body's length once it is allowed: a bound on the memory one
    connection can make the server hold."""

    def __init__(self, raw: io.BufferedIOBase, limit: int) -> None:
        super().__init__()
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        return True

    def allow(self, size: int) -> None:
        """From now on, ``size`` more bytes (the body)."""
        self._left = size

    def _room(self, size: int | None) -> int:
        return self._left if size is None or size < 0 else min(size, self._left)

    def readline(self, size: int | None = -1, /) -> bytes:
        room = self._room(size)
        line = self._raw.readline(room) if room > 0 else b""
        self._left -= len(line)
        return line

    def read(self, size: int | None = -1, /) -> bytes:
        room = self._room(size)
        data = self._raw.read(room) if room > 0 else b""
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` of them; connections still
    sending their request are closed past ``deadline_s``, or the oldest first when a new
    one would exceed the cap."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, *args: Any, max_connections: int, deadline_s: float, **kwargs: Any):
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._sending: OrderedDict[socket.socket, float] = OrderedDict()
        """Connections still sending their request, oldest first, with their start."""
        self.evicted = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            while len(self._open) >= self.max_connections and self._sending:
                self._evict(next(iter(self._sending)))
            full = len(self._open) >= self.max_connections
            if not full:
                self._open.add(request)
                self._sending[request] = now
        if full:  # every connection is being answered: this one waits for none of them
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def read_done(self, request: socket.socket) -> None:
        with self._lock:
            self._sending.pop(request, None)

    def service_actions(self) -> None:  # serve_forever's loop, every poll interval
        with self._lock:
            self._expire(time.monotonic())

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.discard(request)
            self._sending.pop(request, None)
        super().shutdown_request(request)

    def _expire(self, now: float) -> None:
        while self._sending:
            oldest, started = next(iter(self._sending.items()))
            if now - started < self.deadline_s:
                return
            self._evict(oldest)

    def _evict(self, request: socket.socket) -> None:
        """Close a connection still sending its request (its thread then sees the end)."""
        self._sending.pop(request, None)
        self._open.discard(request)
        self.evicted += 1
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_RDWR)


class ControlServer:
    """The running control endpoint; ``close()`` stops it."""

    def __init__(
        self,
        controller: Controller,
        verifier: sv.Verifier,
        address: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        server_class = _Server
        if ":" in address:

            class _Server6(_Server):
                address_family = socket.AF_INET6

            server_class = _Server6
        handler = _handler(controller, verifier, _RefusalLog())
        self._server = server_class(
            (address, port), handler, max_connections=max_connections, deadline_s=deadline_s
        )
        self.address, self.port = address, int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="tpu-worker-control",
            daemon=True,
        )
        self._thread.start()
        log.info("serving the control channel on %s:%d", address, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
