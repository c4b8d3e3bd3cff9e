"""When each key last happened, for "not again within N seconds" decisions.

Used for status-write pacing, requested pod deletions and reconcile spacing. Entries older
than ``keep`` seconds decide nothing any more; they are dropped once there are many, so
the map stays bounded by the keys active in the last ``keep`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Stamps(Generic[K]):
    def __init__(
        self, keep: float, clock: Callable[[], float] = time.monotonic, limit: int = 4096
    ) -> None:
        self.keep = keep
        self._clock = clock
        self._limit = limit
        self._at: dict[K, float] = {}

    def mark(self, key: K) -> None:
        now = self._clock()
        self._at[key] = now
        if len(self._at) > self._limit:
            cutoff = now - self.keep
            self._at = {k: t for k, t in self._at.items() if t >= cutoff}

    def age(self, key: K) -> float | None:
        """Seconds since ``key`` was last marked (None: never, or forgotten)."""
        at = self._at.get(key)
        return None if at is None else self._clock() - at
