"""A trainer whose processes other than 0 take ``SLOW_SAVE_S`` seconds to save the stop
checkpoint: the order in which a stopping gang finishes on a loaded machine, made certain
(tests/worker/test_own_code.py runs it with ``tpu-worker run -m slow_saver``)."""

from __future__ import annotations

import logging
import os
import time

import jax

import tpu_worker

log = logging.getLogger("slow_saver")


def main() -> None:
    report = tpu_worker.reporter()
    slow_s = float(os.environ["SLOW_SAVE_S"])
    step = 0
    while True:
        step += 1
        time.sleep(0.2)
        report.record_step(step)
        log.info("step %d loss 0", step)
        if report.should_stop(step):
            if jax.process_index() != 0:
                with report.checkpoint_save():
                    time.sleep(slow_s)
            log.warning("stopping at step %d: saved", step)
            return


if __name__ == "__main__":
    main()
