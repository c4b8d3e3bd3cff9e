"""One reading of a worker's metrics endpoint, parsed into the figures the operator uses.

Only the ``tpu_worker_`` series the operator needs are kept (names from
``tpu_operator.worker_metrics``; docs/reference/metrics.md lists them). Parsing uses
prometheus-client's text parser. A value that is not finite (a diverged loss of NaN, an
infinity) counts as not reported: the figures go into the job's status, which JSON, and
so the apiserver, cannot hold them in; the worker's own metrics still show them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tpu_operator import worker_metrics as wm


@dataclass(frozen=True)
class WorkerSample:
    at: float
    """Operator wall-clock time of the reading."""
    steps_total: float = 0.0
    """Steps this process ran (resets with the process)."""
    step: float | None = None
    """Global training step reached (continues across a checkpoint resume)."""
    loss: float | None = None
    step_seconds_sum: float = 0.0
    step_seconds_count: float = 0.0
    examples: float = 0.0
    tokens: float = 0.0
    flops: float = 0.0
    peak_flops: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    """Set once training finished (the worker may keep serving metrics for a while)."""
    phases: dict[str, float] = field(default_factory=dict)

    def same_process(self, earlier: WorkerSample) -> bool:
        """Whether both readings come from one process (counters comparable)."""
        return self.start_time == earlier.start_time and self.steps_total >= earlier.steps_total

    @property
    def resumed_from(self) -> float | None:
        """The step this process started from (its checkpoint step, 0 for a fresh run).

        Known once the process made a step (before that the step gauge is not yet the
        training step).
        """
        if self.step is None or self.steps_total < 1:
            return None
        return max(self.step - self.steps_total, 0.0)

    @property
    def finished(self) -> bool:
        return bool(self.end_time)


# Series name -> WorkerSample field.
_SCALARS = {
    wm.STEPS_TOTAL: "steps_total",
    wm.STEP: "step",
    wm.LOSS: "loss",
    wm.EXAMPLES_TOTAL: "examples",
    wm.TOKENS_TOTAL: "tokens",
    wm.MODEL_FLOPS_TOTAL: "flops",
    wm.PEAK_FLOPS_PER_SECOND: "peak_flops",
    wm.START_TIME_SECONDS: "start_time",
    wm.END_TIME_SECONDS: "end_time",
    wm.STEP_DURATION_SECONDS_SUM: "step_seconds_sum",
    wm.STEP_DURATION_SECONDS_COUNT: "step_seconds_count",
}


def parse(text: str, at: float) -> WorkerSample:
    values: dict[str, float] = {}
    phases: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(wm.PREFIX):
            continue
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue
            if sample.name == wm.PHASE_SECONDS_TOTAL:
                phases[sample.labels.get(wm.LABEL_PHASE, "")] = sample.value
            elif sample.name in _SCALARS:
                values[_SCALARS[sample.name]] = sample.value
    return WorkerSample(at=at, phases=phases, **values)
