"""Spacing of status writes that only move counters, and of a large job's reconciles.

While hundreds of pods start or stop, nearly every pod event changes a count in its job's
and slice's status ("waiting for 183 pods of the previous attempt to stop"). Writing each
one costs a status write per pod event: at 256 hosts over a hundred writes per gang
restart, each validated by the apiserver and sent to every watcher, slowing the very pod
churn they report. Writes that change only counters and messages are therefore spaced at
least ``interval`` apart per object; a write that changes anything else (phase, attempt,
condition status or reason, failures, timestamps, progress, the goodput carried over from
finished attempts) goes out at once.

A reconcile of a job looks at every one of its pods, so its cost grows with the job; while
pods start or stop, events keep arriving and the job is reconciled as often as its
spacing allows. ``reconcile_spacing`` grows that spacing with the job's pods (``PER_POD``
seconds each, never under the operator's minimum nor over ``MAX_SPACING``), which keeps
the reconcile CPU spent per pod the same from a few hundred pods to thousands: up to
1,000 pods nothing changes; a 12,736-pod job is looked at about every 1.3 s, which is
also about how often a status write of its counters goes out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpu_operator.runtime.stamps import Stamps

COUNTER_FIELDS = frozenset(
    {"ready", "readyWorkers", "slicesReady", "message", "activePods", "terminatingPods"}
)
"""Top-level status fields that only count or describe; conditions' and slice summaries'
``message`` and ``readyWorkers`` are treated the same way, and so is the goodput account
except ``finishedAttempts`` (the rest is recomputed from the clock on every reconcile)."""
GOODPUT_STATE = "finishedAttempts"
DEFAULT_INTERVAL = 1.0
PER_POD = 0.0001
"""Seconds of reconcile spacing per pod of the object (0.1 s per 1,000 pods)."""
SPACED_FROM = 1000
"""Objects of up to this many pods keep the operator's minimum as it is (even 0)."""
MAX_SPACING = 5.0


def reconcile_spacing(pods: int, minimum: float) -> float:
    """Least time between two reconciles of an object with ``pods`` worker pods."""
    if pods <= SPACED_FROM:
        return minimum
    return max(minimum, min(MAX_SPACING, pods * PER_POD))


def counters_only(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True if ``new`` differs from ``old`` at most in counters and messages."""
    return _material(old) == _material(new)


def _material(status: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in status.items() if k not in COUNTER_FIELDS}
    if isinstance(kept.get("conditions"), list):
        kept["conditions"] = [_without(c, "message") for c in kept["conditions"]]
    if isinstance(kept.get("slices"), list):
        kept["slices"] = [_without(s, "readyWorkers") for s in kept["slices"]]
    if isinstance(kept.get("goodput"), dict):
        kept["goodput"] = kept["goodput"].get(GOODPUT_STATE)
    return kept


def _without(item: Any, key: str) -> Any:
    return {k: v for k, v in item.items() if k != key} if isinstance(item, dict) else item


class StatusPacer:
    """Remembers when each object's status was last written; says how long to hold a
    counters-only write back."""

    def __init__(
        self, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._written: Stamps[str] = Stamps(interval, clock)

    def hold(self, uid: str, old: dict[str, Any], new: dict[str, Any]) -> float:
        """Seconds to wait before writing ``new`` over ``old`` (0: write now)."""
        age = self._written.age(uid)
        if age is None or old == new or not counters_only(old, new):
            return 0.0
        return max(0.0, self.interval - age)

    def wrote(self, uid: str) -> None:
        self._written.mark(uid)
