"""A level-triggered work queue: each key reconciled by one worker at a time.

Watch events only say "look at this key again"; a burst of events for one key collapses
into one reconcile, a key that changes while it is being reconciled runs once more after,
and a reconcile can ask to run again after a delay (restart backoff, deadlines, TTLs).
Failures are retried per key with exponential backoff (never sooner than an API error's
Retry-After). The same pattern as
controller-runtime's rate-limited queue, in asyncio.

``min_interval`` spaces the reconciles of one key: an event within that time after the
key's last reconcile waits for the rest of it. A quiet key still reacts at once, but the
hundreds of pod events of a large slice starting or stopping make a handful of reconciles
instead of one per event, each of which looks at every pod of the job. ``spacing``, if
given, says per key how far apart (at least ``min_interval``): a reconcile that looks at
every pod of a job costs in proportion to its pods, so spacing its reconciles in
proportion too keeps its cost per pod the same at any size (``reconcile/pacing.py``).
The queue counts, per key, the events that asked for it since its last reconcile began,
and tells ``spacing`` (None once an ``urgent`` event came): a large job waits for enough
of its pods to change before it looks at all of them again.

``settle``: a key asked for only by ``routine`` events since its last reconcile (pods
being scheduled, starting, becoming ready: progress that changes no decision) waits that
long after its last reconcile, so that the events of the next second are reconciled
together, as Kubernetes' Job controller batches its pods' updates (``syncJobBatchPeriod``,
1 s). Each of those reconciles looks at every pod that changed and writes the same counts
the status pacing would hold back anyway (``reconcile/pacing.py``). Any other event (a
spec change, a failure, the last pod of a gang becoming ready) is not held back.
``settle_of``, if given, says per key how long (a slice of a multislice job settles
longer: ``pacing.shared_interval``).

Keys that are due run in the order they became due, but a key an urgent event asked for
goes ahead of the others (as controller-runtime's priority queue puts the keys of
watch events ahead of those of a resync): when a job's restart writes all its slices at
once, the slice whose pods the restart recreates must not wait behind the reconciles of
the 63 others, which only record that they keep theirs (at 4,096 hosts it started 0.6 s
later). ``add(..., at_once=True)``: an event that by itself decides the next step, once
per step (a mixed restart's barrier lifting), waits for no spacing either.

``deadline``: a reconcile that runs longer is cancelled, logged (with what to look at) and
retried with the failure backoff. Cancelling one is safe anywhere: a reconcile commits its
decision to the object's status in one write before it acts, and every act is idempotent,
so the next one finds the committed status and acts again (a write that was on its way
when the reconcile was cancelled has landed or not, as after a lost connection).

A failure is logged as one line per attempt, with the delay before the next one. Errors of
the ``quiet`` types (failed API requests: they name the request and the apiserver's answer)
get no traceback: during an apiserver outage every key fails every few seconds, and a
traceback each time said nothing the one line does not. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from tpu_operator.runtime.stamps import Stamps

K = TypeVar("K", bound=Hashable)
Handler = Callable[[K], Awaitable[float | None]]
Observer = Callable[[str, float, bool], None]
Spacing = Callable[[K, int | None], float]
"""Per key: how far apart its reconciles, given the events since its last reconcile
began (None: one of them was urgent)."""

log = logging.getLogger(__name__)

URGENT, ORDINARY = 0, 1
"""Priorities of due keys (``WorkQueue._put``): lower runs first."""


def retry_delay(
    failures: int, base: float, maximum: float, retry_after: float | None = None
) -> float:
    """Seconds before the next attempt of a key that failed ``failures`` times in a row:
    exponential from ``base`` up to ``maximum``, and never sooner than the apiserver's
    Retry-After (a 429 of API Priority and Fairness), as client-go's clients wait."""
    delay = min(base * 2 ** (failures - 1), maximum)
    return max(delay, min(retry_after or 0.0, maximum))


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        handler: Handler[K],
        *,
        workers: int = 8,
        base_retry: float = 0.5,
        max_retry: float = 60.0,
        observer: Observer | None = None,
        min_interval: float = 0.0,
        spacing: Spacing[K] | None = None,
        settle: float = 0.0,
        settle_of: Callable[[K], float] | None = None,
        quiet: tuple[type[Exception], ...] = (),
        deadline: float | None = None,
    ) -> None:
        self.name = name
        self.deadline = deadline
        self.min_interval = min_interval
        self.settle = settle
        self._spacing_of = spacing
        self._settle_of = settle_of
        # Stamps older than this are dropped; per-key spacing and settling can be longer
        # than the minimum (they are capped well below a minute: reconcile/pacing.py).
        per_key = spacing is not None or settle_of is not None
        self._finished: Stamps[K] = Stamps(60.0 if per_key else max(min_interval, settle))
        self._stamped = per_key or min_interval > 0 or settle > 0
        """Whether any wait depends on a key's last reconcile (else none is recorded)."""
        self._handler = handler
        self._workers = workers
        self._base_retry = base_retry
        self._max_retry = max_retry
        self._observer = observer
        self._quiet = quiet
        self._ready: asyncio.PriorityQueue[tuple[int, int, K]] = asyncio.PriorityQueue()
        self._queued: dict[K, int] = {}
        """Keys due to run, each with the priority of its entry in ``_ready`` (an entry
        of another priority is left behind by a key moved ahead, and skipped)."""
        self._running: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._changes: dict[K, int] = {}
        """Events for each key since its last reconcile began."""
        self._urgent: set[K] = set()
        """Keys asked for by an urgent event since their last reconcile began."""
        self._at_once: set[K] = set()
        """Keys asked for by an event that waits for no spacing since their last
        reconcile began."""
        self._prompt: set[K] = set()
        """Keys asked for by an event that is neither urgent nor routine since their last
        reconcile began (``settle`` does not apply to them)."""
        self._delayed: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._spaced: set[K] = set()
        """Keys whose wake in ``_due`` only waits out an event's spacing: a reconcile
        that runs sooner (an urgent event) makes it pointless, and drops it."""
        self._counter = itertools.count()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def add(
        self,
        key: K,
        after: float = 0.0,
        *,
        urgent: bool = False,
        routine: bool = False,
        at_once: bool = False,
    ) -> None:
        """Reconcile ``key`` (again), now or after ``after`` seconds. Without a delay this
        is an event: it counts towards the key's changes (``spacing``); an ``urgent`` one
        waits for no more of them and goes ahead of keys no urgent event asked for, a
        ``routine`` one may wait for ``settle``, an ``at_once`` one (urgent too) waits for
        no spacing at all."""
        if after <= 0:
            self._changes[key] = self._changes.get(key, 0) + 1
            if urgent or at_once:
                self._urgent.add(key)
            elif not routine:
                self._prompt.add(key)
            if at_once:
                self._at_once.add(key)
        self._schedule(key, after)

    def _put(self, key: K) -> None:
        """Make ``key`` due now: ahead of the others if an urgent event asked for it; a
        key already due moves ahead when an urgent event comes."""
        priority = URGENT if key in self._urgent else ORDINARY
        if self._queued.get(key, ORDINARY + 1) <= priority:
            return
        self._queued[key] = priority
        self._ready.put_nowait((priority, next(self._counter), key))

    def _schedule(self, key: K, after: float) -> None:
        spaced = after <= 0  # an event waiting for its spacing, not a requested delay
        if after <= 0:
            if key in self._running:
                self._dirty.add(key)
                return
            if key in self._queued:
                self._put(key)  # moved ahead if an urgent event asked for it
                return
            after = self._spacing(key)
            if after <= 0:
                self._put(key)
                return
        due = time.monotonic() + after
        current = self._due.get(key)
        if current is not None and current <= due:
            if not spaced:  # the earlier wake now stands for one that was asked for too
                self._spaced.discard(key)
            return
        if current is not None and key not in self._spaced:
            spaced = False  # it replaces a wake that was asked for: never dropped either
        self._due[key] = due
        if spaced:
            self._spaced.add(key)
        else:
            self._spaced.discard(key)
        heapq.heappush(self._delayed, (due, next(self._counter), key))
        self._wakeup.set()

    def _spacing(self, key: K) -> float:
        """How long an event for ``key`` waits: the rest of ``min_interval`` (or of its
        ``spacing``, or of ``settle`` if only routine events asked) since its last
        reconcile finished."""
        age = self._finished.age(key)
        if age is None or key in self._at_once:
            return 0.0
        wanted = self.min_interval
        urgent = key in self._urgent
        if self._spacing_of is not None:
            changes = None if urgent else self._changes.get(key, 0)
            wanted = max(wanted, self._spacing_of(key, changes))
        if not urgent and key not in self._prompt and self._changes.get(key):
            wanted = max(wanted, self.settle if self._settle_of is None else self._settle_of(key))
        return wanted - age

    def __len__(self) -> int:
        return len(self._queued) + len(self._delayed)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"{self.name}-worker-{i}")
            for i in range(self._workers)
        ]
        self._tasks.append(asyncio.create_task(self._timer(), name=f"{self.name}-timer"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _timer(self) -> None:
        while True:
            now = time.monotonic()
            while self._delayed and self._delayed[0][0] <= now:
                due, _, key = heapq.heappop(self._delayed)
                if self._due.get(key) == due:
                    del self._due[key]
                    self._spaced.discard(key)
                    self._schedule(key, 0.0)
            timeout = self._delayed[0][0] - now if self._delayed else None
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _work(self) -> None:
        while True:
            priority, _, key = await self._ready.get()
            if self._queued.get(key) != priority:
                continue  # left behind when the key moved ahead (or ran already)
            del self._queued[key]
            self._running.add(key)
            self._changes.pop(key, None)  # this reconcile sees them all
            self._urgent.discard(key)
            self._at_once.discard(key)
            self._prompt.discard(key)
            if key in self._spaced:  # this reconcile sees what the spaced wake waited for
                self._spaced.discard(key)
                self._due.pop(key, None)
            started = time.monotonic()
            ok = True
            try:
                async with asyncio.timeout(self.deadline) as deadline:
                    again = await self._handler(key)
                self._failures.pop(key, None)
                if again is not None:
                    self._schedule(key, max(again, 0.001))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ok = False
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = retry_delay(
                    failures, self._base_retry, self._max_retry, getattr(exc, "retry_after", None)
                )
                if isinstance(exc, TimeoutError) and deadline.expired():
                    log.warning(
                        "%s %s: the reconcile passed its deadline of %g s and was cancelled; "
                        "retrying in %.1f s. Its decisions are committed before it acts, so "
                        "the next one goes on from there. If this repeats: look for a slow "
                        "apiserver (tpu_operator_api_request_duration_seconds) or worker "
                        "supervisors that do not answer (the object's pods), or raise "
                        "--reconcile-deadline for objects of thousands of hosts",
                        self.name,
                        _describe(key),
                        self.deadline,
                        delay,
                    )
                elif isinstance(exc, self._quiet):
                    log.warning(
                        "%s %s: reconcile failed (%s); retrying in %.1f s",
                        self.name,
                        _describe(key),
                        exc,
                        delay,
                    )
                else:
                    log.exception(
                        "%s: reconciling %s failed; retrying in %.1f s", self.name, key, delay
                    )
                self._schedule(key, delay)
            finally:
                self._running.discard(key)
                if self.min_interval > 0 or self.settle > 0 or self._spacing_of is not None:
                    self._finished.mark(key)
                if self._observer is not None:
                    self._observer(self.name, time.monotonic() - started, ok)
            if key in self._dirty:
                self._dirty.discard(key)
                self._schedule(key, 0.0)


def _describe(key: Hashable) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)
