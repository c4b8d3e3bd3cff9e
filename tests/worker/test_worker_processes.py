"""The worker as real JAX processes on CPU, each wired and isolated like a pod.

Every env comes from the operator's builder (``resolved_env``); see ``launch``. Timeouts
are generous (the machine is small and shared); assertions are on exit codes, logs,
checkpoints and scraped metrics, never on sleeps.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.worker import launch
from tests.worker.scrape import Scrape, losses, scrape
from tpu_operator import contract
from tpu_worker.demo import checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not launch.can_isolate(), reason="needs root and unshare (pod isolation)"),
]

STARTUP_S = 300.0  # rendezvous + compile of 4 processes sharing 2 busy cores
STEPS = 12
DEMO = ("--steps", str(STEPS), "--log-every", "1", "--init-timeout", "120")
# Phases must add up to the wall time from process start to the end of training within
# this fraction of it, plus PHASE_SLACK_S for what no phase covers (the launcher's own
# work between phases, scheduling delays on a loaded machine).
PHASE_TOLERANCE = 0.03
PHASE_SLACK_S = 0.5


@dataclass
class Reference:
    """The 4-process reference run: logs and a final scrape of every process."""

    gang: launch.Gang
    scrapes: dict[int, Scrape]
    codes: dict[int, int]
    logs: dict[int, str]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    workdir = tmp_path_factory.mktemp("reference")
    with launch.gang(launch.wirings(topology="4x4"), workdir) as gang:
        gang.start(launch.worker_command("demo", *DEMO, "--metrics-linger", "300"))
        try:
            for pod in gang.pods:
                gang.wait_for_log(pod, "serving final metrics", STARTUP_S)
            scrapes = {pod.process_id: scrape(pod.metrics_url) for pod in gang.pods}
            for pod in gang.pods:
                pod.signal(signal.SIGTERM)  # ends the linger; training is done: exit 0
            codes = gang.wait(120)
        except BaseException:
            print(gang.logs())
            raise
        yield Reference(gang, scrapes, codes, {p.process_id: p.log() for p in gang.pods})


def test_four_processes_train_and_agree_on_loss_bit_for_bit(reference: Reference) -> None:
    assert reference.codes == {0: 0, 1: 0, 2: 0, 3: 0}, reference.gang.logs()
    per_process = {pid: losses(log) for pid, log in reference.logs.items()}
    assert sorted(per_process[0]) == list(range(1, STEPS + 1))
    for pid in (1, 2, 3):
        assert per_process[pid] == per_process[0], f"process {pid} disagrees on the loss"
    first, last = (float.fromhex(per_process[0][s]) for s in (1, STEPS))
    assert last < first, "the demo model does not learn"
    for log in reference.logs.values():
        assert "rendezvous complete: process" in log
        assert "mesh data=2 x model=2 over 4 processes" in log


def test_metrics_match_training(reference: Reference) -> None:
    for pid, s in reference.scrapes.items():
        assert s.types["tpu_worker_steps"] == "counter"
        assert s.types["tpu_worker_step_duration_seconds"] == "histogram"
        assert s.value("tpu_worker_steps_total") == STEPS
        assert s.value("tpu_worker_step") == STEPS
        assert s.value("tpu_worker_step_duration_seconds_count") == STEPS
        assert s.value("tpu_worker_examples_total") == pytest.approx(STEPS * 16 / 4)
        assert s.value("tpu_worker_tokens_total") == pytest.approx(STEPS * 16 * 64 / 4)
        flops = s.value("tpu_worker_model_flops_total")
        assert flops > 0
        peak = s.value("tpu_worker_peak_flops_per_second")
        productive = s.value("tpu_worker_phase_seconds_total", phase="step")
        mfu = flops / productive / peak
        assert 0 < mfu <= 1, f"process {pid}: MFU {mfu}"
        loss = float.fromhex(losses(reference.logs[pid])[STEPS])
        assert s.value("tpu_worker_loss") == pytest.approx(loss, rel=1e-6)
        start = s.value("tpu_worker_start_time_seconds")
        end = s.value("tpu_worker_end_time_seconds")
        assert start < s.value("tpu_worker_last_progress_timestamp_seconds") <= end
        info = s.with_name("tpu_worker_build_info")
        assert len(info) == 1
        labels = dict(next(iter(info)))
        assert labels["process_index"] == str(pid)
        assert labels["process_count"] == "4"
        assert (labels["slice"], labels["worker"]) == ("0", str(pid))
        assert labels["platform"] == "cpu"
        assert labels["jax_version"]
    per_process_flops = {
        s.value("tpu_worker_model_flops_total") for s in reference.scrapes.values()
    }
    assert len(per_process_flops) == 1, "every process does an equal share of the FLOPs"


def test_phases_add_up_to_wall_time(reference: Reference) -> None:
    for pid, s in reference.scrapes.items():
        phases = s.with_name("tpu_worker_phase_seconds_total")
        by_phase = {dict(labels)["phase"]: value for labels, value in phases.items()}
        for phase in ("init", "compile", "first_step", "data_wait", "step"):
            assert by_phase[phase] > 0, f"process {pid}: no {phase} time"
        wall = s.value("tpu_worker_end_time_seconds") - s.value("tpu_worker_start_time_seconds")
        total = sum(by_phase.values())
        assert abs(total - wall) <= PHASE_TOLERANCE * wall + PHASE_SLACK_S, (
            f"process {pid}: phases {by_phase} add up to {total:.3f}s, wall {wall:.3f}s"
        )


def _assert_rendezvous_failure(pod: launch.Pod, code: int, expected: str) -> None:
    log = pod.log()
    assert code == contract.EXIT_RENDEZVOUS_FAILED, log
    assert "rendezvous failed" in log, log
    assert "expected 4 processes" in log, log
    assert expected in log, log


def test_missing_process_fails_rendezvous_within_timeout(tmp_path: Path) -> None:
    timeout = 20.0
    args = launch.worker_command("check", "--init-timeout", str(timeout))
    wirings = launch.wirings(topology="4x4")
    with (
        launch.gang(wirings, tmp_path / "no-worker-3") as no_worker,
        launch.gang(wirings, tmp_path / "no-coordinator") as no_coordinator,
    ):
        started = no_worker.start(args, only=[0, 1, 2])
        started_b = no_coordinator.start(args, only=[1, 2, 3])
        # Process start-up (importing JAX) comes before the timeout starts counting.
        codes = no_worker.wait(timeout + 90)
        codes_b = no_coordinator.wait(timeout + 90)
        coordinator = f"{wirings[0].leader_host}:{wirings[0].ports.coordinator}"
        for pod in started:
            _assert_rendezvous_failure(pod, codes[pod.process_id], coordinator)
            assert pod.ended is not None
        for pod in started_b:
            _assert_rendezvous_failure(pod, codes_b[pod.process_id], "did not resolve")
            assert f"waiting for DNS name {wirings[0].leader_host}" in pod.log()


def test_killed_process_ends_the_others_within_heartbeat_timeout(tmp_path: Path) -> None:
    heartbeat = 10.0
    with launch.gang(launch.wirings(topology="4x4"), tmp_path) as gang:
        # Processes 0, 1, 3 straggle (sleep 120 s loading each batch after the first), so
        # when 2 dies after step 1 they are in no collective: only JAX's heartbeat can tell.
        gang.start(
            launch.worker_command(
                "demo",
                *DEMO,
                "--heartbeat-timeout",
                str(heartbeat),
                "--slow-processes",
                "0,1,3",
                "--slow-seconds",
                "120",
            )
        )
        victim = gang.pods[2]
        gang.wait_for_log(victim, "step 1 loss", STARTUP_S)
        killed = time.monotonic()
        victim.signal(signal.SIGKILL)
        others = [p for p in gang.pods if p is not victim]
        codes = gang.wait(heartbeat + 60, others)
        for pod in others:
            assert codes[pod.process_id] != 0, pod.log()
            assert pod.ended is not None
            # heartbeat timeout plus scheduling slack; far below the 120 s straggler sleep
            assert pod.ended - killed < heartbeat + 30, pod.log()
            assert "stopped sending heartbeats" in pod.log(), pod.log()


def test_injected_hang_trips_the_watchdog(tmp_path: Path) -> None:
    floor = 4.0
    with launch.gang(launch.wirings(topology="2x4"), tmp_path) as gang:
        gang.start(
            launch.worker_command(
                "demo",
                *DEMO,
                "--watchdog-floor",
                str(floor),
                "--watchdog-k",
                "5",
                "--hang-at-step",
                "5",
                "--hang-processes",
                "1",
            ),
        )
        codes = gang.wait(STARTUP_S)
        for pod in gang.pods:
            log = pod.log()
            assert codes[pod.process_id] == contract.EXIT_RETRYABLE, log
            assert "stack dump of all threads" in log, log
            assert "in train" in log, log  # every dump shows the training loop
        hung = gang.pods[1].log()
        assert "watchdog: no step progress for" in hung
        assert "after step 4" in hung
        assert "in injected_hang" in hung  # the dump shows where it hangs
        # Its peer either trips its own watchdog, waiting in step 5's collective, or sees
        # the hung process's exit first as a failed collective; both are retryable.


def test_kill_and_restart_resumes_from_the_last_checkpoint(
    tmp_path: Path, reference: Reference
) -> None:
    checkpoints = tmp_path / "ckpt"
    args = (*DEMO, "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "4")
    with launch.gang(launch.wirings(topology="4x4"), tmp_path / "attempt0") as first:
        # Slow steps so the kill lands between checkpoints, not after the last one.
        first.start(launch.worker_command("demo", *args, "--step-sleep", "1"))
        first.wait_for_log(first.pods[0], "checkpoint saved at step 4", STARTUP_S)
        for pod in first.pods:
            pod.signal(signal.SIGKILL)
        first.wait(60)
        reached = max(max(losses(p.log()), default=0) for p in first.pods)
    saved = checkpoint.saved_steps(checkpoints)
    assert saved and saved[-1] < STEPS and reached < STEPS
    resume_at = saved[-1]

    with launch.gang(launch.wirings(topology="4x4", attempt=1), tmp_path / "attempt1") as again:
        again.start(launch.worker_command("demo", *args))
        codes = again.wait(STARTUP_S)
        assert codes == {0: 0, 1: 0, 2: 0, 3: 0}, again.logs()
        for pod in again.pods:
            log = pod.log()
            assert f"resumed from checkpoint at step {resume_at}" in log, log
            resumed = losses(log)
            assert sorted(resumed) == list(range(resume_at + 1, STEPS + 1))
            # Same model state and data as the uninterrupted reference, bit for bit.
            reference_losses = losses(reference.logs[pod.process_id])
            assert resumed == {s: reference_losses[s] for s in resumed}


def test_sigterm_saves_a_checkpoint_everywhere_and_exits_retryable(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    with launch.gang(launch.wirings(topology="2x4"), tmp_path) as gang:
        gang.start(
            launch.worker_command(
                "demo",
                *DEMO,
                "--steps",
                "1000",
                "--step-sleep",
                "0.2",
                "--checkpoint-dir",
                str(checkpoints),
                "--checkpoint-every",
                "1000",
            )
        )
        gang.wait_for_log(gang.pods[1], "step 3 loss", STARTUP_S)
        gang.pods[1].signal(signal.SIGTERM)  # one preempted worker
        codes = gang.wait(120)
        stops = set()
        for pod in gang.pods:
            log = pod.log()
            assert codes[pod.process_id] == contract.EXIT_RETRYABLE, log
            found = [line for line in log.splitlines() if "stopping at step" in line]
            assert len(found) == 1, log
            stops.add(found[0].split("stopping at step ")[1].split()[0])
        assert len(stops) == 1, f"processes stopped at different steps: {stops}"
        step = int(stops.pop())
        assert checkpoint.saved_steps(checkpoints) == [step]


def test_multislice_forms_one_system(tmp_path: Path) -> None:
    wirings = launch.wirings(topology="2x4", chips_per_host=4, num_slices=2)
    assert [w.process_id for w in wirings] == [0, 1, 2, 3]
    with launch.gang(wirings, tmp_path) as gang:
        assert gang.pods[2].env[contract.ENV_MEGASCALE_SLICE_ID] == "1"
        gang.start(launch.worker_command("check", "--metrics-linger", "300"))
        for pod in gang.pods:
            gang.wait_for_log(pod, "serving final metrics", STARTUP_S)
        for pod in gang.pods:
            assert "check passed: 4 processes" in pod.log()
            info = scrape(pod.metrics_url).with_name("tpu_worker_build_info")
            labels = dict(next(iter(info)))
            wiring = pod.wiring
            assert labels["process_index"] == str(wiring.slice_index * 2 + wiring.worker_index)
            assert labels["process_count"] == "4"
            assert labels["slice"] == str(wiring.slice_index)
            assert labels["worker"] == str(wiring.worker_index)
        base = gang.pods[0].metrics_url.removesuffix("/metrics")
        for path in ("/", "/env", "/metrics/x", "/favicon.ico"):
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(base + path, timeout=30)
            assert error.value.code == 404
        for pod in gang.pods:
            pod.signal(signal.SIGTERM)
        assert gang.wait(120) == {0: 0, 1: 0, 2: 0, 3: 0}
