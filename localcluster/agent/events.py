"""Core/v1 Events about pods, posted the way the kubelet's event recorder does.

A repeated event (same pod, container, type, reason and message) is not posted again: the
first occurrence creates an Event named ``<pod>.<hex nanoseconds>`` and later ones raise
its ``count`` and ``lastTimestamp`` with a merge patch, written at most once per
``FLUSH_INTERVAL`` seconds per event (client-go's event correlator does the same
deduplication). New distinct events of one pod are rate-limited by a token bucket as
client-go's spam filter does (``BURST`` events, then one more per ``REFILL`` seconds);
events beyond it are dropped with a debug log. Writes go through the agent's
:class:`~localcluster.agent.writer.Writer` (bounded concurrency, retries) under a key of
their own, so they never replace a pod's status write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localcluster.agent.kube import MERGE_PATCH, Kube
from localcluster.agent.status import now

log = logging.getLogger(__name__)

BURST = 25
REFILL = 300.0
FLUSH_INTERVAL = 10.0

Submit = Callable[[Hashable, Callable[[], Awaitable[None]]], None]


@dataclass
class Bucket:
    """A token bucket: ``take`` is True while tokens are left (pure apart from ``clock``)."""

    tokens: float = BURST
    stamp: float = 0.0

    def take(self, at: float, burst: int = BURST, refill: float = REFILL) -> bool:
        self.tokens = min(float(burst), self.tokens + (at - self.stamp) / refill)
        self.stamp = at
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Event:
    name: str
    body: dict[str, Any]
    count: int = 1
    created: bool = False
    written_count: int = 0
    flush: asyncio.TimerHandle | None = None
    last_write: float = field(default=-float("inf"))


class EventRecorder:
    """Posts deduplicated, rate-limited pod events; ``submit`` queues a keyed write (the
    caller decides whether the node can reach the apiserver at all)."""

    def __init__(
        self,
        kube: Kube,
        submit: Submit,
        component: str = "kubelet",
        *,
        burst: int = BURST,
        refill: float = REFILL,
        flush_interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.kube = kube
        self.submit = submit
        self.component = component
        self.burst, self.refill, self.flush_interval = burst, refill, flush_interval
        self._events: dict[tuple[str, ...], _Event] = {}
        self._buckets: dict[str, Bucket] = {}

    def record(
        self,
        pod: Mapping[str, Any],
        *,
        kind: str,
        reason: str,
        message: str,
        container: str | None = None,
    ) -> None:
        meta = pod["metadata"]
        uid = str(meta["uid"])
        key = (uid, container or "", kind, reason, message)
        clock = time.monotonic()
        event = self._events.get(key)
        if event is None:
            bucket = self._buckets.setdefault(uid, Bucket(tokens=self.burst, stamp=clock))
            if not bucket.take(clock, self.burst, self.refill):
                log.debug(
                    "event for pod %s dropped (rate limit): %s %s", meta["name"], reason, message
                )
                return
            event = _Event(
                f"{meta['name']}.{time.time_ns():x}",
                self._body(pod, kind, reason, message, container),
            )
            self._events[key] = event
        else:
            event.count += 1
        if clock - event.last_write >= self.flush_interval:
            self._write(key, event)
        elif event.flush is None:
            delay = self.flush_interval - (clock - event.last_write)
            event.flush = asyncio.get_running_loop().call_later(delay, self._write, key, event)

    def forget(self, uid: str) -> None:
        """The pod is gone: drop its bookkeeping (pending count updates are not written)."""
        for key in [k for k in self._events if k[0] == uid]:
            event = self._events.pop(key)
            if event.flush is not None:
                event.flush.cancel()
        self._buckets.pop(uid, None)

    def _body(
        self, pod: Mapping[str, Any], kind: str, reason: str, message: str, container: str | None
    ) -> dict[str, Any]:
        meta = pod["metadata"]
        node = pod.get("spec", {}).get("nodeName", "")
        involved: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        return {
            "metadata": {"namespace": meta["namespace"]},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": self.component, "host": node},
            "reportingComponent": self.component,
            "reportingInstance": node,
        }

    def _write(self, key: tuple[str, ...], event: _Event) -> None:
        event.flush = None
        event.last_write = time.monotonic()
        stamp = now()
        namespace = event.body["metadata"]["namespace"]
        path = f"/api/v1/namespaces/{namespace}/events"

        async def write() -> None:
            count = event.count
            if count == event.written_count:
                return
            if not event.created:
                body = {
                    **event.body,
                    "metadata": {"name": event.name, "namespace": namespace},
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": count,
                }
                await self.kube.call("POST", path, body, ok=(404, 409))
                event.created = True
            else:
                body = {"count": count, "lastTimestamp": stamp}
                await self.kube.call(
                    "PATCH", f"{path}/{event.name}", body, content_type=MERGE_PATCH, ok=(404,)
                )
            event.written_count = count

        self.submit(("event", *key), write)
