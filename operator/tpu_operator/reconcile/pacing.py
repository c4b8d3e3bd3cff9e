"""Spacing of status writes that only move counters, and of a large job's reconciles.

While hundreds of pods start or stop, nearly every pod event changes a count in its job's
and slice's status ("waiting for 183 pods of the previous attempt to stop"). Writing each
one costs a status write per pod event: at 256 hosts over a hundred writes per gang
restart, each validated by the apiserver and sent to every watcher, slowing the very pod
churn they report. Writes that change only counters and messages are therefore spaced at
least ``interval`` apart per object; a write that changes anything else (phase, attempt,
condition status or reason, failures, timestamps, progress, the goodput carried over from
finished attempts) goes out at once. The slices of a multislice job space theirs further:
the job's status already carries each slice's ready count, recounted from the pods, so the
job's slices together write counters about as often as the job does (``sharing``).

On a busy cluster the counters-only writes of all objects together are spaced too: once
more objects than ``BUSY_WRITES`` wrote their status in the last ``MAX_BUSY_INTERVAL``
seconds, each object's counters wait that many objects / ``BUSY_WRITES`` seconds (at most
``MAX_BUSY_INTERVAL``). With a thousand jobs starting at once on a cluster that starts
fourteen pods a second, every slice and job wrote its moving counts about every second
for the minutes its pods took: 4.4 status writes per TPUSlice and 3.5 per TPUJob where two
say everything (bench/HISTORY.md, 2026-12-06), each one validated and stored by the
apiserver and sent back to every watcher while the cluster was busiest. Phases,
conditions and everything else material still go out at once.

A reconcile of a job looks at every one of its slices, and at every pod of the slices
whose pods changed since the last one (``reconcile/gangs.py``), so its cost grows with the
job; while pods start or stop, events keep arriving and the job is reconciled as often as
its spacing allows. ``reconcile_spacing`` grows that spacing with the job's pods (``PER_POD``
seconds each, never under the operator's minimum nor over ``MAX_SPACING``): up to 1,000
pods nothing changes; a 12,736-pod job is looked at no more than every 1.3 s.

Time alone still lets the reconciles of a large job cost in proportion to how long its
pods take to start: on a cluster that starts ten pods a second, a 12,736-pod job is
reconciled a thousand times while it starts, each reconcile looking at every pod. So a
large object's reconcile also waits for changes: until events arrived on
``CHANGED_SHARE`` of its pods since its last reconcile began, it waits ``QUIET_FACTOR``
times its spacing (at most ``MAX_SPACING``) instead. The number of reconciles then
follows the number of pod events, not the seconds they are spread over (186 instead of
852 while a 12,736-pod job started: bench/HISTORY.md, entry acba012). An event that may
end the gang's attempt (a failure, an eviction, a deletion, a lost node: ``urgent``) waits
only for the spacing, so a restart is decided as soon as before.

At every size, routine progress (pods being scheduled, starting, becoming ready, and the
stops of an attempt the job has left) is also batched by the work queue's ``settle`` time
(``runtime/workqueue.py``), unless an event makes the last pod of a gang's attempt ready,
or the last pod of one slice of a job, whose phase it moves (``Runtime.pod_event``). A
slice of an N-slice job settles N times as long, 10 s at most (``shared_interval``): a
reconcile that only routine progress asked for changes nothing but its counters, and
those it would hold back that long anyway. On a cluster that starts or stops a large
job's pods a few a second, each of its slices otherwise got one reconcile a second for as
long as that took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from tpu_operator.runtime.stamps import Stamps

COUNTER_FIELDS = frozenset(
    {"ready", "readyWorkers", "slicesReady", "message", "activePods", "terminatingPods"}
)
"""Top-level status fields that only count or describe; conditions' ``message``, a job's
slice summaries' ``readyWorkers`` and ``phase`` (each TPUSlice's own status carries its
phase at once; the job's phase is decided from the pods), are treated the same way, and
so is the goodput account except ``finishedAttempts`` (the rest is recomputed from the
clock on every reconcile)."""
GOODPUT_STATE = "finishedAttempts"
DEFAULT_INTERVAL = 1.0
MAX_SHARED_INTERVAL = 10.0
"""Longest a slice's counters wait for its job's sake, whatever the size of its job."""
BUSY_WRITES = 20.0
"""Counters-only writes per second that all objects together come to while more than
this many objects are writing (``StatusPacer.spaced``)."""
MAX_BUSY_INTERVAL = 30.0
"""Longest any object's counters wait (``kubectl get`` is never more stale than this)."""
PER_POD = 0.0001
"""Seconds of reconcile spacing per pod of the object (0.1 s per 1,000 pods)."""
SPACED_FROM = 1000
"""Objects of up to this many pods keep the operator's minimum as it is (even 0)."""
MAX_SPACING = 5.0
CHANGED_SHARE = 1 / 64
"""Share of a large object's pods whose events make its next reconcile worth its cost
(199 events for 12,736 pods; each pod sends about four while it starts)."""
QUIET_FACTOR = 4.0
"""How many times its spacing a large object waits while fewer events than that came."""


def shared_interval(interval: float, sharing: int) -> float:
    """``sharing`` times ``interval``, at most ``MAX_SHARED_INTERVAL`` and never less than
    ``interval``: how far apart one of ``sharing`` objects, whose counts one status
    carries, writes its counters, and (``Runtime``) how long routine progress settles before
    it is reconciled."""
    return max(interval, min(MAX_SHARED_INTERVAL, interval * sharing))


def reconcile_spacing(pods: int, minimum: float, changes: int | None = None) -> float:
    """Least time between two reconciles of an object with ``pods`` worker pods.

    ``changes``: the events that asked for this reconcile since the last one began;
    None if one of them may end the gang's attempt (it waits only for the spacing)."""
    if pods <= SPACED_FROM:
        return minimum
    spacing = max(minimum, min(MAX_SPACING, pods * PER_POD))
    if changes is None or changes >= pods * CHANGED_SHARE:
        return spacing
    return max(spacing, min(MAX_SPACING, spacing * QUIET_FACTOR))


def clock_only(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True if ``new`` differs from ``old`` at most in the live goodput account, which a
    job recomputes from the clock at every reconcile: no reason for a write by itself (it
    goes out with the next write that changes anything else, and with progress while the
    job runs). A job rechecked every 30 s while it waited minutes for a busy scheduler
    wrote its goodput alone each time: 1,411 of 4,067 TPUJob status writes at 1,000 jobs
    (bench/HISTORY.md, 2026-12-07)."""
    return _without_live_goodput(old) == _without_live_goodput(new)


def _without_live_goodput(status: dict[str, Any]) -> dict[str, Any]:
    goodput = status.get("goodput")
    if not isinstance(goodput, dict):
        return status
    return {**status, "goodput": goodput.get(GOODPUT_STATE)}


def counters_only(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True if ``new`` differs from ``old`` at most in counters and messages."""
    return _material(old) == _material(new)


INTENT_FIELDS = (
    "uid",
    "generation",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
)
"""What of a TPUJob's or TPUSlice's metadata a reconcile reads; ``generation`` moves with
every change of the spec (both kinds have a status subresource)."""


def intent(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything of a TPUJob or TPUSlice but its status (``generation`` stands for the
    spec). Only the operator writes their status, so an event that leaves this unchanged
    is the echo of its own status write: the reconcile that wrote it saw everything the
    event shows, and asked to run again if it must."""
    meta = body.get("metadata") or {}
    return tuple(meta.get(name) for name in INTENT_FIELDS)


def material_slice(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a TPUSlice its job reads, without the counters: a slice event that leaves
    it unchanged tells the job nothing its pods' events did not."""
    meta = body.get("metadata") or {}
    status = body.get("status")
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        _material(dict(status)) if isinstance(status, Mapping) else status,
    )


K = TypeVar("K", bound=Hashable)


class LastSeen(Generic[K]):
    """The last fingerprint (``intent``, ``material_slice``) seen of each object, to tell
    an event that changed it from one that did not."""

    def __init__(self) -> None:
        self._last: dict[K, Any] = {}

    def changed(self, key: K, type: str | None, fingerprint: Any) -> bool:
        """Whether this event changed ``key``'s fingerprint (a deletion always does, and
        forgets it)."""
        if type == "DELETED":
            self._last.pop(key, None)
            return True
        if self._last.get(key) == fingerprint:
            return False
        self._last[key] = fingerprint
        return True

    def keep_only(self, keep: Callable[[K], bool]) -> None:
        """Forget the objects ``keep`` rejects (gone without a DELETED event)."""
        for key in [k for k in self._last if not keep(k)]:
            del self._last[key]

    def __len__(self) -> int:
        return len(self._last)


def _material(status: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in status.items() if k not in COUNTER_FIELDS}
    if isinstance(kept.get("conditions"), list):
        kept["conditions"] = [_without(c, "message") for c in kept["conditions"]]
    if isinstance(kept.get("slices"), list):
        kept["slices"] = [_without(s, *SUMMARY_COUNTERS) for s in kept["slices"]]
    if isinstance(kept.get("goodput"), dict):
        kept["goodput"] = kept["goodput"].get(GOODPUT_STATE)
    return kept


SUMMARY_COUNTERS = ("readyWorkers", "phase")
"""What of a job's summary of one slice (``status.slices[]``) is paced like a counter."""


def _without(item: Any, *keys: str) -> Any:
    return {k: v for k, v in item.items() if k not in keys} if isinstance(item, dict) else item


class StatusPacer:
    """Remembers when each object's status was last written; says how long to hold a
    counters-only write back."""

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        busy_writes: float = BUSY_WRITES,
    ) -> None:
        self.interval = interval
        self.busy_writes = busy_writes
        # Kept as long as the longest hold; how many it holds says how busy the cluster is.
        self._written: Stamps[str] = Stamps(max(interval, MAX_BUSY_INTERVAL), clock)

    def hold(self, uid: str, old: dict[str, Any], new: dict[str, Any], sharing: int = 1) -> float:
        """Seconds to wait before writing ``new`` over ``old`` (0: write now).

        ``sharing``: how many objects share one interval's counters-only writes (a job's
        slices, whose ready counts the job's status carries): each waits that many
        intervals, at most ``MAX_SHARED_INTERVAL`` (and never less than one)."""
        age = self._written.age(uid)
        if age is None or old == new or not counters_only(old, new):
            return 0.0
        return max(0.0, self.spaced(sharing) - age)

    def spaced(self, sharing: int = 1) -> float:
        """Least time between two counters-only writes of one of ``sharing`` objects: the
        shared interval, or, when more objects than ``busy_writes`` wrote in the last
        ``MAX_BUSY_INTERVAL`` seconds, that many / ``busy_writes`` seconds (at most
        ``MAX_BUSY_INTERVAL``), so that all of them together write about ``busy_writes``
        counters a second."""
        own = shared_interval(self.interval, sharing)
        busy = self._written.live() / self.busy_writes
        return max(own, min(MAX_BUSY_INTERVAL, busy))

    def wrote(self, uid: str) -> None:
        self._written.mark(uid)
