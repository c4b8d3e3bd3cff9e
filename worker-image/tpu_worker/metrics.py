"""The worker's Prometheus metrics: one registry, names fixed, base units, bounded labels.

The operator samples these for progress and stall detection and the dashboards query
them, so names and labels are part of the product's interface: see docs/worker.md.
Labels are bounded: ``phase`` takes the built-in phases plus at most
``MAX_CUSTOM_PHASES`` validated custom names, ``device`` is a local device index.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "tpu_worker_"

PHASE_INIT = "init"
PHASE_COMPILE = "compile"
PHASE_DATA_WAIT = "data_wait"
PHASE_CHECKPOINT_SAVE = "checkpoint_save"
PHASE_CHECKPOINT_RESTORE = "checkpoint_restore"
PHASE_STEP = "step"  # productive step time: step intervals minus every other phase in them
BUILTIN_PHASES = (
    PHASE_INIT,
    PHASE_COMPILE,
    PHASE_DATA_WAIT,
    PHASE_CHECKPOINT_SAVE,
    PHASE_CHECKPOINT_RESTORE,
    PHASE_STEP,
)
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
        used = GaugeMetricFamily(
            PREFIX + "device_memory_used_bytes",
            "Device memory in use (bytes_in_use of memory_stats()), per local device.",
            labels=["device"],
        )
        limit = GaugeMetricFamily(
            PREFIX + "device_memory_limit_bytes",
            "Device memory available to JAX (bytes_limit of memory_stats()), per local device.",
            labels=["device"],
        )
        peak = GaugeMetricFamily(
            PREFIX + "device_memory_peak_used_bytes",
            "Peak device memory in use since start (peak_bytes_in_use), per local device.",
            labels=["device"],
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


class WorkerMetrics:
    """Every metric the worker exports, in its own registry (no default process collectors)."""

    def __init__(self) -> None:
        # No *_created series: a second series per counter that no query here needs. This is
        # process-wide in prometheus-client; the worker owns its process.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.steps = Counter(
            PREFIX + "steps",
            "Training steps completed by this process since it started.",
            registry=r,
        )
        self.step = Gauge(
            PREFIX + "step",
            "Global training step last completed (continues across restarts from a checkpoint).",
            registry=r,
        )
        self.step_duration = Histogram(
            PREFIX + "step_duration_seconds",
            "Wall time of one training step (from the end of the previous step), all phases in it.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.examples = Counter(
            PREFIX + "examples", "Training examples processed by this process.", registry=r
        )
        self.tokens = Counter(
            PREFIX + "tokens", "Training tokens processed by this process.", registry=r
        )
        self.model_flops = Counter(
            PREFIX + "model_flops",
            "Model FLOPs executed by this process (its share of the global step).",
            registry=r,
        )
        self.peak_flops = Gauge(
            PREFIX + "peak_flops_per_second",
            "Peak FLOP/s of this process's local devices (TPU: bf16 catalog figure; "
            "CPU: theoretical vector estimate).",
            registry=r,
        )
        self.loss = Gauge(PREFIX + "loss", "Training loss of the last step.", registry=r)
        self.last_progress = Gauge(
            PREFIX + "last_progress_timestamp_seconds",
            "Unix time of the last completed step (0 before the first).",
            registry=r,
        )
        self.phase_seconds = Counter(
            PREFIX + "phase_seconds",
            "Wall time spent per phase; step is productive time, the rest is badput.",
            ["phase"],
            registry=r,
        )
        self.start_time = Gauge(
            PREFIX + "start_time_seconds", "Unix time this worker process started.", registry=r
        )
        self.end_time = Gauge(
            PREFIX + "end_time_seconds",
            "Unix time the training code returned (0 while it runs).",
            registry=r,
        )
        self.watchdog_threshold = Gauge(
            PREFIX + "watchdog_threshold_seconds",
            "Stall threshold in force: max(k x median step time, floor); 0 until armed.",
            registry=r,
        )
        self.build_info = Gauge(
            PREFIX + "build_info",
            "Constant 1; labels describe the JAX build, devices and place in the job.",
            [
                "version",
                "jax_version",
                "platform",
                "device_kind",
                "local_devices",
                "process_index",
                "process_count",
                "slice",
                "worker",
                "attempt",
            ],
            registry=r,
        )
        for phase in BUILTIN_PHASES:
            self.phase_seconds.labels(phase=phase)  # export zeros so rate() sees every phase
        self._custom_phases: set[str] = set()

    def phase_counter(self, phase: str) -> Counter:
        if phase not in BUILTIN_PHASES and phase not in self._custom_phases:
            if not PHASE_NAME.match(phase):
                raise ValueError(f"phase name {phase!r} must match {PHASE_NAME.pattern}")
            if len(self._custom_phases) >= MAX_CUSTOM_PHASES:
                raise ValueError(
                    f"at most {MAX_CUSTOM_PHASES} custom phases (have "
                    f"{sorted(self._custom_phases)}); phase is a metric label and must stay bounded"
                )
            self._custom_phases.add(phase)
        return self.phase_seconds.labels(phase=phase)

    def watch_device_memory(self, read: Callable[[], Iterable[MemoryStat]]) -> None:
        self.registry.register(_DeviceMemoryCollector(read))
