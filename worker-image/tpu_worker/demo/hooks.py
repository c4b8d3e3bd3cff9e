"""Fault injection for tests: hang, straggle, or exit at a given step (``Hooks``).

A hang sleeps in a loop in ``injected_hang`` so the watchdog's stack dump names it.
"""

from __future__ import annotations

import logging
import sys
import time

from tpu_worker.demo.options import Hooks

log = logging.getLogger(__name__)


def injected_hang(step: int) -> None:
    log.warning("test hook: hanging before step %d", step)
    while True:
        time.sleep(1.0)


def before_step(hooks: Hooks, step: int, process: int) -> None:
    """Run before computing global step ``step`` (1-based: the step about to be reached)."""
    if not hooks.faults_now():
        return
    if hooks.exit_at_step == step and hooks.applies(hooks.exit_processes, process):
        log.warning("test hook: exiting with code %d before step %d", hooks.exit_code, step)
        sys.exit(hooks.exit_code)
    if hooks.hang_at_step == step and hooks.applies(hooks.hang_processes, process):
        injected_hang(step)


def slow_input(hooks: Hooks, step: int, process: int) -> None:
    """A straggler's slow input pipeline, from the second step on (the first, with its
    compilation, is never slowed): called inside the data-wait phase, so the straggler
    shows as an outlier in data-wait time (its peers wait for it inside the step's
    collectives instead)."""
    if step > 1 and hooks.slow_s and hooks.applies(hooks.slow_processes, process):
        time.sleep(hooks.slow_s)


def after_step(hooks: Hooks) -> None:
    if hooks.step_sleep_s > 0:
        time.sleep(hooks.step_sleep_s)
