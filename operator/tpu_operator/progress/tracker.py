"""Per-job progress bookkeeping from worker samples: rates, stalls, stragglers (pure).

Stall: the operator notes when it sees the step of a slice's worker 0 advance. A job is
stalled when, after its first step in this attempt, no leader's step has advanced for
longer than the timeout, not counting time the leader reports in compile and checkpoint
phases since then (the workers' counters advance while a checkpoint phase runs; compile
time arrives when a compilation ends). A worker whose metrics cannot be read is not
stalled by that alone: with no reading at all the stall clock keeps running only on what
was last seen, and the job reports how many workers answered.

Straggler: per slice (or per job when a slice has fewer than three workers), each
worker's data-wait seconds per step and step seconds per step over its last sampling
window are compared with the group by a robust z-score, 0.6745 (x - median) / MAD (the
MAD is 0 when most workers agree exactly; then any worker above them scores infinity).
A worker above the threshold whose excess is also at least 10% of the median step time is
a straggler.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from tpu_operator.progress.samples import WorkerSample

EXCLUDED_PHASES = ("compile", "checkpoint_restore", "checkpoint_save")
MIN_GROUP = 3


@dataclass
class WorkerTrack:
    pod: str
    slice: int
    worker: int
    node: str | None
    samples: deque[WorkerSample] = field(default_factory=lambda: deque(maxlen=2))
    pace: tuple[WorkerSample, tuple[float, float]] | None = None
    """The latest reading whose window completed a step (not the process's first), and
    the figures of that window (``add``, ``per_step``)."""

    @property
    def latest(self) -> WorkerSample | None:
        return self.samples[-1] if self.samples else None

    def window(self) -> tuple[WorkerSample, WorkerSample] | None:
        """The last two readings of one process, if there are two."""
        if len(self.samples) < 2:
            return None
        earlier, later = self.samples[0], self.samples[1]
        if not later.same_process(earlier) or later.at <= earlier.at:
            return None
        return earlier, later

    def rate(self, name: str) -> float | None:
        pair = self.window()
        if pair is None:
            return None
        earlier, later = pair
        return (getattr(later, name) - getattr(earlier, name)) / (later.at - earlier.at)

    def add(self, sample: WorkerSample) -> None:
        """Take a new reading; if its window completed a step (not the process's first),
        it becomes the worker's ``pace``."""
        self.samples.append(sample)
        pair = self.window()
        if pair is None:
            return
        earlier, later = pair
        steps = later.steps_total - earlier.steps_total
        if earlier.steps_total < 1 or steps < 1:
            return
        count = later.step_seconds_count - earlier.step_seconds_count
        step_seconds = (
            (later.step_seconds_sum - earlier.step_seconds_sum) / count if count > 0 else 0.0
        )
        wait = later.phases.get("data_wait", 0.0) - earlier.phases.get("data_wait", 0.0)
        self.pace = (later, (step_seconds, wait / steps))

    def per_step(self) -> tuple[float, float] | None:
        """(step seconds, data-wait seconds) per step over the window; None for a window
        that holds the process's first step (its compilation and its wait for peers say
        nothing of its pace: a worker that compiled slower would read as a straggler).

        A window in which no step completed (a step longer than the sampling interval:
        the straggler's, most often) gives the figures of this process's last window
        that had one: without them the slowest worker dropped out of ``slowestWorkers``
        and the straggler comparison in every such round."""
        pair = self.window()
        if pair is None or self.pace is None or not pair[1].same_process(self.pace[0]):
            return None
        return self.pace[1]


@dataclass(frozen=True)
class Straggler:
    slice: int
    pod: str
    node: str | None
    metric: str  # "data wait" or "step time"
    value: float
    median: float
    score: float

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f" on node {self.node}" if self.node else "")
        return (
            f"{where} (slice {self.slice}) spends {self.value:.3f} s per step in {self.metric}; "
            f"its peers' median is {self.median:.3f} s (robust z {self.score:.1f})"
        )


def robust_scores(values: list[float]) -> list[float]:
    """Modified z-scores, 0.6745 (x - median) / MAD.

    When more than half the values are equal the MAD is 0: the majority agree exactly, so
    any value above them scores infinity (the practical floor still applies).
    """
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    if mad > 0:
        return [0.6745 * (v - median) / mad for v in values]
    return [math.inf if v > median else 0.0 for v in values]


@dataclass
class JobTrack:
    attempt: int
    workers: dict[str, WorkerTrack] = field(default_factory=dict)
    step: float | None = None
    advanced_at: float | None = None
    excluded_at_advance: float = 0.0
    resumed_from: float | None = None
    last_leader_read: float | None = None
    last_full_round: float | None = None
    answered: int = 0
    asked: int = 0

    def worker(
        self, pod: str, slice_index: int, worker_index: int, node: str | None
    ) -> WorkerTrack:
        track = self.workers.get(pod)
        if track is None:
            track = self.workers[pod] = WorkerTrack(pod, slice_index, worker_index, node)
        track.node = node
        return track

    def observe(self, track: WorkerTrack, sample: WorkerSample) -> None:
        if sample.finished and track.latest is not None and track.latest.finished:
            return  # training is over: keep the window that ends at its last reading
        track.add(sample)
        if track.worker != 0 or sample.step is None:
            return
        self.last_leader_read = sample.at
        if track.slice == 0 and self.resumed_from is None:
            self.resumed_from = sample.resumed_from
        if self.step is None or sample.step > self.step:
            self.step = sample.step
            self.advanced_at = sample.at
            self.excluded_at_advance = excluded_seconds(sample)

    def leader(self) -> WorkerTrack | None:
        leaders = [t for t in self.workers.values() if t.worker == 0 and t.latest is not None]
        return min(leaders, key=lambda t: t.slice) if leaders else None

    def stalled_for(self, now: float) -> float | None:
        """Seconds without step progress (excluded phases deducted), once a step was made."""
        leader = self.leader()
        if leader is None or self.advanced_at is None or leader.latest is None:
            return None
        if leader.latest.steps_total < 1:
            return None  # no step yet in this attempt: initialization and compilation
        if leader.latest.finished:
            return None  # training is over; the worker only still serves its metrics
        excluded = max(excluded_seconds(leader.latest) - self.excluded_at_advance, 0.0)
        return max(now - self.advanced_at - excluded, 0.0)

    def stragglers(self, threshold: float) -> list[Straggler]:
        groups: dict[int, list[tuple[WorkerTrack, tuple[float, float]]]] = {}
        for track in self.workers.values():
            figures = track.per_step()
            if figures is not None:
                groups.setdefault(track.slice, []).append((track, figures))
        small = [g for g in groups.values() if len(g) < MIN_GROUP]
        if small:
            merged = [item for g in small for item in g]
            groups = {s: g for s, g in groups.items() if len(g) >= MIN_GROUP}
            if len(merged) >= MIN_GROUP:
                groups[-1] = merged
        found: list[Straggler] = []
        for members in groups.values():
            step_median = statistics.median(f[0] for _, f in members)
            floor = 0.1 * step_median
            for metric, index in (("data wait", 1), ("step time", 0)):
                values = [f[index] for _, f in members]
                median = statistics.median(values)
                for (track, _), value, score in zip(
                    members, values, robust_scores(values), strict=True
                ):
                    if score > threshold and value - median >= floor:
                        found.append(
                            Straggler(
                                track.slice, track.pod, track.node, metric, value, median, score
                            )
                        )
        unique: dict[str, Straggler] = {}
        for straggler in sorted(found, key=lambda s: -s.score):
            unique.setdefault(straggler.pod, straggler)
        return sorted(unique.values(), key=lambda s: (s.slice, s.pod))


def excluded_seconds(sample: WorkerSample) -> float:
    return sum(sample.phases.get(phase, 0.0) for phase in EXCLUDED_PHASES)
