"""When each key last happened, for "not again within N seconds" decisions.

Used for status-write pacing, requested pod deletions and reconcile spacing. Entries older
than ``keep`` seconds decide nothing any more and are dropped as newer ones are marked, so
the map holds only the keys marked in the last ``keep`` seconds.

The entries are kept in the order they were marked (a key marked again moves to the end),
so the stale ones are always at the front and dropping them costs one step each. A gang
restart of a 12,736-pod job marks every pod's deletion within a few seconds, all younger
than ``keep``: a map pruned by rebuilding it past a size limit would pass over every one
of them on every mark, quadratic in the size of the job (bench/HISTORY.md, entry
131e700).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Stamps(Generic[K]):
    def __init__(self, keep: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self._clock = clock
        self._at: OrderedDict[K, float] = OrderedDict()

    def mark(self, key: K) -> None:
        now = self._clock()
        at = self._at
        if key in at:
            at.move_to_end(key)
        at[key] = now
        cutoff = now - self.keep
        # The front is the oldest mark (the clock is monotonic); ``key`` itself is never
        # older than the cutoff, so the loop ends at it at the latest.
        while True:
            oldest = next(iter(at))
            if at[oldest] >= cutoff:
                break
            del at[oldest]

    def age(self, key: K) -> float | None:
        """Seconds since ``key`` was last marked (None: never, or forgotten)."""
        at = self._at.get(key)
        return None if at is None else self._clock() - at

    def __len__(self) -> int:
        return len(self._at)

    def live(self) -> int:
        """How many keys were marked in the last ``keep`` seconds (the older ones are
        dropped now, as a mark would)."""
        at = self._at
        cutoff = self._clock() - self.keep
        while at:
            oldest = next(iter(at))
            if at[oldest] >= cutoff:
                break
            del at[oldest]
        return len(at)
