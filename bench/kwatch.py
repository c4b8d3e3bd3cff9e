"""The benchmark process's own view of the cluster: timed watches (requests and streams go
through the node agent's JSON client, authenticated as the admin).

Every timing of the control-plane benchmarks comes from here, for every variant alike:
a watch stream per namespace records, on this process's monotonic clock
(``time.monotonic``, CLOCK_MONOTONIC, shared by all processes of the machine), when each
pod was first seen, first seen Running and seen deleted. The operator, the bare client
and JobSet are judged by the same observer, so its own delay cancels out of the ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness import say

from localcluster import Cluster
from localcluster.agent.kube import Kube, WatchExpired


def connect(cluster: Cluster, *, limit: int = 32) -> Kube:
    """The node agent's async JSON client, authenticated as the cluster admin."""
    pki = cluster.layout.pki
    return Kube(
        cluster.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key", connections=limit
    )


PROGRESS_EVERY = 60.0
"""Seconds between the progress lines of a long ``Watch.wait``."""


@dataclass
class Seen:
    """What the watch saw of one object (times on the monotonic clock)."""

    name: str
    uid: str
    labels: dict[str, str]
    added: float
    running: float | None = None
    deleting: float | None = None
    """First seen with a deletionTimestamp (or deleted outright)."""
    deleted: float | None = None
    phase: str | None = None
    status: dict[str, Any] = field(default_factory=dict)


class Watch:
    """A timed watch of one collection (pods, TPUJobs, ...) in one namespace."""

    def __init__(self, api: Kube, path: str, *, running: Callable[[dict], bool] | None = None):
        self.api = api
        self.path = path
        self.objects: dict[str, Seen] = {}
        self.history: list[tuple[float, str, str, dict[str, Any]]] = []
        """(time, event type, name, status) of every event, for status-phase timings."""
        self._running = running or (lambda o: (o.get("status") or {}).get("phase") == "Running")
        self.reconnects = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Watch:
        listing = await self.api.call("GET", self.path)
        now = time.monotonic()
        for item in listing.get("items") or []:
            self._apply("ADDED", item, now)
        version = listing["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._run(version))
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, version: str) -> None:
        """Follow the stream; when the server ends it, go on from the last version seen,
        or, when that version is too old (a loaded apiserver ended many watches), list
        again (``_relist``)."""
        while True:
            params = {"resourceVersion": version, "timeoutSeconds": "3600"}
            try:
                async for event in self.api.watch(self.path, params):
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._apply(event["type"], event["object"], time.monotonic())
            except WatchExpired:
                version = await self._relist()
            self.reconnects += 1

    async def _relist(self) -> str:
        """List again: every object listed is applied as changed, every one known alive
        and not listed as deleted (now: the event's time is lost)."""
        listing = await self.api.call("GET", self.path)
        now = time.monotonic()
        listed = set()
        for item in listing.get("items") or []:
            listed.add(item["metadata"]["uid"])
            self._apply("MODIFIED", item, now)
        for uid, name in self._alive().items():
            if uid not in listed:
                self._apply("DELETED", {"metadata": {"uid": uid, "name": name}}, now)
        return str(listing["metadata"]["resourceVersion"])

    def _alive(self) -> dict[str, str]:
        """UID -> name of the objects seen and not deleted."""
        return {uid: s.name for uid, s in self.objects.items() if s.deleted is None}

    def _apply(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        uid = meta["uid"]
        seen = self.objects.get(uid)
        if seen is None:
            seen = self.objects[uid] = Seen(meta["name"], uid, meta.get("labels") or {}, now)
        status = obj.get("status") or {}
        seen.phase = status.get("phase")
        seen.status = status
        if seen.running is None and self._running(obj):
            seen.running = now
        if seen.deleting is None and (meta.get("deletionTimestamp") or kind == "DELETED"):
            seen.deleting = now
        if kind == "DELETED":
            seen.deleted = now
        self.history.append((now, kind, meta["name"], status))
        self._changed.set()

    async def wait(
        self,
        check: Callable[[], Any],
        timeout: float,  # noqa: ASYNC109
        what: str,
        every: float = 0.0,
    ) -> float:
        """Wait until ``check()`` holds; return the monotonic time it was first seen true.

        ``check`` runs after each change seen, but at most once per ``every`` seconds: for
        a check that walks thousands of objects and whose figure comes from the times the
        watch recorded, not from when it first held (the returned time is then up to
        ``every`` late). The benchmark's process plays the cluster's hosts on the cores
        the measured processes use, and a walk per watch event took a sixth of it."""
        began = time.monotonic()
        deadline, report = began + timeout, began + PROGRESS_EVERY
        while not check():
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError(f"watch {self.path} ended")
            if time.monotonic() >= report:  # long waits say where they are
                report += PROGRESS_EVERY
                say(f"waiting {time.monotonic() - began:.0f} s for {what}; {self.describe()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}; seen: {self.describe()}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            if every:
                await asyncio.sleep(every)  # the changes meanwhile: one check for them all
        return time.monotonic()

    def describe(self) -> str:
        """Counts by phase of the objects alive and deleted (for error messages)."""
        counts: dict[str, int] = {}
        for seen in self.objects.values():
            key = f"{seen.phase}{'' if seen.deleted is None else ' (deleted)'}"
            counts[key] = counts.get(key, 0) + 1
        return f"{counts}, {self.reconnects} reconnects, {len(self.history)} events"

    # Pod figures -----------------------------------------------------------------------

    def group(self, label: str, value: str) -> list[Seen]:
        return [s for s in self.objects.values() if s.labels.get(label) == value]

    def alive(self) -> list[Seen]:
        return [s for s in self.objects.values() if s.deleted is None]

    @staticmethod
    def nth(times: list[float | None], count: int) -> float | None:
        """When the ``count``-th of these events happened (None if fewer happened)."""
        known = sorted(t for t in times if t is not None)
        return known[count - 1] if len(known) >= count else None

    def created_at(self, label: str, value: str, count: int) -> float | None:
        return self.nth([s.added for s in self.group(label, value)], count)

    def running_at(self, label: str, value: str, count: int) -> float | None:
        return self.nth([s.running for s in self.group(label, value)], count)

    def deleting_at(self, label: str, value: str, count: int = 1) -> float | None:
        return self.nth([s.deleting for s in self.group(label, value)], count)

    def gone_at(self, label: str, value: str) -> float | None:
        group = self.group(label, value)
        if not group or any(s.deleted is None for s in group):
            return None
        return max(s.deleted for s in group if s.deleted is not None)

    def phase_at(self, name: str, phase: str, since: float, **status: Any) -> float | None:
        """First time after ``since`` that object ``name`` was seen in ``phase``."""
        for at, _, seen_name, seen in self.history:
            if at < since or seen_name != name or seen.get("phase") != phase:
                continue
            if all(seen.get(k) == v for k, v in status.items()):
                return at
        return None


def status_writes(history: list[tuple[float, str, str, dict[str, Any]]]) -> dict[str, int]:
    """How many status changes a watch saw, by what each changed: for every MODIFIED event
    whose status differs from the object's last one, the status fields that differ (a
    condition by its type, ``~`` when only its message or timestamps moved), joined by
    ``+``. Tells material writes from counters-only ones."""
    last: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for _, kind, name, status in history:
        before = last.get(name)
        last[name] = status
        if kind != "MODIFIED" or before is None or before == status:
            continue
        key = "+".join(_changed_fields(before, status)) or "(order)"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changed = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        if key != "conditions":
            changed.append(key)
            continue
        before = {c.get("type"): c for c in old.get("conditions") or []}
        after = {c.get("type"): c for c in new.get("conditions") or []}
        for kind in sorted(set(before) | set(after), key=str):
            a, b = before.get(kind) or {}, after.get(kind) or {}
            if a == b:
                continue
            material = (a.get("status"), a.get("reason")) != (b.get("status"), b.get("reason"))
            changed.append(f"{kind}" if material else f"{kind}~")
    return changed
