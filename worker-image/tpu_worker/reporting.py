"""The reporting API for training code: steps, phases, and the stop request.

    import tpu_worker

    report = tpu_worker.reporter()
    for step in range(start, steps):
        with report.data_wait():
            batch = next(batches)
        state, loss = train_step(state, batch)
        report.record_step(step + 1, loss=float(loss), examples=B, tokens=B * T, flops=F)
        if report.should_stop(step + 1):      # SIGTERM somewhere in the job
            with report.checkpoint_save():
                save(state, step + 1)
            break
        if report.checkpoint_requested(step + 1):  # the operator asked for a checkpoint
            with report.checkpoint_save():
                save(state, step + 1)

Call it from the training loop's thread. Everything here is cheap (a few lock-protected
counter updates per step); nothing blocks on the network.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from tpu_worker import metrics as m
from tpu_worker.accounting import Accountant

# Steps the watchdog's median looks back over.
MEDIAN_WINDOW = 100
# A multi-process checkpoint request is saved at least this many steps after the step at
# which a process proposed it: processes run at most one step apart (every step joins a
# collective), so the agreed step is ahead of every process when they learn it.
CHECKPOINT_LEAD_STEPS = 3
# Scrapes show an open step interval's time up to this many median steps: past that the
# step may be hung, and its time counts as step (productive) only if it ends.
OPEN_STEP_SHOWN_MEDIANS = 2.0


class CheckpointExchange(Protocol):
    """How the processes of a job agree on the step of a checkpoint request (the
    launcher's implementation uses the coordination service's key-value store)."""

    processes: int

    def propose(self, sequence: int, step: int) -> None:
        """Publish this process's proposed step for its ``sequence``-th request."""

    def proposals(self, sequence: int) -> list[int]:
        """The proposals published so far for request ``sequence`` (never blocks)."""


def agreed_step(proposals: list[int], processes: int) -> int | None:
    """The step every process saves at: the highest proposal, once all have proposed."""
    if len(proposals) < processes:
        return None
    return max(proposals)


class Reporter:
    """Records progress into ``WorkerMetrics`` and keeps what the watchdog needs."""

    def __init__(
        self,
        worker_metrics: m.WorkerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = worker_metrics or m.WorkerMetrics()
        self._phase_counters: dict[str, m.PhaseCounter] = {}
        # ``clock`` times the phases and steps (tests pass a fake one).
        self._accountant = Accountant(
            self._add_phase_seconds, m.PHASE_STEP, clock, first_step_phase=m.PHASE_FIRST_STEP
        )
        # Until a median step is known (two steps), an open step interval shows nothing.
        self._accountant.limit_open_step(0.0)
        # Scrapes count the open phases' seconds so far (long phases advance as they run).
        self.metrics.phase_seconds.follow(self._accountant.open_seconds)
        self._lock = threading.Lock()
        self._window: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._sorted: list[float] = []
        self._steps_recorded = 0
        self._last_activity = time.monotonic()
        self._last_step = 0
        self._stop = threading.Event()
        self._sync_point: Callable[[int], bool] | None = None
        # Checkpoint requests: received (signal side) vs. taken (training loop side).
        self._checkpoint_requests = 0
        self._checkpoint_taken = 0
        self._checkpoint_lock = threading.Lock()
        self._exchange: CheckpointExchange | None = None
        self._proposed: int | None = None  # sequence of the request this process proposed
        self._target: int | None = None  # agreed step of that request
        # Peak FLOP/s of this process's devices (set by the launcher; None if unknown).
        self.peak_flops_per_second: float | None = None

    # -- phases -------------------------------------------------------------------------

    def _add_phase_seconds(self, phase: str, seconds: float) -> None:
        counter = self._phase_counters.get(phase)
        if counter is None:
            counter = self._phase_counters[phase] = self.metrics.phase_counter(phase)
        counter.inc(seconds)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase: a built-in one (see ``metrics.BUILTIN_PHASES``) or a custom name.

        Custom names must match ``[a-z][a-z0-9_]*`` and at most eight exist per process:
        the phase is a label of ``tpu_worker_phase_seconds_total``.
        """
        if name == m.PHASE_STEP:
            raise ValueError("step time is measured by record_step(), not as a phase")
        if name not in self._phase_counters:
            self._phase_counters[name] = self.metrics.phase_counter(name)  # validates
        frame = self._accountant.open(name)
        try:
            yield
        finally:
            self._accountant.close(frame)
            self._last_activity = time.monotonic()

    def data_wait(self) -> contextlib.AbstractContextManager[None]:
        return self.phase(m.PHASE_DATA_WAIT)

    def checkpoint_save(self) -> contextlib.AbstractContextManager[None]:
        return self.phase(m.PHASE_CHECKPOINT_SAVE)

    def checkpoint_restore(self) -> contextlib.AbstractContextManager[None]:
        return self.phase(m.PHASE_CHECKPOINT_RESTORE)

    def record_init(self, seconds: float) -> None:
        """Seconds from process start to a formed distributed system (the launcher's)."""
        self._add_phase_seconds(m.PHASE_INIT, seconds)

    def add_phase_seconds(self, phase: str, seconds: float) -> None:
        """Attribute seconds measured elsewhere to ``phase`` (taken out of the current step)."""
        self._accountant.add_external(phase, seconds)

    def add_compile_span(self, start: float, end: float) -> None:
        """A JAX compilation span in wall-clock seconds (from the jax.monitoring listener)."""
        self._accountant.add_compile_span(m.PHASE_COMPILE, start, end)
        self._last_activity = time.monotonic()  # a recompile mid-training is not a stall

    # -- steps --------------------------------------------------------------------------

    def start_loop(self) -> None:
        """Mark the start of training (the launcher calls it right after initialization)."""
        self._accountant.start_loop()
        self._last_activity = time.monotonic()

    def end_loop(self) -> None:
        """The training code returned: time after its last step is no step's (the launcher
        calls it; a phase opened later still counts as that phase)."""
        self._accountant.end_loop()

    def record_step(
        self,
        step: int | None = None,
        *,
        loss: float | None = None,
        examples: int = 0,
        tokens: int = 0,
        flops: float = 0.0,
    ) -> None:
        """One training step finished. ``step`` is the global step number now reached.

        ``examples``, ``tokens`` and ``flops`` are this process's share of the step (for the
        demo: the global figure divided by the process count), so that sums over processes
        give job totals.
        """
        duration = self._accountant.end_step()
        now_wall = time.time()
        metrics = self.metrics
        metrics.steps.inc()
        metrics.step_duration.observe(duration)
        self._last_step = self._last_step + 1 if step is None else step
        metrics.step.set(self._last_step)
        if examples:
            metrics.examples.inc(examples)
        if tokens:
            metrics.tokens.inc(tokens)
        if flops:
            metrics.model_flops.inc(flops)
        if loss is not None:
            metrics.loss.set(loss)
        metrics.last_progress.set(now_wall)
        with self._lock:
            # The first step of a process compiles; it would skew the median.
            if self._steps_recorded > 0:
                if len(self._window) == self._window.maxlen:
                    old = self._window[0]
                    del self._sorted[bisect.bisect_left(self._sorted, old)]
                self._window.append(duration)
                bisect.insort(self._sorted, duration)
            self._steps_recorded += 1
        median = self.median_step_seconds()
        if median is not None:
            self._accountant.limit_open_step(OPEN_STEP_SHOWN_MEDIANS * median)
        self._last_activity = time.monotonic()

    @property
    def steps_recorded(self) -> int:
        return self._steps_recorded

    @property
    def last_step(self) -> int:
        return self._last_step

    @property
    def last_activity(self) -> float:
        """time.monotonic() of the last step or phase end: what the watchdog measures from."""
        return self._last_activity

    def median_step_seconds(self) -> float | None:
        """Median duration of recent steps, the first step excluded; None before two steps."""
        with self._lock:
            if not self._sorted:
                return None
            n = len(self._sorted)
            mid = n // 2
            return self._sorted[mid] if n % 2 else (self._sorted[mid - 1] + self._sorted[mid]) / 2

    # -- stop requests (SIGTERM) ----------------------------------------------------------

    def use_sync_point(self, sync_point: Callable[[int], bool] | None) -> None:
        """Agree on the stop step across processes with ``sync_point(step)`` (multi-process)."""
        self._sync_point = sync_point

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        """True once this process got SIGTERM or the job agreed to stop."""
        return self._stop.is_set()

    def should_stop(self, step: int) -> bool:
        """Whether the loop should save a checkpoint now and return. Call it every step.

        In a multi-process job every process returns True at the same step (JAX's
        preemption sync point: the step after the highest one any process had reached
        when the first SIGTERM arrived), so collective checkpoint code is safe to run.
        """
        if self._sync_point is None:
            return self._stop.is_set()
        if self._sync_point(step):
            self._stop.set()
            return True
        return False

    # -- checkpoint requests (SIGUSR1 from the supervisor) -----------------------------------

    def use_checkpoint_exchange(self, exchange: CheckpointExchange | None) -> None:
        """Agree on the step of each checkpoint request across processes (multi-process)."""
        self._exchange = exchange

    def request_checkpoint(self) -> None:
        """Ask the training loop to save a checkpoint soon, without stopping (any thread;
        not from a signal handler: it takes locks)."""
        with self._checkpoint_lock:
            self._checkpoint_requests += 1
        self.metrics.checkpoint_requests.inc()

    def checkpoint_requested(self, step: int) -> bool:
        """Whether the loop should save a checkpoint now (and go on). Call it every step.

        True once per request. In a multi-process job every process returns True at the
        same step (the highest step proposed once every process got the request), so
        collective checkpoint code is safe to run.
        """
        with self._checkpoint_lock:
            pending = self._checkpoint_requests > self._checkpoint_taken
        exchange = self._exchange
        if exchange is None or exchange.processes <= 1:
            if pending:
                with self._checkpoint_lock:
                    self._checkpoint_taken += 1
            return pending
        if self._proposed is None:
            if not pending:
                return False
            with self._checkpoint_lock:
                self._checkpoint_taken += 1
                sequence = self._checkpoint_taken
            exchange.propose(sequence, step + CHECKPOINT_LEAD_STEPS)
            self._proposed = sequence
        if self._target is None:
            self._target = agreed_step(exchange.proposals(self._proposed), exchange.processes)
            if self._target is None:
                return False
        target = self._target
        if step < target:
            return False
        self._proposed = self._target = None
        return step == target


_current: Reporter | None = None
_current_lock = threading.Lock()


def reporter() -> Reporter:
    """The process's reporter (the launcher's; a standalone one outside the launcher)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Reporter()
        return _current


def set_reporter(value: Reporter) -> None:
    global _current
    with _current_lock:
        _current = value
