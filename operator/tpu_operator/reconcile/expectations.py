"""Pod creations and deletions the operator asked for that its watch cache has not shown.

A reconcile that runs right after another one created pods can find some of them still
missing from the cache (the watch trails the API by milliseconds to seconds) and would
POST them again, only to be told 409 Conflict: at 256 hosts that was up to a fifth of all
pod POSTs, each one full admission work for the apiserver. Creations are remembered per
slice until the cache shows the pod or ``ttl`` passes, so a pod deleted before the cache
ever saw it is still created again. Deletions are remembered by pod UID the same way, so
a reconcile does not delete a pod again while the cache still shows it running. The same
idea as the Kubernetes Job controller's "expectations".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from tpu_operator.runtime.stamps import Stamps

Key = tuple[str, str]
"""(namespace, slice name)"""
EXPECTATION_TTL = 30.0
"""How long a creation or deletion is awaited in the cache before it is forgotten (the
watch normally shows it within a second; past this, the cache is trusted again)."""


class CreatedPods:
    def __init__(
        self, ttl: float = EXPECTATION_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._pending: dict[Key, dict[tuple[str, int], float]] = {}

    def created(self, key: Key, pod: str, attempt: int) -> None:
        self._pending.setdefault(key, {})[(pod, attempt)] = self._clock()

    def observe(self, key: Key, seen: Iterable[tuple[str, int]]) -> None:
        """Forget the creations the cache now shows (and the expired ones)."""
        pending = self._pending.get(key)
        if not pending:
            return
        for pod in seen:
            pending.pop(pod, None)
        cutoff = self._clock() - self.ttl
        for pod in [p for p, at in pending.items() if at < cutoff]:
            del pending[pod]
        if not pending:
            del self._pending[key]

    def awaited(self, key: Key, pod: str, attempt: int) -> bool:
        """True while a creation of this pod is known but not yet in the cache."""
        return (pod, attempt) in self._pending.get(key, {})

    def forget(self, key: Key) -> None:
        self._pending.pop(key, None)


class DeletedPods:
    """Pod UIDs whose deletion was requested, until ``ttl`` passes."""

    def __init__(
        self, ttl: float = EXPECTATION_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._requested: Stamps[str] = Stamps(ttl, clock)

    def requested(self, uid: str) -> None:
        self._requested.mark(uid)

    def awaited(self, uid: str) -> bool:
        age = self._requested.age(uid)
        return age is not None and age < self.ttl


class Cached(Protocol):
    """What ``PodsInFlight`` reads of a cached pod (``state.views.PodView``)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def attempt(self) -> int: ...


class CachedPod(Cached, Protocol):
    @property
    def pool(self) -> str | None: ...


class PodsInFlight:
    """Pods created on a node pool that the pod cache does not show yet, by pool.

    They hold their pool for their holder (``reconcile/pools.py``, rule 3) until the cache
    shows them or ``ttl`` passes. Unlike ``CreatedPods`` they are not forgotten when their
    slice goes: a slice deleted (its job deleted) right after it created pods is gone from
    the slice cache before its pods reach the pod cache, and the pool must not look free
    in between."""

    def __init__(
        self, ttl: float = EXPECTATION_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._by_pool: dict[str, dict[tuple[str, str, int], tuple[str, float]]] = {}

    def created(self, pool: str, holder: str, namespace: str, pod: str, attempt: int) -> None:
        self._by_pool.setdefault(pool, {})[(namespace, pod, attempt)] = (holder, self._clock())

    def seen(self, pod: CachedPod) -> None:
        """The pod cache shows ``pod`` (called for each pod event): it is in flight no
        longer."""
        if pod.pool is not None and pod.pool in self._by_pool:
            self.failed(pod.pool, pod.namespace, pod.name, pod.attempt)

    def failed(self, pool: str, namespace: str, pod: str, attempt: int) -> None:
        """The creation was refused: nothing is in flight."""
        pending = self._by_pool.get(pool)
        if pending is not None:
            pending.pop((namespace, pod, attempt), None)
            if not pending:
                del self._by_pool[pool]

    def unseen(self, pool: str, cached: Iterable[Cached]) -> Counter[str]:
        """Holder -> how many of its pods created on ``pool`` are not in ``cached`` (the
        pool's cached pods) yet; the ones seen or expired are forgotten."""
        pending = self._by_pool.get(pool)
        if not pending:
            return Counter()
        for pod in cached:
            pending.pop((pod.namespace, pod.name, pod.attempt), None)
        cutoff = self._clock() - self.ttl
        for key in [k for k, (_, at) in pending.items() if at < cutoff]:
            del pending[key]
        if not pending:
            del self._by_pool[pool]
            return Counter()
        return Counter(holder for holder, _ in pending.values())
