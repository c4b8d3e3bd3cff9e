"""Async access to the Kubernetes API: aiohttp on the event loop, configured from the
official ``kubernetes`` client's ``Configuration``.

The official client loads the configuration (kubeconfig, exec plugins, the in-cluster
service account, token refresh); requests go out on one aiohttp session with the same TLS
context and ``Authorization`` header the watches use (``ssl_context``, ``auth_headers``).
The official client's own request path ran each request in a thread pool through its
serialization and urllib3: 2.3x the CPU of aiohttp per create and 1.8x per delete, for no
more throughput (``bench/client_async.py``, bench/HISTORY.md 2026-12-07), and requests are
the operator's largest CPU term on a cluster of many jobs.

Responses skip model deserialization: they are decoded as plain JSON, which is what the
operator's builders and views work with anyway, and only when the caller reads them: a
created, patched or deleted object comes back whole (a worker pod with its peer lists, 40
KB at 1,024 hosts), and the operator reads such objects from its watches instead. A
semaphore bounds concurrent requests, and the session's connection pool is sized to match
so no request waits for a socket.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import msgspec
import orjson
from kubernetes.client import Configuration

from tpu_operator.state.documents import ListDocument, ListedObject

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept header of a list that returns only each object's metadata."""

LISTED_FIELDS = ("name", "namespace", "uid", "labels", "ownerReferences")
"""What ``Kube.list_metadata`` keeps of each object's metadata (``ListedMetadata``)."""
METADATA_PAGE: msgspec.json.Decoder[ListDocument[ListedObject]] = msgspec.json.Decoder(
    ListDocument[ListedObject]
)

Loads = Callable[[bytes], Any]
"""How a successful response's body is decoded."""


def unread(raw: bytes) -> None:
    """``Loads`` for a request whose answer the caller does not read (its status is
    enough): the body is not decoded at all."""


def loads_core(raw: bytes) -> Any:
    """Decode a core-API object (a watch's ERROR line) with orjson, 2-2.5x faster than
    ``json`` on a worker pod. (Pod and node events and lists, the operator's most decoded
    JSON, and metadata lists are decoded into typed documents instead:
    ``state/documents.py``.)

    Only for kinds whose schema bounds every number to 64 bits: orjson reads a larger
    integer as a float where ``json`` keeps it exact, and a custom resource's free-form
    template may hold one, so everything else is decoded with ``json``."""
    return orjson.loads(raw)


def dumps(body: Any) -> bytes:
    """A request body as JSON: orjson, 5-10x faster than ``json`` on a worker pod (the
    operator's most written body) and on a status patch.

    orjson refuses an integer beyond 64 bits (a custom resource's free-form template may
    hold one; the apiserver then answers for it) and a key that is not a string: those
    bodies are written by ``json``, exactly. A number that is not finite (NaN, infinity)
    is written as null, never as the bare ``NaN`` JSON does not allow and the apiserver
    refuses (for a merge patch, null removes the field)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()


def listed_metadata(raw: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """One page of a metadata-only list: each object's ``LISTED_FIELDS`` that it has, and
    the token of the next page (None on the last).

    Decoded straight into those fields (``state/documents.ListedMetadata``): the managed
    fields that make up most of each item are skipped, not built and dropped. The cache
    audit lists a 12,736-host job's 199 TPUSlices this way every minute, 0.4 MB a list
    (bench/HISTORY.md, entry 36881e4)."""
    page = METADATA_PAGE.decode(raw)
    items: list[dict[str, Any]] = []
    for item in page.items or ():
        meta = item.metadata
        if meta is None:
            items.append({})
            continue
        values = (meta.name, meta.namespace, meta.uid, meta.labels, meta.ownerReferences)
        items.append({k: v for k, v in zip(LISTED_FIELDS, values, strict=True) if v is not None})
    token = page.metadata.continue_ if page.metadata is not None else None
    return items, token or None


class ApiError(Exception):
    """A failed API request: HTTP status, the apiserver's reason and message."""

    def __init__(
        self,
        verb: str,
        path: str,
        status: int,
        reason: str,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{verb} {path}: {status} {reason}: {message}")
        self.verb = verb
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        """Seconds the apiserver asked the client to wait (429/503 ``retryAfterSeconds``):
        the work queue retries no sooner."""

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: the object exists already (create) or changed since it was read (update)."""
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status in (400, 422)

    @property
    def apiserver_trouble(self) -> bool:
        """429, or a 5xx other than 503: the apiserver's own trouble, for the work queue to
        back off on. (A 503 from an aggregated or optional API says it is not served here,
        which a caller reading such an API treats as an answer.)"""
        return self.status == 429 or (self.status >= 500 and self.status != 503)


@dataclass(frozen=True)
class RequestRecord:
    verb: str
    code: int
    seconds: float


Observer = Callable[[RequestRecord], None]


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> Configuration:
    """Client configuration, in the order controllers conventionally look for it.

    An explicit kubeconfig path, else $KUBECONFIG, else the pod's service account when
    running in a cluster, else ~/.kube/config.
    """
    config = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=config)
        return config
    kubernetes.config.load_kube_config(
        config_file=path or str(Path("~/.kube/config").expanduser()),
        context=context,
        client_configuration=config,
    )
    return config


def connection_info(config: Configuration) -> Any:
    """The same credentials as a ``kopf.ConnectionInfo`` (for kopf's own watch client)."""
    import kopf

    token = None
    for key in ("BearerToken", "authorization"):
        value = (config.api_key or {}).get(key)
        if value:
            # "bearer <token>" (in-cluster), "Bearer <token>" or the bare token
            scheme, _, rest = value.strip().partition(" ")
            token = rest.strip() if rest and scheme.lower() == "bearer" else value.strip()
            break
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        token=token,
        username=config.username or None,
        password=config.password or None,
    )


def ssl_context(config: Configuration) -> ssl.SSLContext:
    """TLS as the official client does it from the same configuration."""
    context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file or None)
    return context


def auth_headers(config: Configuration) -> dict[str, str]:
    """The Authorization header for one request (read each time: an in-cluster token is
    rotated, and the client's refresh hook re-reads it)."""
    token = config.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        return {"Authorization": token}
    basic = config.get_basic_auth_token() if config.username else None
    return {"Authorization": basic} if basic else {}


class Kube:
    """Bounded, non-blocking Kubernetes API requests returning plain JSON."""

    def __init__(
        self,
        configuration: Configuration,
        *,
        concurrency: int = 32,
        timeout: float = 30.0,
        observer: Observer | None = None,
    ) -> None:
        self.config = configuration
        self._server = configuration.host.rstrip("/")
        self._proxy = configuration.proxy or None
        self._slots = asyncio.Semaphore(concurrency)
        self._timeout = timeout
        self._observer = observer
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        """The session, made on the first request (it belongs to the running loop)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=ssl_context(self.config), limit=self.concurrency
                ),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def request(
        self,
        verb: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        loads: Loads = json.loads,
    ) -> Any:
        """Send one request; return its body decoded by ``loads``, or raise ApiError.

        Answers are decoded on the event loop: the decoders are C code that holds the GIL
        for the whole call wherever it runs, so a thread would not free the loop."""
        headers = {"Accept": accept, **auth_headers(self.config)}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = dumps(body)
        async with self._slots:
            started = time.monotonic()
            try:
                async with self._client().request(
                    verb,
                    self._server + path,
                    params=query,
                    data=data,
                    headers=headers,
                    proxy=self._proxy,
                ) as response:
                    status = response.status
                    raw = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._observe(verb, 0, started)
                raise ApiError(verb, path, 0, *_transport_error(exc, self._timeout)) from exc
        self._observe(verb, status, started)
        if status >= 400:
            raise status_error(verb, path, status, decode(raw))
        return loads(raw) if raw else None

    def _observe(self, verb: str, status: int, started: float) -> None:
        if self._observer is not None:
            self._observer(RequestRecord(verb, status, time.monotonic() - started))

    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        """Create; False when an object of that name exists already (409). The created
        object is not decoded: the watch brings it."""
        try:
            await self.request("POST", path, body=body, loads=unread)
        except ApiError as exc:
            if exc.conflict:
                return False
            raise
        return True

    async def get(self, path: str) -> dict[str, Any] | None:
        """Get; None when it does not exist."""
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch; the patched object is not decoded (the watch brings it)."""
        await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH, loads=unread)

    async def delete(
        self,
        path: str,
        *,
        grace_seconds: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> bool:
        """Delete; False when it was already gone (404, or a UID precondition failed)."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            await self.request("DELETE", path, body=options, loads=unread)
        except ApiError as exc:
            if exc.not_found or (uid and exc.conflict):
                return False
            raise
        return True

    async def list_metadata(
        self, path: str, *, label_selector: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The identity of every object of a collection: its metadata's ``LISTED_FIELDS``
        (paged; no specs or statuses, so a list of worker pods costs a fraction of a full
        list). Each page is decoded into those fields alone (``listed_metadata``)."""
        items: list[dict[str, Any]] = []
        query: dict[str, str] = {"limit": str(limit)}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request(
                "GET", path, query=query, accept=METADATA_LIST, loads=listed_metadata
            )
            listed, token = page or ([], None)
            items += listed
            if not token:
                return items
            query["continue"] = token


async def send_all(*groups: Iterable[Awaitable[Any]]) -> None:
    """Send every request of a group at once (the client's semaphore bounds how many are
    in flight) and wait for each answer, then the next group's (an earlier group's requests
    wait behind none of a later one's, in the client's queue or the apiserver's); then
    raise the first failure. Every request is sent whatever the others answer, so one
    refusal does not leave the rest unsent until a retry. Cancelled, it closes the
    requests of the groups not yet sent (coroutines never awaited would be warned of)."""
    waiting = [list(requests) for requests in groups]
    failures: list[BaseException] = []
    try:
        while waiting:
            results = await asyncio.gather(*waiting.pop(0), return_exceptions=True)
            failures.extend(r for r in results if isinstance(r, BaseException))
    finally:
        for request in (r for requests in waiting for r in requests):
            if inspect.iscoroutine(request):
                request.close()
    if failures:
        raise failures[0]


def _transport_error(exc: BaseException, timeout: float) -> tuple[str, str]:
    """The cause of a request that got no answer, briefly: the socket's error by its errno
    (aiohttp says "Connect call failed ('10.0.0.1', 443)" for a refused connection), or
    how long the request waited."""
    os_error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else None
    if os_error is not None:
        errno = os_error.errno
        words = os.strerror(errno) if errno and errno > 0 else os_error.strerror or str(os_error)
        return type(exc).__name__, f"[Errno {errno}] {words}"
    if isinstance(exc, TimeoutError) and not str(exc):
        return type(exc).__name__, f"no answer within {timeout:g} s"
    return type(exc).__name__, str(exc) or type(exc).__name__


def retry_after(status: Mapping[str, Any]) -> float | None:
    """``details.retryAfterSeconds`` of a failure Status (API Priority and Fairness sends it
    with every 429, beside the ``Retry-After`` header), else None."""
    details = status.get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return float(seconds)
    return None


def status_error(verb: str, path: str, status: int, data: Any) -> ApiError:
    """The ApiError for a failed request whose body is ``data`` (a decoded Status)."""
    data = data if isinstance(data, dict) else {}
    return ApiError(
        verb,
        path,
        status,
        data.get("reason", ""),
        data.get("message", str(data)),
        retry_after=retry_after(data),
    )


def decode(raw: object) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {"message": str(raw)}


def namespaced(
    namespace: str,
    plural: str,
    name: str | None = None,
    *,
    group: str = "",
    version: str = "v1",
    subresource: str | None = None,
) -> str:
    """The REST path of a namespaced object or collection."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path
