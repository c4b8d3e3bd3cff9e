"""The worker's metrics interface: every ``tpu_worker_*`` name and label, spelled once.

The worker declares its Prometheus metrics with these names (``tpu_worker.metrics``), the
operator's progress sampler reads them from a worker's endpoint
(``tpu_operator.progress.samples``), the Grafana dashboards query them
(``tpu_operator.dashboards``) and the chart's alert rules take them from a helper template
generated from this module (``tpu-operator dashboards --write``). docs/reference/metrics.md
lists them; renaming one changes the product's interface.

Names are series names as they appear on ``/metrics`` and in PromQL: a counter's ends in
``_total`` (prometheus-client declares a counter ``x_total`` as family ``x`` and exports
the sample ``x_total``); a histogram ``x`` exports ``x_bucket``, ``x_sum`` and
``x_count``.

Keep this module free of imports beyond the standard library: every worker process loads it.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "tpu_worker_"
# The worker serves its metrics on this path of the pod's metrics port, and only there.
METRICS_PATH: Final = "/metrics"

COUNTER: Final = "counter"
GAUGE: Final = "gauge"
HISTOGRAM: Final = "histogram"

# Metric names.
STEPS_TOTAL: Final = PREFIX + "steps_total"
STEP: Final = PREFIX + "step"
STEP_DURATION_SECONDS: Final = PREFIX + "step_duration_seconds"
STEP_DURATION_SECONDS_BUCKET: Final = STEP_DURATION_SECONDS + "_bucket"
STEP_DURATION_SECONDS_SUM: Final = STEP_DURATION_SECONDS + "_sum"
STEP_DURATION_SECONDS_COUNT: Final = STEP_DURATION_SECONDS + "_count"
EXAMPLES_TOTAL: Final = PREFIX + "examples_total"
TOKENS_TOTAL: Final = PREFIX + "tokens_total"
MODEL_FLOPS_TOTAL: Final = PREFIX + "model_flops_total"
PEAK_FLOPS_PER_SECOND: Final = PREFIX + "peak_flops_per_second"
LOSS: Final = PREFIX + "loss"
LAST_PROGRESS_TIMESTAMP_SECONDS: Final = PREFIX + "last_progress_timestamp_seconds"
PHASE_SECONDS_TOTAL: Final = PREFIX + "phase_seconds_total"
START_TIME_SECONDS: Final = PREFIX + "start_time_seconds"
END_TIME_SECONDS: Final = PREFIX + "end_time_seconds"
WATCHDOG_THRESHOLD_SECONDS: Final = PREFIX + "watchdog_threshold_seconds"
DEVICE_MEMORY_USED_BYTES: Final = PREFIX + "device_memory_used_bytes"
DEVICE_MEMORY_LIMIT_BYTES: Final = PREFIX + "device_memory_limit_bytes"
DEVICE_MEMORY_PEAK_USED_BYTES: Final = PREFIX + "device_memory_peak_used_bytes"
BUILD_INFO: Final = PREFIX + "build_info"
# Checkpoint requests this process received from its supervisor (SIGUSR1).
CHECKPOINT_REQUESTS_TOTAL: Final = PREFIX + "checkpoint_requests_total"

# Labels the scrape configuration attaches to every worker series from the pod (the
# chart's PodMonitor relabelling): the dashboards and alert rules select on them.
LABEL_NAMESPACE: Final = "namespace"
LABEL_POD: Final = "pod"
LABEL_NODE: Final = "node"
LABEL_TPUJOB: Final = "tpujob"
LABEL_SLICE: Final = "slice"
LABEL_WORKER: Final = "worker"
LABEL_ATTEMPT: Final = "attempt"
TARGET_LABELS: Final = (
    LABEL_NAMESPACE,
    LABEL_POD,
    LABEL_NODE,
    LABEL_TPUJOB,
    LABEL_SLICE,
    LABEL_WORKER,
    LABEL_ATTEMPT,
)

# Labels the worker itself exports (bounded: see tpu_worker.metrics).
LABEL_PHASE: Final = "phase"
LABEL_DEVICE: Final = "device"
BUILD_INFO_LABELS: Final = (
    "version",
    "jax_version",
    "platform",
    "device_kind",
    "local_devices",
    "process_index",
    "process_count",
    LABEL_SLICE,
    LABEL_WORKER,
    LABEL_ATTEMPT,
)

# Values of the phase label. The worker exports every built-in phase from the start (zeros).
PHASE_INIT: Final = "init"
PHASE_COMPILE: Final = "compile"
# A process's first step interval, less the phases in it: the first execution, the
# collectives' set-up, and the wait in them for peers still compiling or restoring. A
# restarted process pays it again, so it is not productive step time.
PHASE_FIRST_STEP: Final = "first_step"
PHASE_DATA_WAIT: Final = "data_wait"
PHASE_CHECKPOINT_SAVE: Final = "checkpoint_save"
PHASE_CHECKPOINT_RESTORE: Final = "checkpoint_restore"
PHASE_STEP: Final = "step"  # productive step time: step intervals minus every other phase in them
BUILTIN_PHASES: Final = (
    PHASE_INIT,
    PHASE_COMPILE,
    PHASE_FIRST_STEP,
    PHASE_DATA_WAIT,
    PHASE_CHECKPOINT_SAVE,
    PHASE_CHECKPOINT_RESTORE,
    PHASE_STEP,
)

# Every metric the worker exports: its type and its own labels (besides TARGET_LABELS).
METRICS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    STEPS_TOTAL: (COUNTER, ()),
    STEP: (GAUGE, ()),
    STEP_DURATION_SECONDS: (HISTOGRAM, ()),
    EXAMPLES_TOTAL: (COUNTER, ()),
    TOKENS_TOTAL: (COUNTER, ()),
    MODEL_FLOPS_TOTAL: (COUNTER, ()),
    PEAK_FLOPS_PER_SECOND: (GAUGE, ()),
    LOSS: (GAUGE, ()),
    LAST_PROGRESS_TIMESTAMP_SECONDS: (GAUGE, ()),
    PHASE_SECONDS_TOTAL: (COUNTER, (LABEL_PHASE,)),
    START_TIME_SECONDS: (GAUGE, ()),
    END_TIME_SECONDS: (GAUGE, ()),
    WATCHDOG_THRESHOLD_SECONDS: (GAUGE, ()),
    DEVICE_MEMORY_USED_BYTES: (GAUGE, (LABEL_DEVICE,)),
    DEVICE_MEMORY_LIMIT_BYTES: (GAUGE, (LABEL_DEVICE,)),
    DEVICE_MEMORY_PEAK_USED_BYTES: (GAUGE, (LABEL_DEVICE,)),
    BUILD_INFO: (GAUGE, BUILD_INFO_LABELS),
    CHECKPOINT_REQUESTS_TOTAL: (COUNTER, ()),
}

# What each metric means: the worker declares its metrics with these help texts, and the
# generated metrics reference (docs/reference/metrics.md) lists them.
HELP: Final[dict[str, str]] = {
    STEPS_TOTAL: "Training steps completed by this process since it started.",
    STEP: "Global training step last completed (continues across restarts from a checkpoint).",
    STEP_DURATION_SECONDS: (
        "Wall time of one training step (from the end of the previous step), all phases in it."
    ),
    EXAMPLES_TOTAL: "Training examples processed by this process.",
    TOKENS_TOTAL: "Training tokens processed by this process.",
    MODEL_FLOPS_TOTAL: "Model FLOPs executed by this process (its share of the global step).",
    PEAK_FLOPS_PER_SECOND: (
        "Peak FLOP/s of this process's local devices (TPU: bf16 catalog figure; "
        "CPU: theoretical vector estimate)."
    ),
    LOSS: "Training loss of the last step.",
    LAST_PROGRESS_TIMESTAMP_SECONDS: "Unix time of the last completed step (0 before the first).",
    PHASE_SECONDS_TOTAL: (
        "Wall time spent per phase, open phases counted up to the scrape; step is "
        "productive time, the rest is badput."
    ),
    START_TIME_SECONDS: "Unix time this worker process started.",
    END_TIME_SECONDS: "Unix time the training code returned (0 while it runs).",
    WATCHDOG_THRESHOLD_SECONDS: (
        "Stall threshold in force: max(k x median step time, floor); 0 until armed."
    ),
    DEVICE_MEMORY_USED_BYTES: (
        "Device memory in use (bytes_in_use of memory_stats()), per local device."
    ),
    DEVICE_MEMORY_LIMIT_BYTES: (
        "Device memory available to JAX (bytes_limit of memory_stats()), per local device."
    ),
    DEVICE_MEMORY_PEAK_USED_BYTES: (
        "Peak device memory in use since start (peak_bytes_in_use), per local device."
    ),
    BUILD_INFO: "Constant 1; labels describe the JAX build, devices and place in the job.",
    CHECKPOINT_REQUESTS_TOTAL: (
        "Checkpoint requests this process received (SIGUSR1, from its supervisor)."
    ),
}


def series(name: str) -> tuple[str, ...]:
    """The series names metric ``name`` exports (a histogram's bucket, sum and count)."""
    if METRICS[name][0] == HISTOGRAM:
        return (name + "_bucket", name + "_sum", name + "_count")
    return (name,)
