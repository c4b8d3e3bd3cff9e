"""Turn a job's samples into status: progress figures and the goodput account (pure).

Goodput = productive step time / wall time since the job was created. The account uses
worker 0 of slice 0 as the job's clock (every worker of a synchronous job spends the same
wall time): its phase counters for the current attempt, plus totals carried over from
earlier attempts. Badput categories: scheduling (creation until the first attempt's
workers all ran), initialization (rendezvous and start-up), compilation, data wait,
checkpoint save and restore, lost progress (steps redone after a resume: the previous
attempt's last step minus the step the next attempt resumed from, times the previous
attempt's mean step time; those seconds are taken out of productive time), restart
downtime (from a failure until the next attempt's workers all ran), shutdown (from the end
of training, the worker's end time, until the attempt ended: final metrics served, the
distributed runtime shut down, the process exited), suspended (from a suspension or a
Kueue eviction until the job was resumed; the wait for the resumed attempt's workers is
scheduling again), degraded (the capacity an elastic job lacks while it trains on fewer
slices than it asked for: its step time times the missing share of its slices; those
seconds are taken out of productive time) and other (the rest).
"""

from __future__ import annotations

import math

from tpu_operator.api.monitoring import Goodput, Progress, SlowestWorker
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.timestamps import stamp_epoch

# Worker phase label -> badput category (camelCase, as in status).
PHASES = {
    "init": "initialization",
    "compile": "compilation",
    "first_step": "firstStep",
    "data_wait": "dataWait",
    "checkpoint_save": "checkpointSave",
    "checkpoint_restore": "checkpointRestore",
}
SHUTDOWN = "shutdown"
SUSPENDED = "suspended"
DEGRADED = "degraded"
ATTEMPT_END = "attemptEnd"
CARRIED = (
    "step",
    *PHASES.values(),
    "lostProgress",
    "scheduling",
    "restartDowntime",
    SHUTDOWN,
    SUSPENDED,
    DEGRADED,
)
EARLIEST_FIRST = (
    "initialization",
    "checkpointRestore",
    "compilation",
    "firstStep",
    "dataWait",
    "checkpointSave",
    "step",
)
"""The worker's categories in the order its seconds usually come after it starts."""


def _round(value: float | None, digits: int = 3) -> float | None:
    """A status figure: rounded; None (left out) when not finite, which JSON cannot hold."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


def progress(track: JobTrack, total_workers: int) -> Progress:
    leader = track.leader()
    latest = leader.latest if leader else None
    rates: dict[str, list[float]] = {"examples": [], "tokens": [], "flops": [], "peak": []}
    for worker in track.workers.values():
        pair = worker.window()
        if pair is None:
            continue
        for name in ("examples", "tokens", "flops"):
            value = worker.rate(name)
            if value is not None:
                rates[name].append(value)
        if pair[1].peak_flops:
            rates["peak"].append(pair[1].peak_flops)
    known = len(rates["tokens"])
    scale = total_workers / known if known else 0.0
    flops, peak = sum(rates["flops"]), sum(rates["peak"])
    slowest = []
    per_slice: dict[int, tuple[float, float, str, str | None]] = {}
    for worker in track.workers.values():
        figures = worker.per_step()
        if figures is None:
            continue
        step_seconds, wait = figures
        best = per_slice.get(worker.slice)
        if best is None or (wait, step_seconds) > (best[1], best[0]):
            per_slice[worker.slice] = (step_seconds, wait, worker.pod, worker.node)
    for index, (step_seconds, wait, pod, node) in sorted(per_slice.items()):
        slowest.append(
            SlowestWorker(
                slice=index,
                pod=pod,
                node=node,
                step_seconds=_round(step_seconds, 4),
                data_wait_seconds=_round(wait, 4),
            )
        )
    return Progress(
        step=int(latest.step) if latest and latest.step is not None else None,
        steps_per_second=_round(leader.rate("steps_total") if leader else None),
        examples_per_second=_round(sum(rates["examples"]) * scale if known else None, 1),
        tokens_per_second=_round(sum(rates["tokens"]) * scale if known else None, 1),
        mfu=_round(flops / peak if peak and rates["flops"] else None, 4),
        loss=_round(latest.loss if latest else None, 6),
        last_progress_time=stamp_epoch(track.advanced_at) if track.advanced_at else None,
        sampled_time=stamp_epoch(latest.at) if latest else None,
        workers_reporting=f"{track.answered}/{track.asked}" if track.asked else None,
        slowest_workers=slowest,
    )


def attempt_totals(
    sample: WorkerSample | None, running_since: float | None = None
) -> dict[str, float]:
    """The current attempt's seconds per category, from worker 0 of slice 0.

    The worker's ``init`` phase starts with its process, which runs before the operator
    sees every worker of the gang running (``running_since``); until then the time is
    already booked as a wait (scheduling or restart downtime), so that part of ``init`` is
    left out rather than counted twice. When the operator saw the gang running only after
    the worker's init ended (a busy operator or apiserver), the worker counted more
    seconds than have passed since ``running_since``: that excess, too, was booked as the
    wait, and comes out of the phases that follow init, in the order a training program
    usually runs them (``EARLIEST_FIRST``)."""
    if sample is None:
        return {}
    totals = {"step": sample.phases.get("step", 0.0)}
    for phase, category in PHASES.items():
        totals[category] = sample.phases.get(phase, 0.0)
    if running_since is not None and sample.start_time:
        overlap = max(running_since - sample.start_time, 0.0)
        totals["initialization"] = max(totals["initialization"] - overlap, 0.0)
        excess = sum(totals.values()) - max(sample.at - running_since, 0.0)
        for category in EARLIEST_FIRST:
            if excess <= 0:
                break
            taken = min(excess, totals[category])
            totals[category] -= taken
            excess -= taken
    return totals


def shutdown_seconds(sample: WorkerSample | None, now: float) -> float:
    """Seconds since the worker finished training (0 while it trains)."""
    if sample is None or not sample.end_time:
        return 0.0
    return max(now - sample.end_time, 0.0)


def carry_over(
    carried: dict[str, float],
    sample: WorkerSample | None,
    closed_at: float | None = None,
    running_since: float | None = None,
    degraded: float = 0.0,
) -> dict[str, float]:
    """Totals after an attempt ends (at ``closed_at``): its seconds added to the carried
    totals. ``degraded``: the share of the job's slices the attempt ran without."""
    merged = dict(carried)
    totals = attempt_totals(sample, running_since)
    for key, value in totals.items():
        merged[key] = merged.get(key, 0.0) + value
    if degraded and totals.get("step"):
        merged[DEGRADED] = merged.get(DEGRADED, 0.0) + totals["step"] * degraded
    if sample is not None:
        # The attempt's seconds are counted up to this reading: the downtime that follows
        # it is booked from no earlier than here (a stall fails at its last step, before
        # the last readings).
        merged[ATTEMPT_END] = sample.at
    if closed_at is not None and (tail := shutdown_seconds(sample, closed_at)):
        merged[SHUTDOWN] = merged.get(SHUTDOWN, 0.0) + tail
        merged[ATTEMPT_END] = max(merged[ATTEMPT_END], closed_at)  # shutdown runs to here
    if sample is not None and sample.step is not None:
        merged["previousStep"] = sample.step
        merged["previousStepSeconds"] = productive_per_step(sample)
    return merged


def productive_per_step(sample: WorkerSample) -> float:
    """The productive seconds of one of the process's steps: its ``step`` phase over the
    steps it covers (every step but the first, which has a phase of its own; a worker
    from before ``first_step`` counted the first in ``step``). Not the steps' wall time:
    what a redone step costs is taken out of productive time, and the compilation, data
    waits and checkpoints in the attempt's steps are already booked as their own badput."""
    covered = sample.steps_total - (1 if "first_step" in sample.phases else 0)
    return sample.phases.get("step", 0.0) / covered if covered > 0 else 0.0


def account_resume(carried: dict[str, float], resumed_from: float | None) -> dict[str, float]:
    """Once a new attempt reports where it resumed, book the steps it has to redo."""
    if resumed_from is None or "previousStep" not in carried:
        return carried
    merged = dict(carried)
    redone = max(merged.pop("previousStep") - resumed_from, 0.0)
    mean = merged.pop("previousStepSeconds", 0.0)
    merged["lostProgress"] = merged.get("lostProgress", 0.0) + redone * mean
    return merged


def goodput(
    *,
    created: float,
    now: float,
    carried: dict[str, float],
    current: WorkerSample | None,
    waiting_since: float | None,
    waiting_kind: str,
    running_since: float | None = None,
    degraded: float = 0.0,
) -> Goodput:
    """The account at ``now``. ``waiting_since``: start of an ongoing scheduling wait or
    restart downtime (``waiting_kind``), not yet carried. ``degraded``: the share of the
    job's slices the current attempt runs without."""
    totals = {k: v for k, v in carried.items() if k in CARRIED}
    current_totals = attempt_totals(current, running_since)
    for key, value in current_totals.items():
        totals[key] = totals.get(key, 0.0) + value
    if degraded and current_totals.get("step"):
        totals[DEGRADED] = totals.get(DEGRADED, 0.0) + current_totals["step"] * degraded
    if tail := shutdown_seconds(current, now):
        totals[SHUTDOWN] = totals.get(SHUTDOWN, 0.0) + tail
    if waiting_since is not None:
        totals[waiting_kind] = totals.get(waiting_kind, 0.0) + max(now - waiting_since, 0.0)
    wall = max(now - created, 0.0)
    lost = totals.get("lostProgress", 0.0) + totals.get(DEGRADED, 0.0)
    productive = max(totals.get("step", 0.0) - lost, 0.0)
    badput = {
        category: round(totals.get(category, 0.0), 1)
        for category in (
            "scheduling",
            *PHASES.values(),
            "lostProgress",
            "restartDowntime",
            SHUTDOWN,
            SUSPENDED,
            DEGRADED,
        )
    }
    badput["other"] = round(max(wall - productive - sum(badput.values()), 0.0), 1)
    return Goodput(
        fraction=round(productive / wall, 4) if wall > 0 else 0.0,
        wall_seconds=round(wall, 1),
        productive_seconds=round(productive, 1),
        badput_seconds=badput,
        finished_attempts={k: round(v, 3) for k, v in carried.items()},
    )
