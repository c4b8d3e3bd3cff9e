"""List-and-watch caches of the operator's own, for worker pods and TPU nodes.

Worker pods and TPU nodes are the operator's most numerous objects: thousands of each in a
large cluster, thousands of pod events a second while a large job starts or restarts.
kopf, which watches the custom resources, processes every event of every object in full (a
Body wrapper, a per-object stream and worker task that waits on an operator-wide condition,
index and handler calls with their keyword arguments). Profiled at 1,024 hosts that
machinery, not the reconcilers, took most of the operator's CPU; after a restart with 2,048
nodes it took 45 s to deliver the initial listings, every listed object's worker waking on
one shared condition. ``ListWatch`` does the same job with only what the operator needs:

- **list** (paged, ``limit=500``) with a label selector, each object decoded once, into
  only the fields its view reads (``state/documents.py``), then into a view (``PodView``,
  ``NodeView``) filed under its index keys; the object itself is never built;
- **watch** from the list's resourceVersion with bookmarks, each line decoded and reduced
  the same way; ``410 Gone`` (or a watch error) lists again;
- **a re-list heals a watch gap by itself**: cached objects the new list does not hold
  were deleted meanwhile, and are dropped as if their DELETED event had come (kopf's
  re-list never does that; ``runtime/audit.py`` covers its kinds);
- a failed request is logged once per failure, with the wait before the next try (0.5 s
  growing to 5 s; ``Retry-After`` is honoured).

The initial lists complete before the operator acts (``Runtime.act``, ``Runtime.lead``):
a reconcile never sees a half-filled cache, so it never creates a pod that already exists.

:class:`Store` is the cache: a mapping from index key to the values under that key, the
same shape kopf's indexes have, so ``runtime/caches.py`` reads all kinds alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

import aiohttp
import msgspec
from kubernetes.client import Configuration

from tpu_operator import contract
from tpu_operator.runtime.audit import stale
from tpu_operator.runtime.caches import VERSIONS, Identity, identity_of
from tpu_operator.runtime.kube import (
    ApiError,
    Kube,
    auth_headers,
    decode,
    loads_core,
    ssl_context,
    status_error,
)
from tpu_operator.state.documents import (
    ListDocument,
    ListMetadata,
    NodeDocument,
    PodDocument,
    RawListDocument,
    RawWatchEvent,
    WatchEvent,
    metadata_of,
)
from tpu_operator.state.views import ORPHAN, NodeView, PodView, node_view, pod_view

log = logging.getLogger(__name__)

OnEvent = Callable[[str | None, Any], None]
"""Called with an event's view after the store has it, when the view changed: ``ADDED``,
``MODIFIED``, ``DELETED``, or None for an object of a (re-)list."""
Keys = dict[Any, Any]
"""Index key -> the value filed under it, for one object."""

LIST_LIMIT = 500
"""Objects per page of a list (a page of worker pods is a few MB of JSON)."""
WATCH_SECONDS = 300
"""How long the apiserver keeps one watch open (randomised by up to a fifth, so that the
watches of many operators do not all end at once)."""
BACKOFFS = (0.5, 1.0, 2.0, 3.0, 5.0)
"""Seconds before the next try after consecutive failures (the last repeats)."""
MAX_LINE_BYTES = 64 * 1024 * 1024
"""A watch line longer than this is a broken stream, not a pod (pods are limited to 1.5 MB
by etcd's default request size)."""


def pod_keys(view: PodView) -> Keys:
    """The index keys of a worker pod (``runtime/caches.py``). A pod that is not the
    operator's (``runtime/ownership.py``) is filed under its owner's UID (to be filed again
    when that TPUSlice is known) and, foreign, under its pool and node as such; an orphan
    under its pool and node, which it occupies until it is gone."""
    keys: Keys = {}
    if not view.own:
        if view.owner:
            keys[("owner", view.owner)] = view
        if view.ownership == ORPHAN:
            if view.pool:
                keys[("pool", view.pool)] = view
            if view.node:
                keys[("node", view.node)] = view
            return keys
        if view.pool:
            keys[("foreign-pool", view.pool)] = view
        if view.node:
            keys[("foreign-node", view.node)] = view
        return keys
    keys[("slice", view.namespace, view.slice_name)] = view
    if view.job_owned:
        keys[("job", view.namespace, view.job_name)] = view
        if view.worker_index == 0:
            # A job's slice leaders, one pod in 64 on the largest slices: what the
            # progress sampler reads on most rounds (``Caches.leaders_of_job``).
            keys[("leaders", view.namespace, view.job_name)] = view
    if view.node:
        keys[("node", view.node)] = view
    if view.pool:
        keys[("pool", view.pool)] = view
    if view.awaiting_scheduler is not None:
        # Whom to wake when that scheduler goes quiet (``Caches.awaiting``).
        keys[("awaiting", view.awaiting_scheduler)] = view
    return keys


def pod_tally(view: PodView) -> Tallied:
    """What a worker pod is counted under:

    - a job-owned pod under its job with its restart attempt (``Caches.attempts_of_job``);
    - a pod that is neither ready nor finished under its gang (its job, or its standalone
      slice) with its attempt (``Caches.unready_pods``), and a job's pod under its slice
      too (``Caches.unready_in_slice``): the event that makes the last pod of a gang, or
      of one slice of a job, ready is then told from the others in O(1)
      (``Runtime.pod_event``);
    - a job's pod whose container does not run yet (not Running, or no IP) under its slice
      with its attempt (``Caches.unstarted_in_slice``): in a mixed restart the event that
      makes the last pod of a recreated slice run lifts the in-place barrier, though
      nothing turns ready (``reconcile/wakes.py``).
    """
    if not view.own:
        return ()
    if view.ready or view.terminal:
        if view.job_owned:
            return ((("job", view.namespace, view.job_name), view.attempt),)
        return ()
    unready = (("unready", view.namespace, view.job_name), view.attempt)
    if view.job_owned:
        tallied: Tallied = (
            (("job", view.namespace, view.job_name), view.attempt),
            unready,
            (("unready-slice", view.namespace, view.slice_name), view.attempt),
        )
        if not view.addressed:
            unstarted = (("unstarted-slice", view.namespace, view.slice_name), view.attempt)
            tallied = (*tallied, unstarted)
        return tallied
    return (unready,)


def pod_slice(view: PodView) -> tuple[str, str, str]:
    """The index key of a pod's slice: the pod store versions what is filed under it
    (``Store.version``, read by ``reconcile/gangs.py``); a pod not the operator's moves
    no slice's version."""
    if not view.own:
        return ("not-own", view.namespace, view.slice_name)
    return ("slice", view.namespace, view.slice_name)


def node_keys(view: NodeView) -> Keys:
    """The index keys of a TPU node (``runtime/caches.py``)."""
    return {("node", view.name): view, ("tpu",): view}


KeysOf = Callable[[Any], Keys]
"""The index keys of a view (a pure function of it: ``pod_keys``, ``node_keys``)."""
Tallied = tuple[tuple[Any, Any], ...]
Tally = Callable[[Any], Tallied]
"""What a stored view is counted under: (group, value) pairs, none or more."""
NO_COUNTS: Mapping[Any, int] = MappingProxyType({})
NO_LIST_METADATA = ListMetadata()


class Store(Mapping[Any, Collection[Any]]):
    """Objects by index key: ``store[key]`` is a live view of the values under it.

    With ``tally``, the store also keeps, per group, how many views have each value
    (``counts``): a question such as "which restart attempts do this job's pods belong
    to" or "how many of them are not ready yet" is then answered from a few counters,
    not by walking the job's pods.

    With ``versioned`` (view -> one of its index keys), the store numbers each change
    under that key (``version``): whoever worked something out from the views under it
    can tell, from one number, that none of them changed since."""

    def __init__(
        self,
        keys: KeysOf,
        tally: Tally | None = None,
        versioned: Callable[[Any], Any] | None = None,
    ) -> None:
        self._keys_of = keys
        self._views: dict[Identity, Any] = {}
        # The keys an object is filed under are not kept with it: they are worked out
        # from its stored view again when it changes or goes. Kept, they cost a dict and
        # a tuple per key for every pod and node (about 9 MB at 10,000 of each).
        self._keys: dict[Any, dict[Identity, Any]] = {}
        self._tally = tally
        self._counts: dict[Any, Counter[Any]] = {}
        self._versioned = versioned
        self._versions: dict[Any, int] = {}

    def __getitem__(self, key: Any) -> Collection[Any]:
        return self._keys[key].values()

    def get(self, key: Any, default: Any = None) -> Any:
        # Mapping's own ``get`` catches a KeyError per miss: most lookups (a node's pods,
        # a pool's pods) miss, and the exception cost more than the lookup.
        entries = self._keys.get(key)
        return default if entries is None else entries.values()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def objects(self) -> int:
        return len(self._views)

    def identities(self, namespace: str | None = None) -> list[Identity]:
        """Every stored object's identity (of ``namespace`` only, if given)."""
        if namespace is None:
            return list(self._views)
        return [i for i in self._views if i[0] == namespace]

    def counts(self, group: Any) -> Mapping[Any, int]:
        """How many stored views ``tally`` puts in ``group`` with each value (live)."""
        return self._counts.get(group, NO_COUNTS)

    def version(self, key: Any) -> int:
        """A number that changes whenever a view filed under ``key`` (a key ``versioned``
        gives) changes, comes or goes; 0 while nothing is filed under it."""
        return self._versions.get(key, 0)

    def put(self, ident: Identity, view: Any) -> Any:
        """Store ``view`` under its keys, replacing the object's earlier entries; return
        the earlier view (None if the object is new)."""
        old = self._views.get(ident)
        if old is not None and old == view:
            # Most events change nothing a view holds (a node's heartbeat, a pod's
            # annotations): its keys and counts are those filed already.
            return old
        self._views[ident] = view
        keys = self._keys_of(view)
        if old is not None:
            # Most changes keep an object's keys (a pod's phase moves, its slice and
            # job stay): only the keys it left lose it.
            self._unfile(ident, old, keep=keys)
        for key, value in keys.items():
            entries = self._keys.get(key)
            if entries is None:
                entries = self._keys[key] = {}
            entries[ident] = value
        if self._tally is not None:
            before = self._tally(old) if old is not None else ()
            after = self._tally(view)
            if before != after:
                self._count(before, -1)
                self._count(after, 1)
        if old is not None:
            self._version(old)
        self._version(view)
        return old

    def discard(self, ident: Identity) -> Any:
        """Drop an object under every key; return its last view (None if not stored)."""
        view = self._views.pop(ident, None)
        if view is None:
            return None
        self._unfile(ident, view)
        if self._tally is not None:
            self._count(self._tally(view), -1)
        self._version(view)
        return view

    def _version(self, view: Any) -> None:
        if self._versioned is None:
            return
        key = self._versioned(view)
        if key in self._keys:
            self._versions[key] = next(VERSIONS)
        else:  # nothing under it: version 0, like a key never seen
            self._versions.pop(key, None)

    def _count(self, tallied: Tallied, step: int) -> None:
        """Count ``tally``'s (group, value) pairs of a view by ``step``."""
        for group, value in tallied:
            counts = self._counts.get(group)
            if counts is None:
                counts = self._counts[group] = Counter()
            counts[value] += step
            if counts[value] <= 0:
                del counts[value]
                if not counts:
                    del self._counts[group]

    # ``Caches.forget`` drops an object through ``_discard`` (the audit's).
    _discard = discard

    def _unfile(self, ident: Identity, view: Any, keep: Keys | None = None) -> None:
        """Take ``view``'s object out of its keys (but those in ``keep``)."""
        for key in self._keys_of(view):
            if keep is not None and key in keep:
                continue
            entries = self._keys.get(key)
            if entries is not None:
                entries.pop(ident, None)
                if not entries:
                    del self._keys[key]


@dataclass(frozen=True)
class Kind:
    """One watched kind: where it is, and how an object becomes a view and index keys."""

    name: str
    """As ``runtime/caches.KINDS`` names it (metrics, logs)."""
    plural: str
    namespaced: bool
    label_selector: str
    document: type[PodDocument] | type[NodeDocument] | None
    """What of an object is decoded (``state/documents.py``); None: the whole object, as
    plain JSON (custom resources, whose free-form fields a typed document cannot hold:
    ``json``, since orjson and msgspec read an integer beyond 64 bits as a float or not
    at all)."""
    view: Callable[[Any], Any]
    """The cached view of a document, or None to leave the object out."""
    keys: KeysOf
    tally: Tally | None = None
    versioned: Callable[[Any], Any] | None = None
    api: str = "/api/v1"
    """Where the kind is served: its group and version's path."""
    events: msgspec.json.Decoder[Any] = field(init=False, repr=False, compare=False)
    pages: msgspec.json.Decoder[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.document is None:
            # A whole object is cut out of its event or page as raw JSON, decoded alone.
            events: Any = RawWatchEvent
            pages: Any = RawListDocument
        else:
            events = WatchEvent[self.document]  # type: ignore[name-defined]
            pages = ListDocument[self.document]  # type: ignore[name-defined]
        object.__setattr__(self, "events", msgspec.json.Decoder(events))
        object.__setattr__(self, "pages", msgspec.json.Decoder(pages))

    def decoded(self, item: Any) -> Any:
        """The document of one listed or watched object: a whole object's JSON decoded."""
        return json.loads(bytes(item)) if self.document is None else item

    def store(self) -> Store:
        """An empty store of this kind's views."""
        return Store(self.keys, self.tally, self.versioned)

    def path(self, namespace: str | None) -> str:
        if namespace:
            return f"{self.api}/namespaces/{namespace}/{self.plural}"
        return f"{self.api}/{self.plural}"


PODS = Kind(
    "pods",
    "pods",
    True,
    contract.LABEL_SLICE_NAME,
    PodDocument,
    pod_view,
    pod_keys,
    pod_tally,
    pod_slice,
)
NODES = Kind(
    "nodes", "nodes", False, contract.NODE_LABEL_ACCELERATOR, NodeDocument, node_view, node_keys
)


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


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


class ListWatch:
    """List and watch one kind (in ``namespaces``, all if empty) into ``store``;
    ``on_listed`` is called after every complete list, with the number of objects."""

    def __init__(
        self,
        kind: Kind,
        kube: Kube,
        config: Configuration,
        store: Store,
        on_event: OnEvent,
        *,
        namespaces: Collection[str] = (),
        on_listed: Callable[[int], None] | None = None,
        count: Callable[[], None] | None = None,
        view: Callable[[Any], Any] | None = None,
        on_replace: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self.kind = kind
        self.on_replace = on_replace
        """Called with the old and the new view when an event changes a cached view."""
        self.view = view or kind.view
        """An object's view (the kind's, unless the runtime decides more: a pod's
        ownership, ``runtime/ownership.py``)."""
        self.count = count
        """Called for every object listed and every watch event (a metric)."""
        self.kube = kube
        self.config = config
        self.store = store
        self.on_event = on_event
        self.on_listed = on_listed
        self.namespaces: list[str | None] = (
            list(namespaces) if namespaces and kind.namespaced else [None]
        )
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._versions: dict[str | None, str] = {}
        """Per namespace: the resourceVersion to resume watching from."""

    def _where(self, namespace: str | None) -> str:
        where = f"namespace {namespace}" if namespace else "all namespaces"
        return f"{self.kind.name}, {where}" if self.kind.namespaced else self.kind.name

    # Listing ----------------------------------------------------------------------------

    def _put(self, document: Any) -> tuple[Identity, Any, bool]:
        """File an object under its keys: its identity, its view (None: not cached) and
        whether the view changed (most events change nothing the operator reads: a
        node's status, a pod's annotations; those wake nothing)."""
        if self.count is not None:
            self.count()
        ident = identity(document)
        view = self.view(document)
        if view is None:
            return ident, None, False
        old = self.store.put(ident, view)
        changed = old != view
        if changed and old is not None and self.on_replace is not None:
            self.on_replace(old, view)
        return ident, view, changed

    async def list_once(self, namespace: str | None) -> str:
        """List ``namespace`` into the store, drop what it no longer has, and return the
        list's resourceVersion (to watch from)."""
        before = self.store.identities(namespace)  # strictly before the list is requested
        query = {"labelSelector": self.kind.label_selector, "limit": str(LIST_LIMIT)}
        listed: set[str] = set()  # UIDs
        version = ""
        while True:
            page: ListDocument[Any] = await self.kube.request(
                "GET", self.kind.path(namespace), query=query, loads=self._page
            )
            for item in page.items or ():
                ident, view, changed = self._put(self.kind.decoded(item))
                if view is None:
                    continue
                listed.add(ident[2])
                if changed:
                    self.on_event(None, view)
            meta = page.metadata or NO_LIST_METADATA
            version = meta.resourceVersion or version
            token = meta.continue_
            if not token:
                break
            query["continue"] = token
        for ident in stale(before, listed):  # deleted while no watch saw it
            old = self.store.discard(ident)
            if old is not None:
                self.on_event("DELETED", old)
        if self.on_listed is not None:
            self.on_listed(len(listed))
        return version

    async def list_all(self) -> None:
        """The first list of every namespace; retried until the API answers."""
        for namespace in self.namespaces:
            failures = 0
            while True:
                try:
                    version = await self.list_once(namespace)
                    break
                except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    wait = self._backoff(failures, exc)
                    failures += 1
                    log.warning(
                        "listing %s failed: %s; trying again in %.1f s",
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
            name = f"watch-{self.kind.name}-{namespace or 'all'}"
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
                        "listed %s again: %d cached", self._where(namespace), self.store.objects
                    )
                began = asyncio.get_running_loop().time()
                version = await self._watch(namespace, version)
                failures = 0
                if asyncio.get_running_loop().time() - began < 1.0:
                    await asyncio.sleep(BACKOFFS[0])  # a watch closed at once: no busy loop
            except Gone:
                log.info(
                    "the watch of %s is too old to resume (410 Gone): listing again",
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
                    "the watch of %s broke: %s; watching again in %.1f s",
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
            "labelSelector": self.kind.label_selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=seconds + 30)
        async with self._session.get(
            self.kind.path(namespace),
            params=query,
            headers=auth_headers(self.config),
            timeout=timeout,
        ) as response:
            if response.status != 200:
                raise _error(response.status, await response.text(), self.kind.path(namespace))
            async for line in _lines(response.content):
                version = self._apply(line, version)
        return version

    def _page(self, raw: bytes) -> ListDocument[Any]:
        try:
            page: ListDocument[Any] = self.kind.pages.decode(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"a page of {self.kind.name} could not be read: {exc}") from exc
        return page

    def _apply(self, line: bytes, version: str) -> str:
        """Apply one watch event; return the resourceVersion to resume from."""
        try:
            event: WatchEvent[Any] = self.kind.events.decode(line)
        except msgspec.ValidationError:
            _error_event(line, self.kind.name)  # a Status's fields are not a pod's or node's
        kind, document = event.type, event.object
        if document is None or kind == "ERROR":
            _error_event(line, self.kind.name)
        document = self.kind.decoded(document)
        if document is None:  # a whole object's event without one
            _error_event(line, self.kind.name)
        new_version = resource_version(document) or version
        if kind == "BOOKMARK":
            return new_version
        if kind == "DELETED":
            if self.count is not None:
                self.count()
            view = self.view(document)
            self.store.discard(identity(document))
            changed = True
        else:
            _, view, changed = self._put(document)
        if view is not None and changed:
            self.on_event(kind, view)  # DELETED: its final state, newer than the stored one
        return new_version


def identity(document: PodDocument | NodeDocument | dict[str, Any]) -> Identity:
    """How a decoded object is filed in the store (``caches.identity_of``)."""
    if isinstance(document, dict):
        return identity_of(document)
    meta = metadata_of(document)
    return meta.namespace, meta.name, meta.uid


def resource_version(document: PodDocument | NodeDocument | dict[str, Any]) -> str:
    if isinstance(document, dict):
        return str((document.get("metadata") or {}).get("resourceVersion") or "")
    return metadata_of(document).resourceVersion


def _error_event(line: bytes, kind: str) -> NoReturn:
    """A watch line that is not a pod's or node's event: an ERROR (raised as ``Gone`` or
    the apiserver's error), or anything else, raised as a ValueError that says what it
    was (the watch then starts again)."""
    event = loads_core(line)
    body = event.get("object") if isinstance(event, dict) else None
    if not isinstance(body, dict) or event.get("type") != "ERROR":
        raise ValueError(f"a {kind} watch line is not an event of one: {line[:200]!r}")
    if body.get("code") == 410:
        raise Gone()
    raise status_error("WATCH", kind, int(body.get("code") or 500), body)


def _error(status: int, text: str, path: str) -> Exception:
    return Gone() if status == 410 else status_error("WATCH", path, status, decode(text))
