"""examples/own-code: its training package run by the worker launcher, `tpu-worker run -m
my_trainer.train`, as two pods' processes of one job (tests/worker/launch.py).

It trains and reports every step through the worker's API (the metrics say so), saves
checkpoints and resumes from the newest one in the next attempt, and on a SIGTERM in one
pod every process stops at the same step after a checkpoint and exits retryable.
(tests/images/test_images.py builds the example's image FROM the worker image and runs it.)
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.worker import launch
from tests.worker.scrape import scrape
from tpu_operator import contract, worker_metrics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not launch.can_isolate(), reason="needs root and unshare (pod isolation)"),
]

OWN_CODE = launch.REPO / "examples" / "own-code"
STARTUP_S = 300.0  # rendezvous + compile of 2 processes on a small, shared machine
ARGS = ("--batch-size", "16", "--features", "8", "--log-every", "1")
STEP_LOSS = re.compile(r"step (\d+) loss (\S+)")


def trainer(*args: str, linger: int = 0) -> list[str]:
    return launch.worker_command(
        "run", "--metrics-linger", str(linger), "-m", "my_trainer.train", *ARGS, *args
    )


def steps(log: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in STEP_LOSS.findall(log)}


def saved(directory: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in directory.glob("step_*.npz"))


def test_the_module_trains_reports_and_resumes(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    env = {"PYTHONPATH": str(OWN_CODE)}
    args = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3")
    with launch.gang(launch.wirings(topology="2x4"), tmp_path / "a1", env) as first:
        first.start(trainer("--steps", "6", *args, linger=300))
        for pod in first.pods:
            first.wait_for_log(pod, "serving final metrics", STARTUP_S)
        for pod in first.pods:
            metrics = scrape(pod.metrics_url)
            assert metrics.value(worker_metrics.STEP) == 6
            assert metrics.value(worker_metrics.STEPS_TOTAL) == 6
            assert metrics.value(worker_metrics.EXAMPLES_TOTAL) == 6 * 16 / 2  # its share
            pod.signal(signal.SIGTERM)  # ends the linger
        assert first.wait(120) == {0: 0, 1: 0}, first.logs()
        losses = steps(first.pods[0].log())
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses[6] < losses[1]  # it learns
    assert saved(checkpoints) == [3, 6]

    with launch.gang(launch.wirings(topology="2x4", attempt=1), tmp_path / "a2", env) as again:
        again.start(trainer("--steps", "9", *args))
        assert again.wait(STARTUP_S) == {0: 0, 1: 0}, again.logs()
        for pod in again.pods:
            log = pod.log()
            assert "starting at step 6 of 9" in log, log
            assert sorted(steps(log)) == [7, 8, 9]
    assert saved(checkpoints) == [3, 6, 9]


def test_a_sigterm_saves_everywhere_at_one_step_and_exits_retryable(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    env = {"PYTHONPATH": str(OWN_CODE)}
    with launch.gang(launch.wirings(topology="2x4"), tmp_path, env) as gang:
        gang.start(
            trainer(
                "--steps",
                "100000000",
                "--checkpoint-every",
                "100000000",
                "--checkpoint-dir",
                str(checkpoints),
            )
        )
        gang.wait_for_log(gang.pods[1], "step 3 loss", STARTUP_S)
        gang.pods[1].signal(signal.SIGTERM)  # one preempted worker
        codes = gang.wait(120)
        stopped = set()
        for pod in gang.pods:
            log = pod.log()
            assert codes[pod.process_id] == contract.EXIT_RETRYABLE, log
            stopped.update(re.findall(r"stopping at step (\d+)", log))
    assert len(stopped) == 1, f"processes stopped at different steps: {stopped}"
    assert saved(checkpoints) == [int(stopped.pop())]


def test_the_coordinator_waits_for_a_peer_still_saving_before_it_exits(tmp_path: Path) -> None:
    """Process 0 hosts JAX's coordination service. Stopped with its peers, it saves and
    must not exit while one of them is still writing its part of the checkpoint: that
    peer would lose the service mid-save and abort (SIGABRT, code 134) instead of exiting
    retryable. Here process 1 takes 6 s longer to save than process 0."""
    env = {"PYTHONPATH": str(launch.REPO / "tests" / "worker" / "trainers"), "SLOW_SAVE_S": "6"}
    with launch.gang(launch.wirings(topology="2x4"), tmp_path, env) as gang:
        gang.start(launch.worker_command("run", "--metrics-linger", "0", "-m", "slow_saver"))
        gang.wait_for_log(gang.pods[1], "step 3 loss", STARTUP_S)
        for pod in gang.pods:  # the operator's stop: every process at once
            pod.signal(signal.SIGTERM)
        codes = gang.wait(120)
        stopped = set()
        for pod in gang.pods:
            log = pod.log()
            assert codes[pod.process_id] == contract.EXIT_RETRYABLE, gang.logs()
            stopped.update(re.findall(r"stopping at step (\d+)", log))
    assert len(stopped) == 1, f"processes stopped at different steps: {stopped}"
