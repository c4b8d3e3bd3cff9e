"""The operator's metrics endpoint: HTTPS, served only to scrapers the cluster authorizes.

Every request carries a bearer token (a ServiceAccount's, as Prometheus sends its own). The
token is checked with a ``TokenReview`` and the user it names with a
``SubjectAccessReview`` for the request's path and verb (``get`` on the non-resource URL
``/metrics``), as Kubernetes' own components and controller-runtime's
``WithAuthenticationAndAuthorization`` filter delegate them to the apiserver. A missing or
rejected token is answered 401, a user without the permission 403, a review the apiserver
could not answer 500; nothing else is served to either. The chart grants the operator
``create`` on both review kinds and ships a ``<release>-metrics-reader`` ClusterRole for
scrapers to bind.

Reviews are cached (``ReviewCache``), so a Prometheus scraping every 15 s costs two API
requests a few times an hour, not two per scrape: a token's review for a minute (a
rejected one for 10 s), an access review for 5 minutes when allowed and 30 s when denied,
the TTLs controller-runtime's filter uses. Concurrent requests with the same token share
one review, and at most ``REVIEWS_AT_ONCE`` reviews are in flight, so a flood of made-up
tokens cannot take the API client's request slots from the reconcilers.

The certificate is a provided one (``--metrics-cert-dir``, a ``kubernetes.io/tls``
Secret's ``tls.crt`` and ``tls.key``, read again when they change, as cert-manager
rotates them) or a self-signed one made at start-up. ``--no-metrics-auth`` serves plain
HTTP to anyone, for local use.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
AUTHENTICATED_TTL = 60.0
"""Seconds a token's successful review is reused (controller-runtime: 1 minute)."""
UNAUTHENTICATED_TTL = 10.0
"""Seconds a rejected token stays rejected without asking again."""
ALLOWED_TTL = 300.0
"""Seconds a user's allowed access is reused (controller-runtime: 5 minutes)."""
DENIED_TTL = 30.0
"""Seconds a user's denied access is reused (controller-runtime: 30 s)."""
CACHE_ENTRIES = 1024
"""Reviews kept per kind; beyond that the oldest go first."""
REVIEWS_AT_ONCE = 4
"""Reviews in flight at once, whatever the number of scrapers."""
REFUSALS_LOGGED_EVERY = 10.0
"""Seconds between two log lines about refused scrapers (the others are counted in the
next one), so a flood of made-up tokens does not flood the log."""
CERT_CHECK_SECONDS = 60.0
"""How often a provided certificate's files are checked for a rotation."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Review = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""POST a review body to a review kind's path; return the apiserver's answer."""
Counted = Callable[[str, str], None]
"""``(review, result)``: one review asked of the apiserver (``tpu_operator_metrics_auth_
reviews_total``)."""


class ReviewError(Exception):
    """The apiserver did not answer a review (unreachable, timeout, an error status)."""


class _Missing(enum.Enum):
    MISSING = enum.auto()


MISSING: Literal[_Missing.MISSING] = _Missing.MISSING
"""What ``ReviewCache.get`` returns for a key it has no live value of."""


class ReviewCache(Generic[K, V]):
    """Values that expire, at most ``entries`` of them (the oldest stored go first)."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self._entries = entries
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | Literal[_Missing.MISSING]:
        found = self._items.get(key)
        if found is None:
            return MISSING
        expires, value = found
        if now >= expires:
            del self._items[key]
            return MISSING
        return value

    def put(self, key: K, value: V, ttl: float, now: float) -> None:
        self._items.pop(key, None)
        self._items[key] = (now + ttl, value)
        while len(self._items) > self._entries:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class User:
    """Who a token belongs to, as the TokenReview says (what the access review asks about)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_review(cls, user: Mapping[str, Any]) -> User:
        extra = user.get("extra") or {}
        return cls(
            name=user.get("username") or "",
            uid=user.get("uid") or "",
            groups=tuple(user.get("groups") or ()),
            extra=tuple(sorted((k, tuple(v or ())) for k, v in extra.items())),
        )

    def access_review(self, verb: str, path: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "user": self.name,
            "groups": list(self.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if self.uid:
            spec["uid"] = self.uid
        if self.extra:
            spec["extra"] = {k: list(v) for k, v in self.extra}
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: ``status`` 200 lets it through."""

    status: int
    message: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Gate:
    """Authentication by TokenReview, authorization by SubjectAccessReview, both cached."""

    def __init__(
        self,
        review: Review,
        *,
        clock: Callable[[], float] = time.monotonic,
        counted: Counted | None = None,
        entries: int = CACHE_ENTRIES,
    ) -> None:
        self._review = review
        self._clock = clock
        self._counted = counted or (lambda review, result: None)
        self._users: ReviewCache[bytes, User | None] = ReviewCache(entries)
        self._access: ReviewCache[tuple[User, str, str], bool] = ReviewCache(entries)
        self._pending: dict[Hashable, asyncio.Task[Any]] = {}
        self._slots = asyncio.Semaphore(REVIEWS_AT_ONCE)
        self._logged = -REFUSALS_LOGGED_EVERY
        self._unlogged = 0

    def _refused(self, message: str, *args: Any) -> None:
        """Log a refusal the apiserver decided, at most one line per
        ``REFUSALS_LOGGED_EVERY`` seconds."""
        now = self._clock()
        if now - self._logged < REFUSALS_LOGGED_EVERY:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last such line)" if self._unlogged else ""
        log.warning("metrics: " + message + more, *args)
        self._logged, self._unlogged = now, 0

    async def check(self, authorization: str | None, verb: str, path: str) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "Unauthorized: a bearer token is required")
        try:
            user = await self.authenticate(token)
            if user is None:
                return Verdict(401, "Unauthorized: the token was not accepted")
            allowed = await self.authorize(user, verb, path)
        except ReviewError as exc:
            self._refused("a scrape was refused, its review failed: %s", exc)
            return Verdict(500, "Authentication or authorization failed: the review failed")
        if not allowed:
            return Verdict(403, f"Forbidden: {user.name} may not {verb} {path}", user.name)
        return Verdict(200, "OK", user.name)

    async def authenticate(self, token: str) -> User | None:
        """The token's user, None when the apiserver does not accept the token."""
        key = hashlib.sha256(token.encode()).digest()
        return await self._cached(self._users, key, lambda: self._review_token(token))

    async def authorize(self, user: User, verb: str, path: str) -> bool:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``."""
        key = (user, verb, path)
        return await self._cached(self._access, key, lambda: self._review_access(user, verb, path))

    async def _cached(
        self,
        cache: ReviewCache[Any, Any],
        key: Hashable,
        ask: Callable[[], Awaitable[tuple[Any, float]]],
    ) -> Any:
        found = cache.get(key, self._clock())
        if found is not MISSING:
            return found
        pending = (id(cache), key)
        task = self._pending.get(pending)
        if task is None:
            # A task of its own: requests with the same key wait for one review, and a
            # request that goes away does not cancel it for the others.
            task = asyncio.create_task(self._fill(cache, key, ask, pending))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._pending[pending] = task
        return await asyncio.shield(task)

    async def _fill(
        self,
        cache: ReviewCache[Any, Any],
        key: Hashable,
        ask: Callable[[], Awaitable[tuple[Any, float]]],
        pending: Hashable,
    ) -> Any:
        try:
            async with self._slots:
                value, ttl = await ask()
            cache.put(key, value, ttl, self._clock())
            return value
        finally:
            del self._pending[pending]

    async def _review_token(self, token: str) -> tuple[User | None, float]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        status = await self._ask(TOKEN_REVIEWS, body, "TokenReview")
        if status.get("authenticated") and (status.get("user") or {}).get("username"):
            self._counted("TokenReview", "authenticated")
            return User.from_review(status["user"]), AUTHENTICATED_TTL
        self._counted("TokenReview", "unauthenticated")
        self._refused(
            "a scraper's token was not accepted: %s", status.get("error") or "not authenticated"
        )
        return None, UNAUTHENTICATED_TTL

    async def _review_access(self, user: User, verb: str, path: str) -> tuple[bool, float]:
        status = await self._ask(
            ACCESS_REVIEWS, user.access_review(verb, path), "SubjectAccessReview"
        )
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        if status.get("allowed") and not status.get("denied"):
            self._counted("SubjectAccessReview", "allowed")
            return True, ALLOWED_TTL
        self._counted("SubjectAccessReview", "denied")
        self._refused(
            "%s may not %s %s (bind it to the chart's ClusterRole <release>-metrics-reader)%s",
            user.name,
            verb,
            path,
            f": {reason}" if reason else "",
        )
        return False, DENIED_TTL

    async def _ask(self, path: str, body: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
        try:
            answer = await self._review(path, body)
        except Exception as exc:
            self._counted(kind, "error")
            raise ReviewError(f"{kind}: {exc}") from exc
        return (answer or {}).get("status") or {}


def self_signed(hosts: list[str], directory: Path) -> tuple[Path, Path]:
    """A self-signed serving certificate and its key (EC P-256, one year) for ``hosts``
    (names and IP addresses), written to ``directory``; returns (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpu-operator-metrics")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def cert_files(directory: str) -> tuple[Path, Path]:
    """The certificate and key of ``--metrics-cert-dir``: ``tls.crt`` and ``tls.key``."""
    return Path(directory) / "tls.crt", Path(directory) / "tls.key"


def cert_dir_problem(directory: str) -> str | None:
    """Why ``--metrics-cert-dir`` cannot be served from, or None."""
    for path in cert_files(directory):
        if not path.is_file():
            return (
                f"--metrics-cert-dir={directory}: {path.name} is missing (the directory "
                "holds a kubernetes.io/tls Secret's tls.crt and tls.key)"
            )
    try:
        server_context(*cert_files(directory))
    except (ssl.SSLError, OSError) as exc:
        return f"--metrics-cert-dir={directory}: the certificate and key do not load: {exc}"
    return None


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def _hosts(address: str) -> list[str]:
    hosts = ["localhost", "127.0.0.1"]
    for candidate in (address, os.environ.get("POD_IP", "")):
        if candidate and candidate not in ("0.0.0.0", "::"):
            hosts.append(candidate)
    return hosts


class MetricsServer:
    """``GET /metrics`` of a registry on ``address:port``, behind a ``Gate`` over TLS, or
    open over plain HTTP when there is no gate."""

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        address: str,
        *,
        gate: Gate | None = None,
        cert_dir: str | None = None,
    ) -> None:
        self.registry = registry
        self.port = port
        self.address = address
        self.gate = gate
        self.cert_dir = cert_dir
        self._runner: web.AppRunner | None = None
        self._context: ssl.SSLContext | None = None
        self._stamp: tuple[float, float] | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def secure(self) -> bool:
        return self.gate is not None or self.cert_dir is not None

    async def start(self) -> None:
        if self.secure:
            self._context = self._load_context()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.port, ssl_context=self._context)
        await site.start()
        if self.cert_dir is not None:
            self._watch = asyncio.create_task(self._watch_cert(), name="metrics-cert")
        scheme = "https" if self.secure else "http"
        guard = (
            "scrapers authorized by TokenReview and SubjectAccessReview" if self.gate else "open"
        )
        log.info("metrics: %s://%s:%d/metrics (%s)", scheme, self.address, self.port, guard)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def _load_context(self) -> ssl.SSLContext:
        if self.cert_dir is not None:
            cert, key = cert_files(self.cert_dir)
            self._stamp = self._mtimes()
            return server_context(cert, key)
        with tempfile.TemporaryDirectory(prefix="tpu-operator-metrics-") as directory:
            return server_context(*self_signed(_hosts(self.address), Path(directory)))

    def _mtimes(self) -> tuple[float, float] | None:
        assert self.cert_dir is not None
        try:
            cert, key = cert_files(self.cert_dir)
            return cert.stat().st_mtime, key.stat().st_mtime
        except OSError:
            return None

    async def _watch_cert(self) -> None:
        """Serve a rotated certificate (a Secret volume's files replaced) from then on."""
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            stamp = self._mtimes()
            if stamp is None or stamp == self._stamp or self._context is None:
                continue
            try:
                assert self.cert_dir is not None
                self._context.load_cert_chain(*(str(p) for p in cert_files(self.cert_dir)))
            except (ssl.SSLError, OSError) as exc:
                log.warning(
                    "metrics: the rotated certificate does not load (%s); serving the previous one",
                    exc,
                )
                continue
            self._stamp = stamp
            log.info("metrics: serving the rotated certificate of %s", self.cert_dir)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.gate is not None:
            verdict = await self.gate.check(
                request.headers.get("Authorization"), request.method.lower(), request.path
            )
            if not verdict.allowed:
                headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
                return web.Response(
                    status=verdict.status, text=verdict.message + "\n", headers=headers
                )
        if request.path != "/metrics":
            return web.Response(status=404, text="Not found: the operator serves /metrics\n")
        if request.method != "GET":
            return web.Response(status=405, text="Method not allowed\n", headers={"Allow": "GET"})
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        # Collecting reads the caches and formats every series: in a thread, as before,
        # so a large registry does not hold the event loop.
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, encoder, self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})
