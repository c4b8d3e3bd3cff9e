"""One reading of a worker's metrics endpoint, parsed into the figures the operator uses.

Only the ``tpu_worker_`` families the operator needs are kept (see docs/worker.md for the
metrics). Parsing uses prometheus-client's text parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "tpu_worker_"


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


_SCALARS = {
    "steps_total": "steps_total",
    "step": "step",
    "loss": "loss",
    "examples_total": "examples",
    "tokens_total": "tokens",
    "model_flops_total": "flops",
    "peak_flops_per_second": "peak_flops",
    "start_time_seconds": "start_time",
    "end_time_seconds": "end_time",
    "step_duration_seconds_sum": "step_seconds_sum",
    "step_duration_seconds_count": "step_seconds_count",
}


def parse(text: str, at: float) -> WorkerSample:
    values: dict[str, float] = {}
    phases: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for sample in family.samples:
            name = sample.name.removeprefix(PREFIX)
            if name == "phase_seconds_total":
                phases[sample.labels.get("phase", "")] = sample.value
            elif name in _SCALARS:
                values[_SCALARS[name]] = sample.value
    return WorkerSample(at=at, phases=phases, **values)  # type: ignore[arg-type]
