"""The worker's Prometheus metrics: one registry, names fixed, base units, bounded labels.

The operator samples these for progress and stall detection and the dashboards and alert
rules query them, so names and labels are part of the product's interface: they are
defined once, with their help texts, in ``tpu_operator.worker_metrics``, and listed in
docs/reference/metrics.md.
Labels are bounded: ``phase`` takes the built-in phases plus at most
``MAX_CUSTOM_PHASES`` validated custom names, ``device`` is a local device index.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tpu_operator import worker_metrics as wm

# The phase names, re-exported for the reporter and the benchmarks.
from tpu_operator.worker_metrics import BUILTIN_PHASES as BUILTIN_PHASES
from tpu_operator.worker_metrics import PHASE_CHECKPOINT_RESTORE as PHASE_CHECKPOINT_RESTORE
from tpu_operator.worker_metrics import PHASE_CHECKPOINT_SAVE as PHASE_CHECKPOINT_SAVE
from tpu_operator.worker_metrics import PHASE_COMPILE as PHASE_COMPILE
from tpu_operator.worker_metrics import PHASE_DATA_WAIT as PHASE_DATA_WAIT
from tpu_operator.worker_metrics import PHASE_FIRST_STEP as PHASE_FIRST_STEP
from tpu_operator.worker_metrics import PHASE_INIT as PHASE_INIT
from tpu_operator.worker_metrics import PHASE_STEP as PHASE_STEP

MAX_CUSTOM_PHASES = 8
PHASE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

# Training steps take from milliseconds (small models, CPU tests) to minutes (large models
# with long sequences); 1-2.5-5 per decade from 5 ms to 10 min.
STEP_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


@dataclass(frozen=True)
class MemoryStat:
    device: int
    bytes_in_use: int | None
    bytes_limit: int | None
    peak_bytes_in_use: int | None


class _DeviceMemoryCollector(Collector):
    """Reads device memory at scrape time (for CPU devices: the host memory of the process,
    reported once, as device 0)."""

    def __init__(self, read: Callable[[], Iterable[MemoryStat]]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        used, limit, peak = (
            GaugeMetricFamily(name, wm.HELP[name], labels=[wm.LABEL_DEVICE])
            for name in (
                wm.DEVICE_MEMORY_USED_BYTES,
                wm.DEVICE_MEMORY_LIMIT_BYTES,
                wm.DEVICE_MEMORY_PEAK_USED_BYTES,
            )
        )
        for stat in self._read():
            label = [str(stat.device)]
            if stat.bytes_in_use is not None:
                used.add_metric(label, float(stat.bytes_in_use))
            if stat.bytes_limit is not None:
                limit.add_metric(label, float(stat.bytes_limit))
            if stat.peak_bytes_in_use is not None:
                peak.add_metric(label, float(stat.peak_bytes_in_use))
        for family in (used, limit, peak):
            if family.samples:
                yield family


class PhaseSeconds(Collector):
    """``tpu_worker_phase_seconds_total``: closed phases' seconds plus, at each scrape, what
    the phases still open own so far (``follow``), so that the counters advance while a
    long phase runs instead of jumping by its whole length when it ends.

    Each series is monotonic, and together they never show more seconds than the phases
    hold. Both matter when seconds are taken out of an open frame after a scrape showed
    them as that frame's: JAX reports a compilation when it ends, and its seconds come out
    of the step interval it ran in. The step series cannot go back (Prometheus would read
    a reset), so it stays flat until the step's own seconds catch up; meanwhile the series
    that rose (compile) are held back by as much as is shown twice, and follow as it is
    absorbed. So a rate() of their sum never exceeds wall time.
    """

    def __init__(self, phases: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._closed: dict[str, float] = dict.fromkeys(phases, 0.0)
        self._exported: dict[str, float] = {}
        self._open: Callable[[], Mapping[str, float]] | None = None

    def follow(self, open_seconds: Callable[[], Mapping[str, float]]) -> None:
        """Read the open phases' seconds from ``open_seconds`` at each scrape."""
        self._open = open_seconds

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._closed[phase] = self._closed.get(phase, 0.0) + seconds

    def values(self) -> dict[str, float]:
        """What a scrape now would export, by phase."""
        # Read outside our lock: the accountant calls add() after releasing its own.
        live = dict(self._open()) if self._open is not None else {}
        with self._lock:
            exported = self._exported
            held = {
                phase: self._closed.get(phase, 0.0) + live.get(phase, 0.0)
                for phase in self._closed.keys() | live.keys() | exported.keys()
            }
            # Seconds exported that the phases no longer hold (shown before they moved).
            shown_twice = sum(max(0.0, exported.get(p, 0.0) - v) for p, v in held.items())
            rises = {p: v - exported.get(p, 0.0) for p, v in held.items()}
            rising = sum(r for r in rises.values() if r > 0)
            if rising > 0:
                share = max(0.0, rising - shown_twice) / rising
                for phase, rise in rises.items():
                    if rise > 0:
                        exported[phase] = exported.get(phase, 0.0) + rise * share
            for phase in held:
                exported.setdefault(phase, 0.0)
            return dict(exported)

    def describe(self) -> Iterable[CounterMetricFamily]:
        yield self._family()

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = self._family()
        for phase, seconds in self.values().items():
            family.add_metric([phase], seconds)
        yield family

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            wm.PHASE_SECONDS_TOTAL, wm.HELP[wm.PHASE_SECONDS_TOTAL], labels=[wm.LABEL_PHASE]
        )


@dataclass(frozen=True)
class PhaseCounter:
    """One phase's series of ``PhaseSeconds``."""

    seconds: PhaseSeconds
    phase: str

    def inc(self, amount: float) -> None:
        self.seconds.add(self.phase, amount)


class WorkerMetrics:
    """Every metric the worker exports, in its own registry (no default process collectors)."""

    def __init__(self) -> None:
        # No *_created series: a second series per counter that no query here needs. This is
        # process-wide in prometheus-client; the worker owns its process.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Counter names end in _total; prometheus-client names the family without it and
        # exports the sample with it.
        help_ = wm.HELP
        self.steps = Counter(wm.STEPS_TOTAL, help_[wm.STEPS_TOTAL], registry=r)
        self.step = Gauge(wm.STEP, help_[wm.STEP], registry=r)
        self.step_duration = Histogram(
            wm.STEP_DURATION_SECONDS,
            help_[wm.STEP_DURATION_SECONDS],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.examples = Counter(wm.EXAMPLES_TOTAL, help_[wm.EXAMPLES_TOTAL], registry=r)
        self.tokens = Counter(wm.TOKENS_TOTAL, help_[wm.TOKENS_TOTAL], registry=r)
        self.model_flops = Counter(wm.MODEL_FLOPS_TOTAL, help_[wm.MODEL_FLOPS_TOTAL], registry=r)
        self.peak_flops = Gauge(
            wm.PEAK_FLOPS_PER_SECOND, help_[wm.PEAK_FLOPS_PER_SECOND], registry=r
        )
        self.loss = Gauge(wm.LOSS, help_[wm.LOSS], registry=r)
        self.last_progress = Gauge(
            wm.LAST_PROGRESS_TIMESTAMP_SECONDS,
            help_[wm.LAST_PROGRESS_TIMESTAMP_SECONDS],
            registry=r,
        )
        # Every built-in phase is exported from the start (zeros) so that rate() sees it.
        self.phase_seconds = PhaseSeconds(BUILTIN_PHASES)
        r.register(self.phase_seconds)
        self.start_time = Gauge(wm.START_TIME_SECONDS, help_[wm.START_TIME_SECONDS], registry=r)
        self.end_time = Gauge(wm.END_TIME_SECONDS, help_[wm.END_TIME_SECONDS], registry=r)
        self.watchdog_threshold = Gauge(
            wm.WATCHDOG_THRESHOLD_SECONDS, help_[wm.WATCHDOG_THRESHOLD_SECONDS], registry=r
        )
        self.build_info = Gauge(
            wm.BUILD_INFO, help_[wm.BUILD_INFO], wm.BUILD_INFO_LABELS, registry=r
        )
        self.checkpoint_requests = Counter(
            wm.CHECKPOINT_REQUESTS_TOTAL, help_[wm.CHECKPOINT_REQUESTS_TOTAL], registry=r
        )
        self._custom_phases: set[str] = set()

    def phase_counter(self, phase: str) -> PhaseCounter:
        if phase not in BUILTIN_PHASES and phase not in self._custom_phases:
            if not PHASE_NAME.match(phase):
                raise ValueError(f"phase name {phase!r} must match {PHASE_NAME.pattern}")
            if len(self._custom_phases) >= MAX_CUSTOM_PHASES:
                raise ValueError(
                    f"at most {MAX_CUSTOM_PHASES} custom phases (have "
                    f"{sorted(self._custom_phases)}); phase is a metric label and must stay bounded"
                )
            self._custom_phases.add(phase)
            self.phase_seconds.add(phase, 0.0)  # exported from now on, at zero
        return PhaseCounter(self.phase_seconds, phase)

    def watch_device_memory(self, read: Callable[[], Iterable[MemoryStat]]) -> None:
        self.registry.register(_DeviceMemoryCollector(read))
