"""Progress bookkeeping: parsing, rates, stalls, stragglers and the goodput account."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpu_operator.progress import report
from tpu_operator.progress.samples import WorkerSample, parse
from tpu_operator.progress.tracker import JobTrack, robust_scores

pytestmark = pytest.mark.unit

METRICS = """
# HELP tpu_worker_steps_total Steps.
# TYPE tpu_worker_steps_total counter
tpu_worker_steps_total 12.0
# TYPE tpu_worker_step gauge
tpu_worker_step 32.0
# TYPE tpu_worker_tokens_total counter
tpu_worker_tokens_total 4096.0
# TYPE tpu_worker_phase_seconds_total counter
tpu_worker_phase_seconds_total{phase="step"} 6.5
tpu_worker_phase_seconds_total{phase="compile"} 3.0
# TYPE tpu_worker_step_duration_seconds histogram
tpu_worker_step_duration_seconds_bucket{le="1.0"} 12.0
tpu_worker_step_duration_seconds_bucket{le="+Inf"} 12.0
tpu_worker_step_duration_seconds_sum 6.0
tpu_worker_step_duration_seconds_count 12.0
# TYPE tpu_worker_start_time_seconds gauge
tpu_worker_start_time_seconds 1000.0
# TYPE other_metric gauge
other_metric 1
"""


def test_parse_keeps_the_worker_families():
    sample = parse(METRICS, at=5.0)
    assert (sample.steps_total, sample.step, sample.tokens) == (12, 32, 4096)
    assert sample.phases == {"step": 6.5, "compile": 3.0}
    assert (sample.step_seconds_sum, sample.step_seconds_count) == (6.0, 12.0)
    assert sample.resumed_from == 20  # step 32 after 12 steps: resumed from checkpoint 20
    assert parse("tpu_worker_step 0\n", 0.0).resumed_from is None  # no step made yet


def test_a_value_that_is_not_finite_counts_as_not_reported():
    """A diverged run's NaN loss (or an infinity) never reaches status, whose JSON cannot
    hold it: the apiserver refuses a body with NaN, and every status write would fail."""
    text = METRICS + "# TYPE tpu_worker_loss gauge\ntpu_worker_loss NaN\n"
    assert parse(text, at=5.0).loss is None
    assert parse(text.replace("NaN", "+Inf"), at=5.0).loss is None
    assert parse(text.replace("NaN", "0.25"), at=5.0).loss == 0.25
    assert parse("tpu_worker_step NaN\n", 0.0).step is None
    track = JobTrack(attempt=1)
    leader = track.worker("j-0-0", 0, 0, None)
    track.observe(leader, sample(0.0, 0))
    track.observe(leader, replace(sample(10.0, 50), loss=float("nan"), peak_flops=0.0))
    figures = report.progress(track, total_workers=1)
    assert figures.loss is None and figures.mfu is None
    assert figures.step == 50


def sample(
    at,
    steps,
    *,
    step=None,
    wait=0.0,
    compile_s=0.0,
    start=1.0,
    tokens=None,
    step_seconds=0.1,
    end=None,
):
    return WorkerSample(
        at=at,
        steps_total=steps,
        step=steps if step is None else step,
        tokens=steps * 100 if tokens is None else tokens,
        flops=steps * 1e9,
        peak_flops=1e11,
        step_seconds_sum=steps * step_seconds,
        step_seconds_count=steps,
        start_time=start,
        end_time=end,
        phases={"data_wait": wait, "compile": compile_s, "step": steps * 0.1},
    )


def test_stall_clock_excludes_completed_compile_phases_and_finished_training():
    track = JobTrack(attempt=1)
    leader = track.worker("j-0-0", 0, 0, "n0")
    track.observe(leader, sample(100.0, 10))
    assert track.stalled_for(130.0) == pytest.approx(30.0)
    # 20 s of that went into a recompile that finished: not a stall
    track.observe(leader, sample(131.0, 10, compile_s=20.0))
    assert track.stalled_for(131.0) == pytest.approx(11.0)
    track.observe(leader, sample(140.0, 11, compile_s=20.0))
    assert track.stalled_for(140.0) == 0
    track.observe(leader, sample(200.0, 11, compile_s=20.0, end=199.0))
    assert track.stalled_for(400.0) is None
    assert JobTrack(attempt=1).stalled_for(1e9) is None  # nothing read: not a stall


def test_a_data_wait_outlier_is_the_straggler():
    track = JobTrack(attempt=1)
    for worker in range(4):
        slow = worker == 2
        pod = track.worker(f"j-0-{worker}", 0, worker, f"node-{worker}")
        track.observe(pod, sample(0.0, 1))
        track.observe(
            pod, sample(10.0, 21, wait=8.0 if slow else 0.02 + worker * 0.01, step_seconds=0.5)
        )
    found = track.stragglers(3.5)
    assert [(s.pod, s.node, s.metric) for s in found] == [("j-0-2", "node-2", "data wait")]
    assert "pod j-0-2 on node node-2 (slice 0) spends 0.400 s per step" in found[0].describe()
    # uniform workers: no straggler
    calm = JobTrack(attempt=1)
    for worker in range(4):
        pod = calm.worker(f"j-0-{worker}", 0, worker, None)
        calm.observe(pod, sample(0.0, 1))
        calm.observe(pod, sample(10.0, 21, wait=0.2 + worker * 0.001))
    assert calm.stragglers(3.5) == []


def test_a_window_that_holds_the_first_step_names_no_straggler():
    """A worker that compiled slower, or waited longer in its first collectives, is not
    slow: its first step says nothing of its pace."""
    track = JobTrack(attempt=1)
    slow_first = {2: 30.0}  # one worker compiled for half a minute, the others for 1 s
    for worker in range(4):
        pod = track.worker(f"j-0-{worker}", 0, worker, None)
        track.observe(pod, sample(0.0, 0))
        seconds = slow_first.get(worker, 1.0) + 19 * 0.5  # its first step, then 19 of 0.5 s
        track.observe(pod, sample(40.0, 20, step_seconds=seconds / 20))
        assert pod.per_step() is None
    assert track.stragglers(3.5) == []
    # What the histogram would have said of that window: worker 2 at 1.98 s a step
    # against 0.53 s, a straggler by any threshold.
    for worker in range(4):  # the next window: every worker at its pace, 0.5 s a step
        pod = track.workers[f"j-0-{worker}"]
        seconds = slow_first.get(worker, 1.0) + 39 * 0.5
        track.observe(pod, sample(50.0, 40, step_seconds=seconds / 40))
        assert pod.per_step() == pytest.approx((0.5, 0.0))
    assert track.stragglers(3.5) == []


def test_a_window_without_a_completed_step_keeps_the_workers_last_pace():
    """A straggler whose step outlasts the sampling interval shows no step in some windows:
    it keeps its last figures there, and stays the slowest (until its process changes)."""
    track = JobTrack(attempt=1)
    for worker in range(4):
        pod = track.worker(f"j-0-{worker}", 0, worker, None)
        track.observe(pod, sample(0.0, 1))
        track.observe(pod, sample(10.0, 21, wait=0.4 if worker == 2 else 0.0))
    slow = track.workers["j-0-2"]
    first = slow.per_step()
    assert first is not None and first[1] == pytest.approx(0.02)
    track.observe(slow, sample(11.0, 21, wait=0.45))  # mid-step: no step completed
    assert slow.per_step() == first
    assert [s.pod for s in track.stragglers(3.5)] == ["j-0-2"]
    track.observe(slow, sample(12.0, 21, wait=0.45, start=99.0))  # a new process
    track.observe(slow, sample(13.0, 21, wait=0.45, start=99.0))
    assert slow.per_step() is None, "another process's figures are not kept"


def test_robust_scores_handle_zero_mad():
    assert robust_scores([1.0, 1.0, 1.0, 5.0])[3] == float("inf")
    assert robust_scores([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]
    scores = robust_scores([1.0, 1.1, 0.9, 1.05, 3.0])
    assert scores[4] > 3.5 and max(scores[:4]) < 3.5


def test_progress_scales_rates_to_every_worker_and_computes_mfu():
    track = JobTrack(attempt=1)
    leader = track.worker("j-0-0", 0, 0, None)
    track.observe(leader, sample(0.0, 0))
    track.observe(leader, sample(10.0, 50))
    figures = report.progress(track, total_workers=4)
    assert figures.step == 50
    assert figures.steps_per_second == 5.0
    assert figures.tokens_per_second == 4 * 500.0  # one of four workers read: scaled
    assert figures.mfu == pytest.approx(5e9 / 1e11)


def test_goodput_account_across_a_restart():
    carried = {"scheduling": 10.0}
    # 40 steps of 0.5 s wall time each, 0.1 s of it productive (the rest compile and wait)
    first = sample(0.0, 40, step=40, step_seconds=0.5)
    carried = report.carry_over(carried, first)
    assert carried["previousStep"] == 40
    carried = report.account_resume(carried, resumed_from=30)  # 10 steps redone
    # What the redone steps had been productive for, not their wall time: their compile
    # and wait seconds are already badput of their own, and counted twice the account
    # would no longer add up to the wall time.
    assert carried["lostProgress"] == pytest.approx(1.0)
    assert "previousStep" not in carried
    current = sample(0.0, 20, step=50)
    account = report.goodput(
        created=0.0,
        now=100.0,
        carried={**carried, "restartDowntime": 7.0},
        current=current,
        waiting_since=None,
        waiting_kind="other",
    )
    # step time: 40*0.1 (first attempt) + 20*0.1 (now) = 6 s, minus 1 s lost
    assert account.productive_seconds == pytest.approx(5.0)
    assert account.badput_seconds["lostProgress"] == pytest.approx(1.0)
    assert account.badput_seconds["scheduling"] == 10.0
    assert account.badput_seconds["restartDowntime"] == 7.0
    total = account.productive_seconds + sum(account.badput_seconds.values())
    assert total == pytest.approx(account.wall_seconds, abs=0.5)
    assert account.fraction == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("phases", "steps", "per_step"),
    [
        ({"step": 7.6, "first_step": 60.0}, 20, 0.4),  # the first step is not one of them
        ({"step": 8.0}, 20, 0.4),  # a worker from before first_step: it is in step
        ({"step": 0.0, "first_step": 60.0}, 1, 0.0),  # only the first step ran
        ({}, 0, 0.0),  # no step at all
    ],
)
def test_a_redone_step_costs_its_productive_seconds(phases, steps, per_step):
    reading = WorkerSample(at=0.0, steps_total=steps, step=steps, phases=phases)
    assert report.productive_per_step(reading) == pytest.approx(per_step)


def test_rates_freeze_once_training_finished():
    track = JobTrack(attempt=1)
    leader = track.worker("j-0-0", 0, 0, None)
    track.observe(leader, sample(0.0, 0))
    track.observe(leader, sample(10.0, 50, end=9.0))
    track.observe(leader, sample(20.0, 50, end=9.0))  # lingering: no new window
    assert report.progress(track, total_workers=1).steps_per_second == 5.0
