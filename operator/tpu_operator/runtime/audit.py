"""The watch-gap audit: the TPUJob and TPUSlice caches checked against the API again.

When a watch breaks (the apiserver restarts, the connection resets) the operator's own
list-and-watch (``runtime/listwatch.py``) watches again from the last resourceVersion, and
when that is gone (410: a restarted apiserver's watch cache starts at the current
revision, or etcd compacted it) lists the resource again and drops the cached objects the
new list lacks: an object deleted during the gap gets no DELETED event. A stale TPUJob or
TPUSlice is the costliest kind of stale entry: after an apiserver restart during a gang
restart it was a job waiting forever for "16 pods of the previous attempt" that no longer
existed (when kopf still watched these kinds: its re-lists never drop anything), and the
periodic resync does not help, since the reconcilers read the same caches.

So the audit checks those two kinds once more: it lists them (metadata only) and drops the
cached objects whose UID the list does not have, then wakes what depended on them. Worker
pods and TPU nodes are left to their watches' re-lists: listing them here too cost a list
of every worker pod and TPU node a minute (25,472 objects with one 12,736-host job), paid
by the operator and the apiserver alike. Which objects are stale is decided by ``stale``,
a pure function: only objects cached *before* the list was requested are judged, since
one created after it may be cached but not listed. It runs:

- shortly after a watch of either kind lists it again (``listed``: the initial listing at
  start-up, and every re-list after a watch gap);
- shortly after the API answers again following failed requests of the operator's own;
- every ``period`` seconds (an emptied collection re-lists without any event).

An audit costs one paged metadata-only list per kind and namespace (about 1 KB per
TPUJob or TPUSlice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpu_operator import contract
from tpu_operator.runtime import collector
from tpu_operator.runtime.caches import Caches, Identity
from tpu_operator.runtime.kube import ApiError, Kube, RequestRecord, namespaced
from tpu_operator.runtime.ownership import slice_job_name

log = logging.getLogger(__name__)

SETTLE_SECONDS = 1.0
"""How long a triggered audit waits first: the re-lists of all kinds after one apiserver
restart, and the operator's first successful requests, make one audit."""
RETRY_SECONDS = 5.0
"""How soon an audit whose lists failed (the API is still away) runs again."""
LAG_SECONDS = 5.0
"""How long an object the list lacks may wait for its DELETED event before the audit
drops it: while hundreds of jobs are deleted at once the watches deliver their events
seconds after a list already lacks them, and those are no watch gap."""


class Queue(Protocol):
    def add(self, key: tuple[str, str], after: float = 0.0) -> None: ...


class Owner(Protocol):
    """What the audit wakes after dropping entries (the runtime)."""

    @property
    def acting(self) -> bool: ...

    @property
    def jobs(self) -> Queue: ...

    @property
    def slices(self) -> Queue: ...

    def wake_waiting(self) -> None: ...


def stale(
    cached: Iterable[Identity], listed: Collection[str], scope: Collection[str] | None = None
) -> list[Identity]:
    """The cached objects the list does not hold (by UID): deleted while the watch was
    away. ``cached`` must be taken before the list was requested. ``scope``: the
    namespaces that were listed (None: all); objects elsewhere are not judged."""
    return sorted(
        (entry for entry in cached if entry[2] not in listed)
        if scope is None
        else (entry for entry in cached if entry[0] in scope and entry[2] not in listed),
        key=lambda entry: (entry[0] or "", entry[1], entry[2]),
    )


@dataclass(frozen=True)
class Source:
    """Where one watched kind is listed."""

    kind: str
    plural: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    label_selector: str | None = None

    def paths(self, namespaces: Collection[str]) -> list[str]:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if not self.namespaced or not namespaces:
            return [f"{base}/{self.plural}"]
        return [
            namespaced(ns, self.plural, group=self.group, version=self.version) for ns in namespaces
        ]


SOURCES = {
    "slices": Source("slices", contract.SLICE_PLURAL, contract.GROUP, contract.VERSION),
    "jobs": Source("jobs", contract.JOB_PLURAL, contract.GROUP, contract.VERSION),
}
"""The kinds the audit lists: the same objects as the operator's TPUSlice and TPUJob
watches."""


@dataclass
class AuditResult:
    reason: str
    dropped: dict[str, list[Identity]] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        parts = []
        for kind, identities in self.dropped.items():
            names = ", ".join(f"{ns}/{name}" if ns else name for ns, name, _ in identities[:5])
            more = f" and {len(identities) - 5} more" if len(identities) > 5 else ""
            parts.append(f"{len(identities)} {kind} ({names}{more})")
        return "; ".join(parts)


class CacheAudit:
    def __init__(
        self,
        kube: Kube,
        caches: Caches,
        owner: Owner,
        *,
        namespaces: Collection[str] = (),
        period: float = 60.0,
        lag: float = LAG_SECONDS,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.owner = owner
        self.namespaces = list(namespaces)
        self.period = period
        self.lag = lag
        self.audits = 0
        self.last: AuditResult | None = None
        self._wanted = asyncio.Event()
        self._reason = ""
        self._unreachable = False
        self._task: asyncio.Task[None] | None = None

    # Triggers -------------------------------------------------------------------------

    def soon(self, reason: str) -> None:
        """Audit within ``SETTLE_SECONDS`` (requests while one is pending coalesce)."""
        if not self._wanted.is_set():
            self._reason = reason
            self._wanted.set()

    def listed(self, kind: str) -> None:
        """A watch of ``kind`` listed it (again): it began anew."""
        self.soon(f"{kind} listed again")

    def api_request(self, record: RequestRecord) -> None:
        """Observe the operator's own requests: after failures for want of an apiserver,
        the first answer means its watches broke too and are coming back."""
        if record.code == 0 or record.code == 429 or record.code >= 500:
            self._unreachable = True
        elif self._unreachable:
            self._unreachable = False
            self.soon("the API answers again")

    # Loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cache-audit")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wanted.wait(), timeout=self.period)
                await asyncio.sleep(SETTLE_SECONDS)
                reason = self._reason
            except TimeoutError:
                reason = "periodic"
            self._wanted.clear()
            try:
                result = await self.audit(reason)
            except ApiError as exc:
                log.warning(
                    "auditing the watch caches (%s) failed: %s; retrying in %.0f s",
                    reason,
                    exc,
                    RETRY_SECONDS,
                )
                await asyncio.sleep(RETRY_SECONDS)
                self.soon(reason)
                continue
            if result.dropped:
                # Either deleted while a watch was interrupted, or the watch is behind the
                # list (thousands of pods deleted at once): the objects are gone either
                # way, and their DELETED events, if they come, change nothing more.
                log.warning(
                    "watch caches (%s): dropped %s, gone from the API but still cached "
                    "(deleted while a watch was interrupted, or the watch is behind)",
                    reason,
                    result.describe(),
                )
            else:
                log.debug("watch caches (%s) match the API (%.2f s)", reason, result.seconds)
            # The lists' pages (every TPUJob's and TPUSlice's metadata, managed fields
            # included: about 10 MB with 1,000 jobs) are decoded and gone: hand the memory
            # back now rather than at the next periodic trim (``runtime/collector.py``).
            await collector.trim_off_loop()

    async def any_exist(self, kinds: Iterable[str]) -> bool:
        """Whether the API has any object of ``kinds`` (in the watched namespaces)."""
        for kind in kinds:
            source = SOURCES[kind]
            for path in source.paths(self.namespaces):
                if await self.kube.list_metadata(path, label_selector=source.label_selector):
                    return True
        return False

    async def audit(self, reason: str = "requested") -> AuditResult:
        """List the audited kinds; drop the cached objects the API no longer has and whose
        DELETED event has not come ``lag`` seconds later."""
        started = time.monotonic()
        result = AuditResult(reason)
        candidates: dict[str, tuple[list[Identity], dict[Identity, Any]]] = {}
        for kind in SOURCES:
            before = self.caches.entries(kind)  # strictly before the list is requested
            source = SOURCES[kind]
            listed: set[str] = set()
            for path in source.paths(self.namespaces):
                for meta in await self.kube.list_metadata(
                    path, label_selector=source.label_selector
                ):
                    listed.add(meta.get("uid", ""))
            scope = self.namespaces if source.namespaced and self.namespaces else None
            gone = stale(before, listed, scope)
            if gone:
                candidates[kind] = (gone, before)
        if candidates and self.lag > 0:
            await asyncio.sleep(self.lag)
        for kind, (gone, before) in candidates.items():
            cached = self.caches.entries(kind)
            gone = [identity for identity in gone if identity in cached]
            if gone:
                for identity in gone:
                    self.caches.forget(kind, identity)
                self._wake(kind, {identity: before[identity] for identity in gone})
                result.dropped[kind] = gone
        result.seconds = time.monotonic() - started
        self.audits += 1
        self.last = result
        return result

    def _wake(self, kind: str, dropped: Mapping[Identity, Any]) -> None:
        """What a DELETED event of each dropped object would have woken."""
        owner = self.owner
        if not owner.acting:
            return
        for (namespace, name, _), value in dropped.items():
            if kind == "slices" and namespace:
                owner.slices.add((namespace, name))
                job = slice_job_name(value)
                if job:
                    owner.jobs.add((namespace, job))
            elif kind == "jobs" and namespace:
                owner.jobs.add((namespace, name))
        owner.wake_waiting()
