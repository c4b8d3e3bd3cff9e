"""Wall-time accounting: which phase each second of a worker's life belongs to.

Time after initialization is cut into step intervals (from the end of one recorded step to
the end of the next). Phases opened inside an interval (data wait, checkpoint save and
restore, custom phases, and JAX compilation, which arrives from jax.monitoring) take their
seconds out of it; what is left of the interval is productive step time, except in the
process's first interval: what is left of that one is the first step's own phase (the
first execution, the collectives' set-up, and the wait in them for peers that still
compile or restore: with JAX's persistent compilation cache one process may load its
programs in a second while another compiles for minutes). A restarted process pays it
again, so it is not productive. Phases nest: the innermost one owns a second, so no second
is counted twice and the phases add up to the wall time the training loop spent. Time a
phase measures on a thread other than the training loop's runs concurrently with the loop:
it is counted in its phase but taken out of nothing.

Open intervals count too: ``open_seconds()`` says how many seconds each open frame owns so
far, so that the exported counters advance while a phase runs rather than by a whole step
or checkpoint when it ends (a rate over a window shorter than a phase would otherwise show
more than 100 % of wall time for that phase). What an open frame shows never exceeds what
it owns when it closes, except when seconds measured elsewhere (a compile span reported
after the fact) are taken out of it later; the exporter (``metrics.PhaseSeconds``) keeps
its counters monotonic and shows no second twice.

The open step interval is the exception to showing everything: step time is productive
only once the step ends, and a hung step would otherwise read as training at full speed.
So it shows at most ``limit_open_step()`` seconds (the reporter sets twice the median
step); a step that runs longer hands over the rest when it ends, and one that never ends
(a hang, a crash) leaves it uncounted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Sink = Callable[[str, float], None]


@dataclass
class Frame:
    """One open interval: a phase, or the current step interval (the root)."""

    phase: str
    start: float  # time.monotonic()
    nested: float = 0.0  # seconds owned by phases inside this one

    def close(self, now: float) -> float:
        """Seconds this frame owns itself (its duration less nested phases)."""
        return max(0.0, now - self.start - self.nested)


class Intervals:
    """Union of recent [start, end) spans; answers how much of a new span is not yet in it.

    JAX reports nested compile spans (tracing an inner jit while tracing the outer one);
    counting only the uncovered part keeps compile time from being counted twice.
    """

    def __init__(self, keep: int = 256) -> None:
        self._spans: list[tuple[float, float]] = []
        self._keep = keep

    def add(self, start: float, end: float) -> float:
        """Insert [start, end); return the length not covered before."""
        if end <= start:
            return 0.0
        covered = 0.0
        merged_start, merged_end = start, end
        kept: list[tuple[float, float]] = []
        for s, e in self._spans:
            if e < start or s > end:
                kept.append((s, e))
                continue
            covered += max(0.0, min(e, end) - max(s, start))
            merged_start, merged_end = min(merged_start, s), max(merged_end, e)
        kept.append((merged_start, merged_end))
        kept.sort()
        self._spans = kept[-self._keep :]
        return (end - start) - covered


class Accountant:
    """Attributes wall time to phases and hands each attribution to ``sink(phase, seconds)``."""

    def __init__(
        self,
        sink: Sink,
        step_phase: str,
        clock: Callable[[], float] = time.monotonic,
        first_step_phase: str | None = None,
    ):
        self._sink = sink
        self._step_phase = step_phase
        # The phase of the process's first step interval (None: it is a step like others).
        self._first_step_phase = first_step_phase or step_phase
        self._stepped = False  # a step interval has ended in this process
        self._clock = clock
        self._lock = threading.Lock()
        # Every thread's open frames, by thread ident, so that a scrape on another thread can
        # read them; changed only with the lock held.
        self._stacks: dict[int, list[Frame]] = {}
        self._root = Frame(self._first_step_phase, clock())
        self._loop_thread: int | None = None
        self._compile_spans = Intervals()
        self._open_step_limit: float | None = None

    def _stack(self) -> list[Frame]:
        """The calling thread's open frames (call with the lock held)."""
        ident = threading.get_ident()
        stack = self._stacks.get(ident)
        if stack is None:
            stack = self._stacks[ident] = []
        return stack

    def _innermost(self) -> Frame | None:
        """The frame that owns the calling thread's time now (call with the lock held)."""
        stack = self._stacks.get(threading.get_ident())
        if stack:
            return stack[-1]
        if threading.get_ident() == self._loop_thread:
            return self._root
        return None

    def _interval_phase(self) -> str:
        """The phase of the step interval that starts now (call with the lock held)."""
        return self._step_phase if self._stepped else self._first_step_phase

    def start_loop(self) -> None:
        """The calling thread runs the training loop; its step interval starts now."""
        with self._lock:
            self._loop_thread = threading.get_ident()
            self._root = Frame(self._interval_phase(), self._clock())

    def end_loop(self) -> None:
        """The training loop returned: the open step interval is dropped, not counted."""
        with self._lock:
            self._loop_thread = None
            self._root = Frame(self._interval_phase(), self._clock())

    def limit_open_step(self, seconds: float | None) -> None:
        """Show at most ``seconds`` of the open step interval's own time (None: all)."""
        with self._lock:
            self._open_step_limit = seconds

    def open(self, phase: str) -> Frame:
        with self._lock:
            frame = Frame(phase, self._clock())
            self._stack().append(frame)
        return frame

    def close(self, frame: Frame) -> float:
        """Close ``frame`` (and anything left open inside it); return its duration."""
        closed: list[tuple[str, float]] = []
        with self._lock:
            # Popping a frame and moving its seconds into its parent happen under one lock,
            # so that open_seconds() never sees them in both or in neither.
            now = self._clock()
            stack = self._stack()
            while stack:
                top = stack.pop()
                closed.append((top.phase, top.close(now)))
                parent = self._innermost()
                if parent is not None:
                    parent.nested += now - top.start
                if top is frame:
                    break
            if not stack and threading.get_ident() != self._loop_thread:
                del self._stacks[threading.get_ident()]
        for phase, own in closed:
            self._sink(phase, own)
        return now - frame.start

    def open_seconds(self) -> dict[str, float]:
        """Seconds each phase's open frames own so far, on every thread (the step interval
        of the training loop included): what ``close`` and ``end_step`` will hand the sink
        at least, unless seconds measured elsewhere are taken out of a frame first."""
        seconds: dict[str, float] = {}
        with self._lock:
            now = self._clock()
            for ident, stack in self._stacks.items():
                chain = [self._root, *stack] if ident == self._loop_thread else stack
                self._add_open(seconds, chain, now)
            if self._loop_thread is not None and self._loop_thread not in self._stacks:
                self._add_open(seconds, [self._root], now)
        return seconds

    def _add_open(self, seconds: dict[str, float], chain: list[Frame], now: float) -> None:
        """Own seconds so far of each frame of one thread, outermost first: a frame owns
        its time up to the start of the frame open inside it, less its closed nested ones
        (call with the lock held)."""
        for i, frame in enumerate(chain):
            until = chain[i + 1].start if i + 1 < len(chain) else now
            own = max(0.0, until - frame.start - frame.nested)
            if frame is self._root and self._open_step_limit is not None:
                own = min(own, self._open_step_limit)
            seconds[frame.phase] = seconds.get(frame.phase, 0.0) + own

    def add_external(self, phase: str, seconds: float) -> None:
        """Seconds of ``phase`` measured elsewhere that ran inside the current frame."""
        if seconds <= 0:
            return
        with self._lock:
            parent = self._innermost()
            if parent is not None:
                parent.nested += seconds
        self._sink(phase, seconds)

    def add_compile_span(self, phase: str, start: float, end: float) -> None:
        """A compile span in wall-clock time; overlapping spans count once."""
        with self._lock:
            fresh = self._compile_spans.add(start, end)
        self.add_external(phase, fresh)

    def end_step(self) -> float:
        """Close the current step interval, attribute its own time (to the first step's
        phase if it is the process's first); return its duration."""
        now = self._clock()
        with self._lock:
            self._loop_thread = threading.get_ident()
            root = self._root
            self._stepped = True
            self._root = Frame(self._step_phase, now)
        self._sink(root.phase, root.close(now))
        return now - root.start
