"""The worker-pod watch: list and watch the pods with the slice label, kept as PodViews.

The operator's pod cache is by far its largest: one entry per worker, thousands of events a
second while a large job starts or restarts. kopf, which watches the custom resources and
nodes, processes every event of every object in full (a Body wrapper, a per-object
stream and worker task, index and handler calls with their keyword arguments); at 1,024
hosts that machinery, not the reconcilers, took most of the operator's CPU, and its
per-object state most of its memory. This watch does the same job for pods with only what
the operator needs:

- **list** (paged, ``limit=500``) of the pods with the ``tpu-operator.dev/slice`` label,
  each decoded once into a :class:`PodView`; the objects themselves are dropped at once;
- **watch** from the list's resourceVersion with bookmarks, each line decoded and reduced
  to a PodView; ``410 Gone`` (or a watch error) lists again;
- **a re-list heals a watch gap by itself**: cached pods the new list does not hold were
  deleted meanwhile, and are dropped as if their DELETED event had come (kopf's re-list
  never does that; ``runtime/audit.py`` covers its kinds);
- a failed request is logged once per failure, with the wait before the next try (0.5 s
  growing to 5 s; ``Retry-After`` is honoured).

The initial list runs before anything reconciles (``Runtime.watch_pods`` is awaited from
kopf's start-up handler, which kopf runs before its own watches): a reconcile never sees a
half-filled pod cache, so it never creates a pod that already exists.

:class:`PodStore` is the cache: a mapping from index key to the PodViews under that key,
the same shape kopf's indexes have, so ``runtime/caches.py`` reads it like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import aiohttp
from kubernetes.client import Configuration

from tpu_operator import contract
from tpu_operator.runtime.kube import ApiError, Kube, retry_after
from tpu_operator.state.views import PodView, pod_view

log = logging.getLogger(__name__)

Identity = tuple[str | None, str, str]
"""(namespace, name, uid), as kopf files indexed objects (``runtime/caches.Identity``)."""
OnEvent = Callable[[str | None, PodView], None]
"""Called for every pod event after the store has it: ``ADDED``, ``MODIFIED``,
``DELETED``, or None for a pod of a (re-)list."""

LIST_LIMIT = 500
"""Pods per page of a list (a page of worker pods is a few MB of JSON)."""
WATCH_SECONDS = 300
"""How long the apiserver keeps one watch open (randomised by up to a fifth, so that the
watches of many operators do not all end at once)."""
BACKOFFS = (0.5, 1.0, 2.0, 3.0, 5.0)
"""Seconds before the next try after consecutive failures (the last repeats)."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""A watch line longer than this is a broken stream, not a pod (pods are limited to 1.5 MB
by etcd's default request size)."""


def pod_keys(view: PodView) -> list[Any]:
    """The index keys a worker pod is filed under (``runtime/caches.py``)."""
    keys: list[Any] = [("slice", view.namespace, view.slice_name)]
    if view.job_owned:
        keys.append(("job", view.namespace, view.job_name))
    if view.node:
        keys.append(("node", view.node))
    if view.pool:
        keys.append(("pool", view.pool))
    return keys


def identity(view: PodView) -> Identity:
    return view.namespace, view.name, view.uid


class PodStore(Mapping[Any, Collection[PodView]]):
    """Worker pods by index key: ``store[key]`` is a live view of the PodViews under it."""

    def __init__(self) -> None:
        self._views: dict[Identity, PodView] = {}
        self._keys: dict[Any, dict[Identity, PodView]] = {}

    def __getitem__(self, key: Any) -> Collection[PodView]:
        return self._keys[key].values()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def pods(self) -> int:
        return len(self._views)

    def identities(self, namespace: str | None = None) -> list[Identity]:
        """Every stored pod's identity (of ``namespace`` only, if given)."""
        if namespace is None:
            return list(self._views)
        return [i for i in self._views if i[0] == namespace]

    def put(self, view: PodView) -> None:
        """Store ``view``, replacing the pod's earlier one under every key."""
        ident = identity(view)
        old = self._views.get(ident)
        if old is not None:
            self._unfile(ident, old)
        self._views[ident] = view
        for key in pod_keys(view):
            self._keys.setdefault(key, {})[ident] = view

    def discard(self, ident: Identity) -> PodView | None:
        """Drop a pod under every key; return its last view (None if it was not stored)."""
        old = self._views.pop(ident, None)
        if old is not None:
            self._unfile(ident, old)
        return old

    # kopf's indexes drop an object through ``_discard``; ``Caches.forget`` calls that.
    _discard = discard

    def _unfile(self, ident: Identity, view: PodView) -> None:
        for key in pod_keys(view):
            entries = self._keys.get(key)
            if entries is not None:
                entries.pop(ident, None)
                if not entries:
                    del self._keys[key]


def stale_after_list(stored: Iterable[Identity], listed: Collection[Identity]) -> list[Identity]:
    """The stored pods a complete list does not hold: deleted while no watch saw it."""
    return [ident for ident in stored if ident not in listed]


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


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
    token = config.get_api_key_with_prefix("BearerToken")
    if token:
        return {"Authorization": token}
    basic = config.get_basic_auth_token() if config.username else None
    return {"Authorization": basic} if basic else {}


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The newline-separated lines of a watch response, however long (aiohttp's own
    line reader refuses lines over 128 KB; a pod with large annotations exceeds that)."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise ValueError(f"a watch line exceeds {MAX_LINE_BYTES} bytes")
    if buffer.strip():
        yield bytes(buffer)


class PodWatch:
    """List and watch the worker pods of ``namespaces`` (all if empty) into ``store``."""

    def __init__(
        self,
        kube: Kube,
        config: Configuration,
        store: PodStore,
        on_event: OnEvent,
        *,
        namespaces: Collection[str] = (),
    ) -> None:
        self.kube = kube
        self.config = config
        self.store = store
        self.on_event = on_event
        self.namespaces: list[str | None] = list(namespaces) or [None]
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._versions: dict[str | None, str] = {}
        """Per namespace: the resourceVersion to resume watching from."""
        self.lists = 0
        """Complete lists so far (the first, and one after every watch that could not
        resume)."""

    def _path(self, namespace: str | None) -> str:
        return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"

    def _where(self, namespace: str | None) -> str:
        return f"namespace {namespace}" if namespace else "all namespaces"

    # Listing ----------------------------------------------------------------------------

    async def list_once(self, namespace: str | None) -> str:
        """List the worker pods of ``namespace`` into the store, drop those it no longer
        has, and return the list's resourceVersion (to watch from)."""
        before = self.store.identities(namespace)  # strictly before the list is requested
        query = {"labelSelector": contract.LABEL_SLICE_NAME, "limit": str(LIST_LIMIT)}
        listed: set[Identity] = set()
        version = ""
        while True:
            page = await self.kube.request("GET", self._path(namespace), query=query) or {}
            for item in page.get("items") or []:
                view = pod_view(item)
                if view is None:
                    continue
                self.store.put(view)
                listed.add(identity(view))
                self.on_event(None, view)
            meta = page.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            token = meta.get("continue")
            if not token:
                break
            query["continue"] = token
        for ident in stale_after_list(before, listed):
            old = self.store.discard(ident)
            if old is not None:
                self.on_event("DELETED", old)
        self.lists += 1
        return version

    async def list_all(self) -> None:
        """The first list of every namespace; retried until the API answers."""
        for namespace in self.namespaces:
            failures = 0
            while True:
                try:
                    version = await self.list_once(namespace)
                    break
                except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                    wait = self._backoff(failures, exc)
                    failures += 1
                    log.warning(
                        "listing the worker pods (%s) failed: %s; trying again in %.1f s",
                        self._where(namespace),
                        exc,
                        wait,
                    )
                    await asyncio.sleep(wait)
            self._versions[namespace] = version

    # Watching ---------------------------------------------------------------------------

    def start(self) -> None:
        """Watch every namespace from where ``list_all`` left off."""
        self._session = aiohttp.ClientSession(
            base_url=self.config.host,
            connector=aiohttp.TCPConnector(ssl=ssl_context(self.config)),
        )
        for namespace in self.namespaces:
            name = f"pod-watch-{namespace or 'all'}"
            self._tasks.append(asyncio.create_task(self._run(namespace), name=name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self, namespace: str | None) -> None:
        failures = 0
        version: str | None = self._versions.get(namespace)
        while True:
            try:
                if version is None:
                    version = await self.list_once(namespace)
                    log.info(
                        "listed the worker pods (%s) again: %d cached",
                        self._where(namespace),
                        self.store.pods,
                    )
                began = asyncio.get_running_loop().time()
                version = await self._watch(namespace, version)
                failures = 0
                if asyncio.get_running_loop().time() - began < 1.0:
                    await asyncio.sleep(BACKOFFS[0])  # a watch closed at once: no busy loop
            except Gone:
                log.info(
                    "the pod watch (%s) is too old to resume (410 Gone): listing again",
                    self._where(namespace),
                )
                version = None
                failures = 0
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                wait = self._backoff(failures, exc)
                failures += 1
                log.warning(
                    "the pod watch (%s) broke: %s; watching again in %.1f s",
                    self._where(namespace),
                    exc or type(exc).__name__,
                    wait,
                )
                await asyncio.sleep(wait)

    def _backoff(self, failures: int, exc: BaseException) -> float:
        wait = BACKOFFS[min(failures, len(BACKOFFS) - 1)]
        if isinstance(exc, ApiError) and exc.retry_after:
            wait = max(wait, exc.retry_after)
        return wait

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Apply one watch's events from ``version``; return the last version seen when
        the apiserver ends the watch. Raises ``Gone`` when the version is too old."""
        assert self._session is not None
        seconds = int(WATCH_SECONDS * (1 + random.random() / 5))
        query = {
            "watch": "true",
            "labelSelector": contract.LABEL_SLICE_NAME,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=seconds + 30)
        async with self._session.get(
            self._path(namespace), params=query, headers=auth_headers(self.config), timeout=timeout
        ) as response:
            if response.status != 200:
                raise _error(response.status, await response.text(), self._path(namespace))
            async for line in _lines(response.content):
                version = self._apply(line, version)
        return version

    def _apply(self, line: bytes, version: str) -> str:
        """Apply one watch event; return the resourceVersion to resume from."""
        event = json.loads(line)
        kind = event.get("type")
        body = event.get("object") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                raise Gone()
            raise _error(int(body.get("code") or 500), json.dumps(body), "pod watch")
        new_version = (body.get("metadata") or {}).get("resourceVersion") or version
        if kind == "BOOKMARK":
            return new_version
        view = pod_view(body)
        if view is None:
            return new_version
        if kind == "DELETED":
            self.store.discard(identity(view))
            self.on_event("DELETED", view)  # its final state, newer than the stored one
        else:
            self.store.put(view)
            self.on_event(kind, view)
        return new_version


def _error(status: int, text: str, path: str) -> Exception:
    if status == 410:
        return Gone()
    try:
        data = json.loads(text)
    except ValueError:
        data = {"message": text}
    data = data if isinstance(data, dict) else {"message": str(data)}
    return ApiError(
        "WATCH",
        path,
        status,
        data.get("reason", ""),
        data.get("message", text),
        retry_after=retry_after(data),
    )
