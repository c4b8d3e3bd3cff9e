"""Supervision of a local cluster's components, as a kubelet restarts static pods.

The process that started the components (the foreground launcher, or the daemon of a
detached cluster, :mod:`localcluster.daemon`) is their parent and restarts each one that
exits, with the command line recorded in ``state.json``:

- **Back-off** (:func:`next_restart`, pure): the first exit is restarted at once; exits in
  a row after short runs wait 1 s, 2 s, 4 s, ... up to 30 s, as a kubelet's
  CrashLoopBackOff doubles 10 s up to 5 min; a component that ran 60 s before exiting
  starts a new series (the kubelet: 10 min).
- **Deliberate stops**: a component named in the state's ``held`` list (written by
  :meth:`localcluster.Cluster.kill_component` before its kill) is left down until
  :meth:`~localcluster.Cluster.start_component` takes it off the list; it is then started
  at once, with no back-off.
- Every decision is logged: ``kube-scheduler exited with code 137 (SIGKILL) after 42.0 s;
  restarting in 0 s``.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from localcluster.layout import Layout, locked, read_state


@dataclass(frozen=True)
class Backoff:
    """How long a component that keeps exiting waits before each restart."""

    first: float = 1.0
    """Seconds before the second restart of a series (the first one is immediate)."""
    cap: float = 30.0
    """Longest wait."""
    reset_after: float = 60.0
    """A run at least this long before the exit starts a new series."""


BACKOFF = Backoff()


@dataclass(frozen=True)
class Restart:
    streak: int
    """Exits in this series, this one included (1: the first, restarted at once)."""
    delay: float
    """Seconds to wait before starting the component again."""


def next_restart(streak: int, ran: float, policy: Backoff = BACKOFF) -> Restart:
    """The restart after an exit: ``streak`` exits so far in the current series, ``ran``
    seconds from the component's last start to this exit."""
    streak = 1 if ran >= policy.reset_after else streak + 1
    delay = 0.0 if streak == 1 else min(policy.cap, policy.first * 2.0 ** (streak - 2))
    return Restart(streak, delay)


def describe_exit(returncode: int) -> str:
    """``exited with code 1``; a signal as a shell and a kubelet report it:
    ``exited with code 137 (SIGKILL)``."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"exited with code {128 + number} ({name})"


@dataclass
class _Down:
    returncode: int | None
    restart_at: float | None
    """When to start it again (None: held, until released)."""


@dataclass
class _Watch:
    started: float
    streak: int = 0
    down: _Down | None = None


class Supervisor:
    """Restarts the components of one cluster from the process that is their parent.

    ``children`` gives the current process of each component (``started``: when each was
    started, ``time.monotonic()``); ``respawn(name, argv)`` starts one again (and records
    it, in ``state.json`` too) and is called with the directory's lock held. :meth:`run`
    loops until ``until`` is set, :attr:`closing` is set (the owner stops the cluster) or
    ``state.json`` no longer says running (stopped by another process).
    """

    def __init__(
        self,
        layout: Layout,
        children: Callable[[], Mapping[str, subprocess.Popen[bytes]]],
        respawn: Callable[[str, Sequence[str]], subprocess.Popen[bytes]],
        log: Callable[[str], None],
        *,
        policy: Backoff = BACKOFF,
        interval: float = 0.2,
        started: Mapping[str, float] | None = None,
    ) -> None:
        self.layout = layout
        self.children = children
        self.respawn = respawn
        self.log = log
        self.policy = policy
        self.interval = interval
        self.closing = threading.Event()
        """Set by the owner before it stops the components: none is restarted any more."""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        now = time.monotonic()
        self._watches = {name: _Watch((started or {}).get(name, now)) for name in children()}

    def start_thread(self) -> None:
        """Supervise from a daemon thread of this process (a foreground cluster)."""
        self._thread = threading.Thread(
            target=self.run, args=(self._done,), name="localcluster-supervisor", daemon=True
        )
        self._thread.start()

    def finish(self) -> None:
        """End :meth:`run` (after the owner stopped the components: in the foreground,
        the ones this thread started get their death signal when it ends)."""
        self.closing.set()
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def run(self, until: threading.Event) -> None:
        while not until.wait(self.interval) and not self._done.is_set():
            if not self.tick():
                return

    def tick(self) -> bool:
        """Look at every component once; False when the cluster no longer runs."""
        for name, child in list(self.children().items()):
            watch = self._watches.setdefault(name, _Watch(time.monotonic()))
            if watch.down is None:
                code = child.poll()
                if code is None:
                    continue
                if self.closing.is_set():
                    return True
                state = read_state(self.layout) or {}
                if state.get("status") != "running":
                    return False
                held = name in (state.get("held") or ())
                killed = (state.get("killed") or {}).get(name) == child.pid
                self._exited(name, watch, code, held=held, deliberate=held or killed)
            if not self._due(name, watch):
                continue
            with locked(self.layout):
                if self.closing.is_set():
                    return True
                state = read_state(self.layout) or {}
                if state.get("status") != "running":
                    return False
                if name in (state.get("held") or ()):  # held while it waited out a back-off
                    watch.down = _Down(watch.down.returncode if watch.down else None, None)
                    self.log(f"{name} is stopped on purpose: not restarted until it is started")
                    continue
                try:
                    new = self.respawn(name, state["commands"][name])
                except OSError as error:
                    self._exited(name, watch, None, how=f"could not be started ({error})")
                    continue
            watch.started, watch.down = time.monotonic(), None
            self.log(f"{name} started again (pid {new.pid})")
        return True

    def _exited(
        self,
        name: str,
        watch: _Watch,
        code: int | None,
        *,
        held: bool = False,
        deliberate: bool = False,
        how: str | None = None,
    ) -> None:
        """Plan what follows an exit: ``deliberate``, a kill by ``kill_component``
        (``held``: it is still to stay down); otherwise a restart after the back-off."""
        now = time.monotonic()
        ran = now - watch.started
        what = how or (describe_exit(code) if code is not None else "exited")
        if deliberate:
            watch.down = _Down(code, None if held else now)
            until = "not restarted until it is started again" if held else "starting it again"
            self.log(f"{name} {what} after {ran:.1f} s: stopped on purpose, {until}")
            return
        restart = next_restart(watch.streak, ran, self.policy)
        watch.streak = restart.streak
        watch.down = _Down(code, now + restart.delay)
        series = f" (exit {restart.streak} in a row)" if restart.streak > 1 else ""
        self.log(
            f"{name} {what} after {ran:.1f} s; restarting in {restart.delay:g} s{series}; "
            f"log: {self.layout.log(name)}"
        )

    def _due(self, name: str, watch: _Watch) -> bool:
        """Whether a component that is down should be started now."""
        down = watch.down
        if down is None:
            return False
        if down.restart_at is not None:
            return time.monotonic() >= down.restart_at
        # Held: released once the state's list no longer names it (started at once).
        return name not in ((read_state(self.layout) or {}).get("held") or ())
