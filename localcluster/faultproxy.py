"""A fault-injecting proxy between one client and the kube-apiserver (off by default).

The proxy listens on plain HTTP on 127.0.0.1 and forwards every request to the real
kube-apiserver with the credentials of an upstream kubeconfig (the client's own: the
admin kubeconfig of the local cluster by default); a client is pointed at it with the
kubeconfig the proxy writes (``server: http://127.0.0.1:<port>``, no credentials). Watch
responses are streamed event by event. On a seeded schedule (``random.Random(seed)``, a
rate per fault kind) it answers instead of the apiserver:

- ``throttle``: 429 Too Many Requests with ``Retry-After`` and a ``TooManyRequests``
  Status, as API Priority and Fairness rejects a request;
- ``internal``: 500 with an ``InternalError`` Status;
- ``unavailable``: 503 with a ``ServiceUnavailable`` Status;
- ``reset``: the connection is closed without an answer (half of the time after the
  request reached the apiserver, so a create or delete may have happened unseen); for a
  watch, the stream is cut after a few seconds;
- ``expire`` (watches only): after a few seconds an ``ERROR`` event with a 410 Gone
  ``Expired`` Status, then the end of the stream: the client must list again.

``storm(kind, seconds)`` makes every request fail with one kind for a while (a 429 storm).
Per-second request counts by verb and resource and every injected fault are served as
JSON at ``/_faultproxy/stats`` and by :meth:`FaultProxy.stats`.

The schedule's decisions are a reproducible sequence for a seed; which request meets which
decision depends on the order in which concurrent requests arrive.

Usable as a context manager (a thread with its own event loop) and as
``python -m localcluster faultproxy`` (see ``docs/contributing/localcluster.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from localcluster import kubeconfig as kubeconfigs

FAULT_KINDS = ("throttle", "internal", "unavailable", "reset", "expire")
"""Every fault the proxy injects (``expire`` applies to watches only)."""
STATS_PATH = "/_faultproxy/stats"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
    }
)


# Pure parts: the schedule, request classification, Status bodies --------------------


@dataclass(frozen=True)
class Rates:
    """Probability per request of each fault kind (their sum must be at most 1)."""

    throttle: float = 0.0
    internal: float = 0.0
    unavailable: float = 0.0
    reset: float = 0.0
    expire: float = 0.0
    retry_after: int = 1
    """Seconds in the ``Retry-After`` header of a 429."""
    watch_delay: tuple[float, float] = (1.0, 8.0)
    """A watch's reset or expiry comes after a delay drawn from this range (seconds)."""

    def __post_init__(self) -> None:
        total = sum(getattr(self, kind) for kind in FAULT_KINDS)
        if any(getattr(self, kind) < 0 for kind in FAULT_KINDS) or total > 1:
            raise ValueError(
                f"fault rates must be >= 0 and sum to at most 1, got {self.describe()}"
            )

    def describe(self) -> str:
        return ", ".join(f"{kind}={getattr(self, kind):g}" for kind in FAULT_KINDS)


@dataclass(frozen=True)
class Fault:
    """One decision of the schedule for one request."""

    kind: str
    delay: float = 0.0
    """Watches: seconds of streaming before a reset or an expiry."""
    forward_first: bool = False
    """Resets of plain requests: the request reaches the apiserver before the reset."""
    retry_after: int = 1


@dataclass(frozen=True)
class RequestKind:
    """A request as the apiserver's audit and metrics name it."""

    verb: str
    resource: str
    watch: bool

    @property
    def label(self) -> str:
        return f"{self.verb} {self.resource}"


def classify(method: str, path: str, query: Mapping[str, list[str]]) -> RequestKind:
    """The verb (get/list/watch/create/update/patch/delete/deletecollection) and resource
    (``pods``, ``pods/status``, ``tpujobs``...) of a request; non-resource paths keep
    their path as resource."""
    parts = [p for p in path.split("/") if p]
    watch = query.get("watch", [""])[0].lower() in ("true", "1")
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return RequestKind(method.lower(), path, False)
    if rest[:1] == ["watch"]:
        watch, rest = True, rest[1:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # a namespaced resource (a namespace itself is rest == [ns, name])
    if not rest:
        return RequestKind(method.lower(), path, False)
    resource, named = rest[0], len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "GET":
        verb = "watch" if watch else ("get" if named else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = verbs.get(method, method.lower())
    return RequestKind(verb, resource, watch)


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A ``metav1.Status`` failure as the apiserver sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def fault_response(fault: Fault) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status code, extra headers and Status body of an answering fault."""
    if fault.kind == "throttle":
        # What API Priority and Fairness answers when a priority level's queues are full.
        return (
            429,
            {"Retry-After": str(fault.retry_after)},
            status_body(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                retryAfterSeconds=fault.retry_after,
            ),
        )
    if fault.kind == "internal":
        return (
            500,
            {},
            status_body(
                500,
                "InternalError",
                "Internal error occurred: injected by the fault proxy",
                causes=[{"message": "injected by the fault proxy"}],
            ),
        )
    if fault.kind == "unavailable":
        return (
            503,
            {},
            status_body(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle"
                " the request (injected by the fault proxy)",
            ),
        )
    raise ValueError(f"a {fault.kind} fault has no response")


def expired_event(resource_version: str = "1") -> bytes:
    """A watch's ``ERROR`` event for a resourceVersion the watch cache no longer holds."""
    status = status_body(410, "Expired", f"too old resource version: {resource_version} (injected)")
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


class Schedule:
    """Seeded fault decisions; thread-safe (tests change rates from their own thread)."""

    def __init__(self, seed: int, rates: Rates | None = None) -> None:
        self.seed = seed
        self.rates = rates or Rates()
        self._random = random.Random(seed)
        self._storm: tuple[str, float, int] | None = None
        self._lock = threading.Lock()

    def set_rates(self, rates: Rates) -> None:
        with self._lock:
            self.rates = rates

    def storm(self, kind: str, until: float, retry_after: int = 1) -> None:
        """Every request fails with ``kind`` until the monotonic time ``until``."""
        if kind not in ("throttle", "internal", "unavailable", "reset"):
            raise ValueError(f"no storm of {kind!r}")
        with self._lock:
            self._storm = (kind, until, retry_after)

    def decide(self, request: RequestKind, now: float) -> Fault | None:
        with self._lock:
            rates = self.rates
            if self._storm is not None:
                kind, until, retry_after = self._storm
                if now < until:
                    return Fault(kind, retry_after=retry_after)
                self._storm = None
            draw = self._random.random()
            low, high = rates.watch_delay
            delay = self._random.uniform(low, high)
            forward_first = self._random.random() < 0.5
        edge = 0.0
        for kind in FAULT_KINDS:
            if kind == "expire" and not request.watch:
                continue
            edge += getattr(rates, kind)
            if draw < edge:
                return Fault(
                    kind,
                    delay=delay if request.watch else 0.0,
                    forward_first=forward_first and kind == "reset" and not request.watch,
                    retry_after=rates.retry_after,
                )
        return None


@dataclass
class Stats:
    """Requests per second (by ``verb resource``) and every injected fault."""

    started: float = field(default_factory=time.monotonic)
    per_second: dict[int, Counter[str]] = field(default_factory=dict)
    injected: list[dict[str, Any]] = field(default_factory=list)

    def request(self, request: RequestKind, now: float) -> None:
        second = int(now - self.started)
        self.per_second.setdefault(second, Counter())[request.label] += 1

    def fault(self, request: RequestKind, fault: Fault, now: float) -> None:
        self.injected.append(
            {"at": round(now - self.started, 3), "request": request.label, **asdict(fault)}
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "per_second": {str(s): dict(c) for s, c in sorted(self.per_second.items())},
            "injected": list(self.injected),
        }


def rate(stats: Mapping[str, Any], start: float, end: float) -> float:
    """Requests per second over the proxy seconds ``[start, end)`` of a stats snapshot."""
    seconds = range(int(start), int(end))
    total = sum(sum(stats["per_second"].get(str(s), {}).values()) for s in seconds)
    return total / max(1, len(seconds))


# The proxy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    """Where and as whom the proxy forwards: read from a kubeconfig's current context."""

    server: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Upstream:
        config = yaml.safe_load(path.read_text())
        context_name = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(
            (
                u.get("user") or {}
                for u in config.get("users") or []
                if u["name"] == context.get("user")
            ),
            {},
        )
        return cls(
            server=cluster["server"].rstrip("/"),
            ca=cluster.get("certificate-authority"),
            cert=user.get("client-certificate"),
            key=user.get("client-key"),
            token=user.get("token"),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=self.ca)
        if self.cert and self.key:
            context.load_cert_chain(self.cert, self.key)
        return context


def client_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig that points a client at the proxy (which adds the credentials)."""
    config = yaml.safe_load(kubeconfigs.render(server, Path("/"), Path("/"), Path("/"), "proxy"))
    config["clusters"][0]["cluster"] = {"server": server}
    config["users"][0]["user"] = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class FaultProxy:
    """The proxy in a thread of its own: ``with FaultProxy(...) as proxy: proxy.kubeconfig``."""

    def __init__(
        self,
        upstream_kubeconfig: Path,
        kubeconfig: Path,
        *,
        seed: int,
        rates: Rates | None = None,
        port: int = 0,
    ) -> None:
        self.upstream = Upstream.from_kubeconfig(upstream_kubeconfig)
        self.kubeconfig = kubeconfig
        self.schedule = Schedule(seed, rates)
        self.requested_port = port
        self.port = 0
        self._stats = Stats()
        self._stats_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    # Control (any thread) ---------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="faultproxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or not self.port:
            raise RuntimeError(f"the fault proxy did not start: {self._error!r}")
        client_kubeconfig(self.kubeconfig, f"http://127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(10)

    def set_rates(self, rates: Rates) -> None:
        self.schedule.set_rates(rates)

    def storm(self, kind: str, seconds: float, retry_after: int = 1) -> None:
        self.schedule.storm(kind, time.monotonic() + seconds, retry_after)

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            return {"seed": self.schedule.seed, **self._stats.as_json()}

    def now(self) -> float:
        """Seconds since the proxy started (the clock of ``stats()["per_second"]``)."""
        return time.monotonic() - self._stats.started

    # The event loop ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as error:  # reported to start()
            self._error = error
            self._ready.set()

    async def serve(self) -> None:
        """Serve until :meth:`stop` (or cancellation)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        connector = TCPConnector(ssl=self.upstream.ssl_context() or False, limit=0)
        async with ClientSession(
            connector=connector, timeout=ClientTimeout(total=None), auto_decompress=False
        ) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_get(STATS_PATH, self._serve_stats)

            async def handle(request: web.Request) -> web.StreamResponse:
                return await self._handle(request, session)

            app.router.add_route("*", "/{tail:.*}", handle)
            # Open watches are cut at stop instead of waited for (60 s by default).
            runner = web.AppRunner(
                app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
            )
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", self.requested_port)
            await site.start()
            self.port = int(runner.addresses[0][1])
            self._ready.set()
            try:
                await self._stopped.wait()
            finally:
                await runner.cleanup()

    async def _serve_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _handle(self, request: web.Request, session: ClientSession) -> web.StreamResponse:
        kind = classify(request.method, request.path, parse_qs(request.query_string))
        now = time.monotonic()
        fault = self.schedule.decide(kind, now)
        with self._stats_lock:
            self._stats.request(kind, now)
            if fault is not None:
                self._stats.fault(kind, fault, now)
        body = await request.read()
        if fault is not None and fault.kind in ("throttle", "internal", "unavailable"):
            code, headers, status = fault_response(fault)
            return web.json_response(status, status=code, headers=headers)
        if fault is not None and fault.kind == "reset" and not kind.watch:
            if fault.forward_first:
                with contextlib.suppress(Exception):
                    async with self._forward(session, request, body) as upstream:
                        await upstream.read()
            _reset(request)
            return web.Response(status=503)  # never sent: the connection is closed
        try:
            return await self._relay(request, session, body, kind, fault)
        except (ClientError, ConnectionError, TimeoutError):
            # The apiserver is unreachable or cut the answer short (or the client left):
            # the client's connection ends the same way.
            _reset(request)
            return web.Response(status=502)  # never sent: the connection is closed

    async def _relay(
        self,
        request: web.Request,
        session: ClientSession,
        body: bytes,
        kind: RequestKind,
        fault: Fault | None,
    ) -> web.StreamResponse:
        async with self._forward(session, request, body) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            if kind.watch and upstream.status == 200:
                if not await self._stream_watch(request, response, upstream, fault):
                    return response  # the connection was cut
            else:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            await response.write_eof()
            return response

    def _forward(self, session: ClientSession, request: web.Request, body: bytes) -> Any:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if self.upstream.token and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.upstream.token}"
        return session.request(
            request.method,
            f"{self.upstream.server}{request.rel_url}",
            headers=headers,
            data=body or None,
        )

    async def _stream_watch(
        self, request: web.Request, response: web.StreamResponse, upstream: Any, fault: Fault | None
    ) -> bool:
        """Forward a watch event by event; at a fault's time, cut or expire it. False when
        the connection was cut."""
        deadline = time.monotonic() + fault.delay if fault is not None else None
        pending: asyncio.Task[bytes] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(upstream.content.readline())
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait({pending}, timeout=timeout)
                if not done:
                    assert fault is not None
                    if fault.kind == "expire":
                        await response.write(expired_event())
                        return True
                    _reset(request)
                    return False
                line = pending.result()
                pending = None
                if not line:
                    return True
                await response.write(line)
        finally:
            if pending is not None:
                pending.cancel()


def _reset(request: web.Request) -> None:
    """Close the client's connection without (the rest of) an answer."""
    if request.transport is not None:
        request.transport.abort()


def rates_from(values: Mapping[str, float], retry_after: int = 1) -> Rates:
    """Rates from ``{"throttle": 0.05, ...}`` (unknown kinds are an error)."""
    unknown = set(values) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")
    return Rates(
        throttle=values.get("throttle", 0.0),
        internal=values.get("internal", 0.0),
        unavailable=values.get("unavailable", 0.0),
        reset=values.get("reset", 0.0),
        expire=values.get("expire", 0.0),
        retry_after=retry_after,
    )
