"""Ending the process from any thread: flush the logs, optionally dump every stack, exit.

Used where unwinding is impossible or unsafe (the main thread may be blocked in a JAX
collective that will never return): watchdog stalls, the SIGTERM grace deadline, failed
rendezvous. ``os._exit`` skips interpreter teardown, which could block on a dead peer.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger(__name__)


def flush() -> None:
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def dump_stacks(reason: str) -> None:
    """Write every thread's Python stack to stderr, after a line that says why."""
    flush()
    sys.stderr.write(f"tpu-worker: stack dump of all threads ({reason}):\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()


def hard_exit(code: int, reason: str) -> NoReturn:
    log.error("exiting with code %d: %s", code, reason)
    flush()
    os._exit(code)
