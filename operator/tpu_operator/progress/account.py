"""A TPUJob's progress and goodput account across its attempts (pure).

The job reconciler calls this at three moments of an attempt's life, and the account
updates ``status.progress``, ``status.goodput`` and ``status.runningSince``:

- ``began_running``: every worker of the attempt runs. The wait before it is booked as
  ``scheduling`` (first attempt) or ``restartDowntime`` (from the failure that ended the
  previous attempt).
- ``publish``: on every reconcile while the attempt lives. Fresh progress is published at
  most once per ``publish_interval`` (progress changes on every sample; each write costs
  the apiserver and every watcher), and whenever the carried totals change.
- ``close_attempt``: the attempt ended (restart, failure, success). Its last progress and
  its seconds per category are carried over into ``goodput.finishedAttempts``.
- ``suspend`` and ``resume``: the job was suspended (``spec.suspend``, or evicted by
  Kueue) and later resumed. The attempt that ran is closed; the time until the resume is
  booked as ``suspended``, and the time from the resume until every worker of the next
  attempt runs as ``scheduling``, as for the first attempt. Each attempt has its own
  ``runningSince``.

Figures come from the progress sampler's track of the job (worker 0 of slice 0 is the
job's clock, see ``report``); without one (monitoring off, or no sample yet) the account
still books waits.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tpu_operator.api.job import TPUJobStatus
from tpu_operator.api.status import Phase
from tpu_operator.progress import report
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.timestamps import parse, stamp

WAIT_SCHEDULING = "scheduling"
WAIT_RESTART = "restartDowntime"
WAIT_SUSPENDED = report.SUSPENDED
SUSPENDED_AT = "suspendedAt"
"""Carried while the job is suspended: when it was (epoch seconds)."""
RESUMED_AT = "resumedAt"
"""Carried from a resume until the resumed attempt runs: when the job was resumed."""


@dataclass
class Account:
    """The account of one job at one reconcile; mutates ``status`` only."""

    status: TPUJobStatus
    created: dt.datetime
    now: dt.datetime
    track: JobTrack | None
    """The sampler's track of the current attempt (None: no samples)."""
    publish_interval: float = 30.0
    desired_slices: int = 1
    """The job's numSlices (an elastic job may run on fewer: ``status.activeSlices``)."""

    def degraded(self) -> float:
        """The share of the job's slices the current attempt runs without."""
        active = self.status.active_slices
        if active is None or self.desired_slices < 1 or active >= self.desired_slices:
            return 0.0
        return (self.desired_slices - active) / self.desired_slices

    def carried(self) -> dict[str, float]:
        goodput = self.status.goodput
        return dict(goodput.finished_attempts) if goodput else {}

    def _set_goodput(
        self, carried: dict[str, float], waiting: tuple[float, str] | None, *, live: bool = True
    ) -> None:
        leader = self.track.leader() if self.track and live else None
        self.status.goodput = report.goodput(
            created=self.created.timestamp(),
            now=self.now.timestamp(),
            carried=carried,
            current=leader.latest if leader else None,
            waiting_since=waiting[0] if waiting else None,
            waiting_kind=waiting[1] if waiting else "other",
            running_since=self._running_since(),
            degraded=self.degraded() if live else 0.0,
        )

    def _running_since(self) -> float | None:
        since = parse(self.status.running_since)
        return since.timestamp() if since else None

    def waiting(self) -> tuple[float, str] | None:
        """An ongoing scheduling wait, suspension or restart downtime, not yet carried."""
        status = self.status
        carried = self.carried()
        if SUSPENDED_AT in carried:
            return carried[SUSPENDED_AT], WAIT_SUSPENDED
        if status.running_since is not None:
            return None
        if RESUMED_AT in carried:
            return carried[RESUMED_AT], WAIT_SCHEDULING
        if status.restarts == 0:
            return self.created.timestamp(), WAIT_SCHEDULING
        since = self._downtime_since()
        return (since, WAIT_RESTART) if since is not None else None

    def _downtime_since(self) -> float | None:
        """When restart downtime began: the failure, or the end of the previous attempt's
        counted seconds if that is later (no second is booked twice)."""
        status = self.status
        failed_at = parse(status.last_failure.time) if status.last_failure else None
        if failed_at is None:
            return None
        return max(failed_at.timestamp(), self.carried().get(report.ATTEMPT_END, 0.0))

    def close_attempt(self, total_workers: int, *, ended: bool = False) -> None:
        """The attempt ended: its last progress into status, its seconds carried over.
        ``ended``: it was ended on purpose now (no failure before): the restart downtime
        that follows is booked from now on."""
        leader = self.track.leader() if self.track else None
        if self.track is not None and leader is not None:
            self.status.progress = report.progress(self.track, total_workers)
        carried = report.carry_over(
            self.carried(),
            leader.latest if leader else None,
            closed_at=self.now.timestamp(),
            running_since=self._running_since(),
            degraded=self.degraded(),
        )
        if ended:
            now = self.now.timestamp()
            carried[report.ATTEMPT_END] = max(carried.get(report.ATTEMPT_END, 0.0), now)
        self.status.running_since = None
        self._set_goodput(carried, None, live=False)

    def suspend(self, total_workers: int) -> None:
        """The job is suspended (or evicted) from now on: the attempt that ran, if any, is
        closed, and the time until ``resume`` is booked as ``suspended``. Called on every
        reconcile of a suspended job; only the first one changes anything."""
        if SUSPENDED_AT in self.carried():
            return
        # A wait that was going on (the attempt had not run yet) is booked up to now.
        ongoing = self.waiting() if self.status.running_since is None else None
        if self.status.running_since is not None or self.track is not None:
            self.close_attempt(total_workers)
        carried = self.carried()
        now = self.now.timestamp()
        if ongoing is not None:
            since, kind = ongoing
            carried[kind] = carried.get(kind, 0.0) + max(now - since, 0.0)
            carried[report.ATTEMPT_END] = max(carried.get(report.ATTEMPT_END, 0.0), now)
        carried.pop(RESUMED_AT, None)  # booked above if the resumed attempt never ran
        carried[SUSPENDED_AT] = now
        self.status.running_since = None
        self._set_goodput(carried, None, live=False)

    def resume(self) -> None:
        """The suspended job is resumed: its suspension is booked, and the wait for its
        next attempt's workers to run is scheduling from now on."""
        carried = self.carried()
        since = carried.pop(SUSPENDED_AT, None)
        if since is None:
            return
        now = self.now.timestamp()
        carried[WAIT_SUSPENDED] = carried.get(WAIT_SUSPENDED, 0.0) + max(now - since, 0.0)
        carried[RESUMED_AT] = now
        carried[report.ATTEMPT_END] = max(carried.get(report.ATTEMPT_END, 0.0), now)
        self.status.running_since = None
        self._set_goodput(carried, None, live=False)

    def began_running(self, first_attempt: bool) -> None:
        """Every worker of the attempt runs: book the wait that preceded it."""
        status = self.status
        # The wait ends at the second runningSince records (status timestamps have second
        # precision): the worker's time after it is taken from its own counters, measured
        # from the same second, so the part of a second in between is booked once.
        ran = self.now.replace(microsecond=0)
        status.running_since = stamp(ran)
        carried = self.carried()
        since = self._downtime_since()
        resumed = carried.pop(RESUMED_AT, None)
        if resumed is not None:
            carried[WAIT_SCHEDULING] = carried.get(WAIT_SCHEDULING, 0.0) + max(
                ran.timestamp() - resumed, 0.0
            )
        elif first_attempt:
            carried[WAIT_SCHEDULING] = max((ran - self.created).total_seconds(), 0.0)
        elif since is not None:
            carried[WAIT_RESTART] = carried.get(WAIT_RESTART, 0.0) + max(
                ran.timestamp() - since, 0.0
            )
        self._set_goodput(carried, None)

    def publish(self, phase: Phase, total_workers: int, fresh: bool = False) -> None:
        """Refresh progress (when due, or now if ``fresh``: a condition written with it
        speaks of the same figures) and the goodput account during an attempt."""
        track, status = self.track, self.status
        if track is None or track.leader() is None:
            if status.goodput is None or phase != Phase.RUNNING:
                self._set_goodput(self.carried(), self.waiting())
            return
        carried = report.account_resume(self.carried(), track.resumed_from)
        published = parse(status.progress.sampled_time) if status.progress else None
        latest = report.progress(track, total_workers)
        first_step = (
            status.progress is not None and status.progress.step is None and latest.step is not None
        )
        due = (
            fresh
            or published is None
            or (self.now - published).total_seconds() >= self.publish_interval
            or first_step
        )
        # A finished worker's figures stop moving: nothing new to publish then.
        due = due and latest != status.progress
        if due or carried != self.carried():
            status.progress = latest
            self._set_goodput(carried, self.waiting())
