"""Monitoring settings of a TPUJob and the progress and goodput it reports in status."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tpu_operator.api.common import ApiModel

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"


def seconds(duration: str) -> float:
    """Seconds of a duration like ``90s``, ``15m`` or ``1h30m`` (Kubernetes style)."""
    if not _DURATION.match(duration):
        raise ValueError(f"{duration!r} is not a duration like 30s, 15m or 1h30m")
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(duration))


def _checked(value: str) -> str:
    seconds(value)
    return value


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32), AfterValidator(_checked)]


class Monitoring(ApiModel):
    """How the operator watches training progress through the workers' metrics."""

    enabled: bool = True
    """Sample the workers' metrics endpoints for progress, stalls and stragglers."""
    sample_interval: Duration = "10s"
    """How often worker 0 of each slice is sampled; every worker is sampled six times less
    often."""
    stall_timeout: Duration = "30m"
    """A job whose step has not advanced for this long after its first step is Stalled.
    Completed compilation, checkpoint save and restore phases do not count."""
    stall_action: Literal["Restart", "None"] = "Restart"
    """Restart: a stalled job is restarted as a gang (reason Stalled). None: condition and
    event only."""
    count_stall_restarts: bool = True
    """Count Stalled restarts against failurePolicy.maxRestarts."""
    straggler_threshold: float = Field(default=3.5, gt=0, le=100)
    """Robust z-score (median and MAD over the slice) above which a worker's data-wait or
    step time per step makes it a straggler."""


class SlowestWorker(ApiModel):
    slice: int
    pod: str
    node: str | None = None
    step_seconds: float | None = None
    """Mean seconds per step over the last sampling window."""
    data_wait_seconds: float | None = None
    """Mean seconds per step spent waiting for input."""


class Progress(ApiModel):
    """Training progress read from the workers' metrics. A figure a worker reports as NaN
    or infinite (a diverged loss) is left out: JSON cannot hold it."""

    step: int | None = None
    steps_per_second: float | None = None
    examples_per_second: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    """Model FLOPs utilization: achieved model FLOP/s over the peak of the job's chips."""
    loss: float | None = None
    """The latest loss worker 0 of slice 0 reported; absent while it is NaN or infinite."""
    last_progress_time: str | None = None
    """When the operator last saw the step advance."""
    sampled_time: str | None = None
    workers_reporting: str | None = None
    """Workers whose metrics were read in the last full sampling round, as n/total."""
    slowest_workers: list[SlowestWorker] = Field(default_factory=list)
    """The slowest worker of each slice (by time per step) in the last full round."""


class Goodput(ApiModel):
    """Where the job's wall time went (seconds since creation); see docs/concepts/goodput.md."""

    fraction: float = 0.0
    """Productive step time / wall time."""
    wall_seconds: float = 0.0
    productive_seconds: float = 0.0
    badput_seconds: dict[str, float] = Field(default_factory=dict)
    """scheduling, initialization, compilation, firstStep, dataWait, checkpointSave,
    checkpointRestore, lostProgress, restartDowntime, shutdown, suspended, degraded, other."""
    finished_attempts: dict[str, float] = Field(default_factory=dict)
    """Totals carried over from attempts that ended (the operator's bookkeeping)."""
