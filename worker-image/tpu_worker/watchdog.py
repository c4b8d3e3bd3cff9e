"""Stall watchdog: no step progress for too long -> stack dump and a retryable exit.

Armed by the first recorded step (so compilation never counts). Progress is a recorded
step or the end of a phase. The stall threshold is max(k x median step time, floor),
the median over recent steps without the first. On a stall it logs what it saw, dumps
every thread's stack (faulthandler) and exits with ``contract.EXIT_RETRYABLE``, which
the operator's default failure policy restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tpu_operator import contract
from tpu_worker import exits
from tpu_worker.reporting import Reporter

log = logging.getLogger(__name__)


def threshold(median: float | None, k: float, floor: float) -> float:
    return floor if median is None else max(k * median, floor)


class Watchdog:
    """A daemon thread checking the reporter's progress every ``interval_s``."""

    def __init__(
        self,
        reporter: Reporter,
        k: float,
        floor_s: float,
        *,
        interval_s: float | None = None,
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        self._reporter = reporter
        self._k = k
        self._floor = floor_s
        self._interval = interval_s if interval_s is not None else min(1.0, floor_s / 4)
        self._on_stall = on_stall or self._exit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpu-worker-watchdog", daemon=True)

    def start(self) -> None:
        log.info(
            "watchdog: stall threshold max(%g x median step time, %gs), armed by the first step",
            self._k,
            self._floor,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def check(self, now: float) -> str | None:
        """A description of the stall, or None while progress is fine."""
        reporter = self._reporter
        if reporter.steps_recorded == 0:
            return None
        median = reporter.median_step_seconds()
        limit = threshold(median, self._k, self._floor)
        reporter.metrics.watchdog_threshold.set(limit)
        idle = now - reporter.last_activity
        if idle <= limit:
            return None
        median_text = "n/a" if median is None else f"{median:.3f}s"
        return (
            f"no step progress for {idle:.1f}s after step {reporter.last_step} "
            f"(threshold {limit:.1f}s = max({self._k:g} x median step {median_text}, "
            f"floor {self._floor:g}s))"
        )

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            stall = self.check(time.monotonic())
            if stall is not None and not self._stopped.is_set():
                self._on_stall(stall)
                return

    @staticmethod
    def _exit(stall: str) -> None:
        log.error("watchdog: %s; dumping all thread stacks", stall)
        exits.dump_stacks(f"watchdog: {stall}")
        exits.hard_exit(contract.EXIT_RETRYABLE, f"watchdog stall: {stall}")
