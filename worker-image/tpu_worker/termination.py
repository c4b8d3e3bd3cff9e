"""SIGTERM (preemption, maintenance, gang teardown): stop at a checkpoint, exit retryable.

On SIGTERM the worker asks the training loop to stop (``Reporter.should_stop``), which
lets it save a checkpoint and return; the launcher then exits with
``contract.EXIT_RETRYABLE``. If the loop has not returned within the grace period (or
the signal comes before training started), the worker dumps its stacks and exits with
the same code on its own.

Two details make this work while JAX runs:

- The signal is seen by a thread reading Python's wakeup fd, written by the C-level
  handler at once, so it is noticed even while the main thread is blocked in XLA.
- ``jax.distributed.initialize`` installs JAX's own SIGTERM handler (its preemption
  notifier, which lets every process agree on a step to save at). ``chain_native()``
  takes that handler's address before putting Python's handler back, and the worker
  calls it on SIGTERM, so JAX's preemption sync still learns of the signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from tpu_operator import contract
from tpu_worker import exits
from tpu_worker.reporting import Reporter

log = logging.getLogger(__name__)

_SA_SIGINFO = 4


class _SigAction(ctypes.Structure):
    # struct sigaction of glibc on Linux (x86_64 and aarch64): handler, 1024-bit mask, flags.
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ubyte * 128),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


def _current_action(signum: int) -> _SigAction | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        action = _SigAction()
        if libc.sigaction(signum, None, ctypes.byref(action)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return action


class TerminationHandler:
    """Owns SIGTERM for the worker process."""

    def __init__(self, reporter: Reporter, grace_s: float) -> None:
        self._reporter = reporter
        self._grace_s = grace_s
        self._state = "init"  # init -> training -> finished
        self._received = threading.Event()
        self._python_action: int | None = None
        self._native: Callable[[], None] | None = None
        self._read_fd, self._write_fd = os.pipe()
        self._wakeups = False
        self._deadline: float | None = None
        os.set_blocking(self._write_fd, False)

    @property
    def received(self) -> bool:
        return self._received.is_set()

    def install(self) -> None:
        """Take SIGTERM and SIGUSR1 (call from the main thread, before anything else runs).

        SIGUSR1 is the supervisor's checkpoint request (``Reporter.request_checkpoint``):
        the reader thread passes it on, outside the signal handler. A supervised process
        starts with SIGUSR1 blocked (``supervisor.main``): a request that came while it
        was starting is pending, and arrives once everything here is in place.
        """
        signal.signal(signal.SIGTERM, self._python_handler)
        signal.signal(signal.SIGUSR1, self._python_usr1_handler)
        try:
            signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
            self._wakeups = True
        except ValueError:  # not the main thread: the Python-level handler does the work
            log.debug("no wakeup fd; SIGTERM is handled when the main thread runs Python")
        action = _current_action(signal.SIGTERM)
        self._python_action = action.handler if action is not None else None
        threading.Thread(target=self._read_wakeups, name="tpu-worker-sigterm", daemon=True).start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})

    def chain_native(self) -> None:
        """After JAX installed its own SIGTERM handler: remember it and take SIGTERM back."""
        action = _current_action(signal.SIGTERM)
        if action is not None and action.handler not in (None, 0, 1, self._python_action):
            address = action.handler
            if action.flags & _SA_SIGINFO:
                info = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
                fn3 = info(address)
                self._native = lambda: fn3(signal.SIGTERM, None, None)
            else:
                plain = ctypes.CFUNCTYPE(None, ctypes.c_int)
                fn1 = plain(address)
                self._native = lambda: fn1(signal.SIGTERM)
            log.debug("chained JAX's native SIGTERM handler at %#x", address)
        signal.signal(signal.SIGTERM, self._python_handler)

    def time_left(self) -> float | None:
        """Seconds until the SIGTERM grace period ends this process (None: no SIGTERM)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def training_started(self) -> None:
        self._state = "training"

    def training_finished(self) -> None:
        """From now on SIGTERM only ends ``wait()``: the work is done, exit code stays 0."""
        self._state = "finished"

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return early (True) when SIGTERM arrives."""
        return self._received.wait(seconds)

    def _python_handler(self, signum: int, frame: object) -> None:
        # The wakeup fd already told the reader thread; this runs only if the fd was
        # replaced (e.g. by an asyncio loop in user code).
        if not self._received.is_set():
            self._on_sigterm()

    def _python_usr1_handler(self, signum: int, frame: object) -> None:
        if not self._wakeups:  # no reader thread sees it: hand it to a thread (no locks here)
            threading.Thread(target=self._on_sigusr1, daemon=True).start()

    def _read_wakeups(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            for _ in range(data.count(signal.SIGUSR1)):
                self._on_sigusr1()
            if signal.SIGTERM in data and not self._received.is_set():
                self._on_sigterm()

    def _on_sigusr1(self) -> None:
        log.info("SIGUSR1: checkpoint requested; the training loop saves one soon")
        self._reporter.request_checkpoint()

    def _on_sigterm(self) -> None:
        if self._received.is_set():
            return
        self._received.set()
        if self._state == "finished":
            log.info("SIGTERM received after training finished")
            return
        self._reporter.request_stop()
        if self._native is not None:
            with contextlib.suppress(Exception):
                self._native()
        if self._state == "init":
            exits.hard_exit(contract.EXIT_RETRYABLE, "SIGTERM before training started")
        log.warning(
            "SIGTERM received: asking the training loop to save a checkpoint and stop; "
            "exiting with code %d within %gs",
            contract.EXIT_RETRYABLE,
            self._grace_s,
        )
        self._deadline = time.monotonic() + self._grace_s
        timer = threading.Timer(self._grace_s, self._grace_expired)
        timer.daemon = True
        timer.start()

    def _grace_expired(self) -> None:
        exits.dump_stacks("SIGTERM grace period expired")
        exits.hard_exit(
            contract.EXIT_RETRYABLE,
            f"training loop did not stop within {self._grace_s:g}s of SIGTERM",
        )
