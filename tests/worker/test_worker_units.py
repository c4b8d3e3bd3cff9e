"""Pure parts of the worker: contract reading, accounting, watchdog, peak FLOP/s, metrics."""

from __future__ import annotations

import random
import threading
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.worker import launch
from tpu_operator import contract
from tpu_operator.builders.wiring import resolved_env
from tpu_operator.progress import report
from tpu_operator.progress.samples import WorkerSample, parse
from tpu_operator.progress.tracker import JobTrack
from tpu_worker import cli, peak
from tpu_worker.accounting import Accountant, Intervals
from tpu_worker.config import ContractError, read_contract
from tpu_worker.dns import ResolveTimeout, wait_for_name
from tpu_worker.metrics import PhaseSeconds, WorkerMetrics
from tpu_worker.reporting import Reporter
from tpu_worker.watchdog import Watchdog, threshold

pytestmark = pytest.mark.unit


def _env(index: int = 0, num_slices: int = 1) -> dict[str, str]:
    wirings = launch.wirings(topology="4x4", num_slices=num_slices)
    return resolved_env(wirings[index], f"127.0.9.{index + 1}")


# -- contract ------------------------------------------------------------------------------


def test_contract_from_builder_env() -> None:
    pc = read_contract(_env(2))
    assert (pc.process_id, pc.num_processes, pc.worker_id, pc.slice_index) == (2, 4, 2, 0)
    assert pc.coordinator_address == f"demo-0-0.demo:{contract.DEFAULT_COORDINATOR_PORT}"
    assert pc.coordinator_bind_address == f"127.0.9.3:{contract.DEFAULT_COORDINATOR_PORT}"
    assert pc.metrics_port == contract.DEFAULT_METRICS_PORT
    assert pc.settings.init_timeout_s == 300


def test_multislice_contract_gives_global_process_ids() -> None:
    wirings = launch.wirings(topology="4x4", num_slices=2)
    for index, wiring in enumerate(wirings):
        pc = read_contract(resolved_env(wiring, "127.0.9.1"))
        assert pc.process_id == index
        assert pc.num_processes == 8
        assert (pc.slice_index, pc.worker_id) == divmod(index, 4)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (contract.ENV_JAX_COORDINATOR_ADDRESS, None, "JAX_COORDINATOR_ADDRESS is not set"),
        (contract.ENV_JAX_COORDINATOR_ADDRESS, "nohost", "is not host:port"),
        (contract.ENV_PROCESS_ID, "x", "TPU_OPERATOR_PROCESS_ID='x' is not an integer"),
        (contract.ENV_PROCESS_ID, "3", "is process 1"),
        (contract.ENV_NUM_PROCESSES, "1", "is not below TPU_OPERATOR_NUM_PROCESSES=1"),
        (contract.ENV_TPU_WORKER_ID, "9", "lists 4 workers"),
        (contract.ENV_POD_IP, "", "TPU_OPERATOR_POD_IP is not set"),
        (contract.ENV_WORKER_INIT_TIMEOUT, "soon", "is not a number"),
        (contract.ENV_WORKER_CLUSTER_MODE, "magic", "valid: auto, tpu, explicit"),
        (contract.ENV_METRICS_PORT, "8431", "is reserved for libtpu"),
    ],
)
def test_contract_errors_name_the_variable(name: str, value: str | None, message: str) -> None:
    env = _env(1)
    if value is None:
        env.pop(name)
    else:
        env[name] = value
    with pytest.raises(ContractError, match=message):
        read_contract(env)


def test_settings_from_env_and_flags() -> None:
    env = _env(0)
    env[contract.ENV_WORKER_HEARTBEAT_TIMEOUT] = "12"
    env[contract.ENV_WORKER_WATCHDOG_K] = "3"
    pc = read_contract(env)
    assert (pc.settings.heartbeat_timeout_s, pc.settings.watchdog_k) == (12, 3)
    assert pc.with_settings(watchdog_floor_s=7.0).settings.watchdog_floor_s == 7


def test_cli_splits_worker_flags_from_the_target() -> None:
    flags, target = cli._split_run(["--init-timeout", "5", "-m", "pkg.mod", "--init-timeout", "9"])
    assert flags == ["--init-timeout", "5"]
    assert target == ["-m", "pkg.mod", "--init-timeout", "9"]
    flags, target = cli._split_run(["--watchdog-k=4", "train.py", "-m", "x"])
    assert (flags, target) == (["--watchdog-k=4"], ["train.py", "-m", "x"])
    namespace = cli.worker_flags().parse_args(["--heartbeat-timeout", "7"])
    assert cli._settings(namespace) == {"heartbeat_timeout_s": 7.0}


# -- DNS wait ------------------------------------------------------------------------------


def test_dns_wait_gives_up_at_the_deadline() -> None:
    began = time.monotonic()
    with pytest.raises(ResolveTimeout, match=r"no-such-host\.invalid did not resolve within 1s"):
        wait_for_name("no-such-host.invalid", 1.0, what="JAX coordinator", interval_s=0.1)
    assert time.monotonic() - began < 10
    assert wait_for_name("localhost", 1.0, what="self")


# -- accounting ----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nested_phases_count_each_second_once() -> None:
    clock = FakeClock()
    seen: dict[str, float] = {}

    def sink(phase: str, seconds: float) -> None:
        seen[phase] = seen.get(phase, 0.0) + seconds

    accountant = Accountant(sink, "step", clock)
    accountant.start_loop()
    clock.now += 1.0  # productive
    outer = accountant.open("checkpoint_save")
    clock.now += 2.0
    inner = accountant.open("data_wait")
    clock.now += 0.5
    accountant.close(inner)
    accountant.add_compile_span("compile", 50.0, 50.25)  # inside checkpoint_save
    clock.now += 0.25
    accountant.close(outer)
    clock.now += 3.0  # productive
    assert accountant.end_step() == pytest.approx(6.75)
    assert seen == pytest.approx(
        {"data_wait": 0.5, "compile": 0.25, "checkpoint_save": 2.0, "step": 4.0}
    )
    assert sum(seen.values()) == pytest.approx(6.75)


def test_a_process_first_step_interval_is_its_own_phase() -> None:
    """What is left of the first step interval after its phases (the wait in the first
    collectives for peers still compiling) is not productive: a restart pays it again."""
    clock = FakeClock()
    seen: dict[str, float] = {}
    accountant = Accountant(
        lambda p, s: seen.__setitem__(p, seen.get(p, 0) + s), "step", clock, "first_step"
    )
    accountant.start_loop()
    clock.now += 1.0
    accountant.add_compile_span("compile", 100.5, 101.0)  # half a second compiling
    clock.now += 15.0  # waiting in the first collective
    assert accountant.end_step() == pytest.approx(16.0)
    assert seen == pytest.approx({"compile": 0.5, "first_step": 15.5})
    for _ in range(2):
        clock.now += 0.5
        accountant.end_step()
    accountant.end_loop()
    accountant.start_loop()  # the same process again: no second first step
    clock.now += 0.5
    accountant.end_step()
    assert seen == pytest.approx({"compile": 0.5, "first_step": 15.5, "step": 1.5})


def test_overlapping_compile_spans_count_once() -> None:
    spans = Intervals()
    assert spans.add(0.0, 1.0) == pytest.approx(1.0)
    assert spans.add(0.2, 0.8) == 0  # nested trace inside the outer one
    assert spans.add(0.5, 2.0) == pytest.approx(1.0)
    assert spans.add(3.0, 4.0) == pytest.approx(1.0)


def test_phases_on_other_threads_do_not_shorten_the_step() -> None:
    clock = FakeClock()
    seen: dict[str, float] = {}
    accountant = Accountant(lambda p, s: seen.__setitem__(p, seen.get(p, 0) + s), "step", clock)
    accountant.start_loop()

    def loader() -> None:
        frame = accountant.open("data_wait")
        clock.now += 1.0
        accountant.close(frame)

    thread = threading.Thread(target=loader)
    thread.start()
    thread.join()
    clock.now += 1.0
    accountant.end_step()
    assert seen == {"data_wait": 1.0, "step": 2.0}


def test_open_frames_count_what_they_own_so_far() -> None:
    clock = FakeClock()
    seen: dict[str, float] = {}
    accountant = Accountant(lambda p, s: seen.__setitem__(p, seen.get(p, 0) + s), "step", clock)
    assert accountant.open_seconds() == {}  # before the loop, no step interval runs
    accountant.start_loop()
    clock.now += 1.0
    outer = accountant.open("checkpoint_save")
    clock.now += 2.0
    inner = accountant.open("data_wait")
    clock.now += 0.5
    assert accountant.open_seconds() == pytest.approx(
        {"step": 1.0, "checkpoint_save": 2.0, "data_wait": 0.5}
    )
    accountant.close(inner)
    clock.now += 0.25
    assert accountant.open_seconds() == pytest.approx({"step": 1.0, "checkpoint_save": 2.25})
    accountant.close(outer)
    clock.now += 3.0
    assert accountant.open_seconds() == pytest.approx({"step": 4.0})
    accountant.end_step()
    assert seen == pytest.approx({"data_wait": 0.5, "checkpoint_save": 2.25, "step": 4.0})
    clock.now += 1.5
    accountant.end_loop()
    clock.now += 9.0
    assert accountant.open_seconds() == {}  # the tail after the last step is no step's


def test_open_frames_on_other_threads_count_in_their_phase() -> None:
    clock = FakeClock()
    accountant = Accountant(lambda p, s: None, "step", clock)
    accountant.start_loop()
    opened, release = threading.Event(), threading.Event()

    def saver() -> None:
        frame = accountant.open("checkpoint_save")
        opened.set()
        release.wait(5)
        accountant.close(frame)

    thread = threading.Thread(target=saver)
    thread.start()
    assert opened.wait(5)
    clock.now += 2.0
    # Concurrent with the loop: counted in its phase, taken out of nothing.
    assert accountant.open_seconds() == pytest.approx({"step": 2.0, "checkpoint_save": 2.0})
    release.set()
    thread.join()
    assert accountant.open_seconds() == pytest.approx({"step": 2.0})


def test_an_open_step_interval_shows_no_more_than_its_limit() -> None:
    clock = FakeClock()
    seen: dict[str, float] = {}
    accountant = Accountant(lambda p, s: seen.__setitem__(p, seen.get(p, 0) + s), "step", clock)
    accountant.start_loop()
    accountant.limit_open_step(2.0)
    clock.now += 1.5
    assert accountant.open_seconds() == pytest.approx({"step": 1.5})
    frame = accountant.open("checkpoint_save")
    clock.now += 30.0  # other phases are shown whole
    assert accountant.open_seconds() == pytest.approx({"step": 1.5, "checkpoint_save": 30.0})
    accountant.close(frame)
    clock.now += 60.0  # a step that runs long (or hangs) stops at the limit
    assert accountant.open_seconds() == pytest.approx({"step": 2.0})
    accountant.end_step()  # and hands over all of its time if it ends
    assert seen == pytest.approx({"checkpoint_save": 30.0, "step": 61.5})


def test_a_hung_step_is_not_shown_as_step_time() -> None:
    """Step time is productive only once the step ends: a hung step must not read as
    training in the counters (dashboards) nor in the attempt the operator carries over."""
    clock = FakeClock()
    reporter = Reporter(clock=clock)
    reporter.start_loop()

    def scraped(at: float = 0.0) -> WorkerSample:
        return parse(generate_latest(reporter.metrics.registry).decode(), at)

    clock.now += 5.0  # a first step (it compiles): not productive
    reporter.record_step(1)
    clock.now += 3.0  # before two steps no median: nothing shown
    assert scraped().phases["first_step"] == pytest.approx(5.0)
    assert scraped().phases["step"] == 0
    reporter.record_step(2)
    for step in (3, 4):
        clock.now += 1.0
        reporter.record_step(step)
    assert reporter.median_step_seconds() == pytest.approx(1.0)
    done = scraped().phases["step"]
    clock.now += 600.0  # hung in step 5 for ten minutes
    assert scraped().phases["step"] - done == pytest.approx(2.0)
    carried = report.carry_over({}, scraped(1000.0), closed_at=1000.0)
    assert carried["step"] == pytest.approx(done + 2.0)


def test_phase_counters_advance_by_no_more_than_wall_time_between_scrapes() -> None:
    """What a dashboard's rate() of the phase counters relies on: between any two scrapes,
    every series is monotonic and together they advance by at most the wall time between
    them (a counter that jumped by a whole phase at its end would exceed it)."""
    rng = random.Random(20261124)
    clock = FakeClock()
    seconds = PhaseSeconds(["step"])
    accountant = Accountant(seconds.add, "step", clock)
    seconds.follow(accountant.open_seconds)
    accountant.start_loop()
    last_time, last = clock.now, seconds.values()
    open_frames: list[object] = []
    acted = clock.now  # the innermost frame has owned every second since
    for _ in range(3000):
        action = rng.random()
        if action < 0.2 and len(open_frames) < 3:
            open_frames.append(accountant.open(rng.choice(["data_wait", "checkpoint_save"])))
        elif action < 0.4 and open_frames:
            accountant.close(open_frames.pop())  # type: ignore[arg-type]
        elif action < 0.5 and not open_frames:
            accountant.end_step()
        elif action < 0.6:
            # A compilation JAX reports when it ends: its seconds leave the open frame
            # after scrapes may have shown them as that frame's.
            length = rng.uniform(0.0, clock.now - acted)
            accountant.add_compile_span("compile", clock.now - length, clock.now)
        acted = clock.now
        clock.now += rng.expovariate(1.0)
        if rng.random() < 0.3:
            values = seconds.values()
            advanced = sum(values.get(p, 0.0) - last.get(p, 0.0) for p in values)
            assert all(values[p] >= last.get(p, 0.0) for p in values)
            assert advanced <= clock.now - last_time + 1e-9
            last_time, last = clock.now, values
    # And nothing is lost: the counters hold the whole wall time of the loop.
    while open_frames:
        accountant.close(open_frames.pop())  # type: ignore[arg-type]
    accountant.end_step()
    assert sum(seconds.values().values()) == pytest.approx(clock.now - 100.0)


def test_phase_counters_never_go_back_nor_show_a_second_twice() -> None:
    live = {"step": 5.0}
    seconds = PhaseSeconds(["step", "compile"])
    seconds.follow(lambda: live)
    assert seconds.values() == {"step": 5.0, "compile": 0.0}
    # A 3 s compilation is reported when it ends and leaves the open step interval: step
    # stays (no reset), and compile waits, or those 3 s would be shown twice.
    live["step"] = 2.0
    seconds.add("compile", 3.0)
    assert seconds.values() == {"step": 5.0, "compile": 0.0}
    live["step"] = 3.5  # 1.5 s later: half of it absorbed
    assert seconds.values() == pytest.approx({"step": 5.0, "compile": 1.5})
    live["step"] = 6.0
    assert seconds.values() == pytest.approx({"step": 6.0, "compile": 3.0})


def test_a_running_phase_shows_in_a_scrape_before_it_ends() -> None:
    reporter = Reporter()
    reporter.start_loop()

    def scraped(phase: str) -> float:
        return parse(generate_latest(reporter.metrics.registry).decode(), 0.0).phases[phase]

    with reporter.checkpoint_save():
        reporter._accountant._stacks[threading.get_ident()][-1].start -= 30.0  # 30 s in
        assert scraped("checkpoint_save") >= 30.0
    assert 30.0 <= scraped("checkpoint_save") < 31.0


def test_a_checkpoint_save_longer_than_the_stall_timeout_is_no_stall() -> None:
    """The operator's stall clock deducts checkpoint time from what the leader's counters
    say; a save still running must already show there, or a save longer than
    ``stallTimeout`` would restart the gang."""
    reporter = Reporter()
    reporter.start_loop()
    reporter.record_step(1)
    track = JobTrack(attempt=0)
    leader = track.worker("demo-0-0", 0, 0, None)

    def observe(at: float) -> None:
        track.observe(leader, parse(generate_latest(reporter.metrics.registry).decode(), at))

    observe(1000.0)
    with reporter.checkpoint_save():
        reporter._accountant._stacks[threading.get_ident()][-1].start -= 600.0  # 10 min in
        observe(1600.0)
        stalled_for = track.stalled_for(1600.0)
    assert stalled_for is not None and stalled_for < 5.0


def test_reporter_exports_steps_and_median() -> None:
    reporter = Reporter()
    reporter.start_loop()
    for step, duration in enumerate([5.0, 0.1, 0.3, 0.2], start=1):
        reporter._accountant._root.start -= duration  # a step of exactly this length
        reporter.record_step(step, loss=2.5, examples=4, tokens=256, flops=1e9)
    assert reporter.median_step_seconds() == pytest.approx(0.2, abs=0.01)  # first excluded
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(reporter.metrics.registry).decode())
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("tpu_worker_steps_total", ())] == 4
    assert samples[("tpu_worker_step", ())] == 4
    assert samples[("tpu_worker_examples_total", ())] == 16
    assert samples[("tpu_worker_tokens_total", ())] == 1024
    assert samples[("tpu_worker_model_flops_total", ())] == 4e9
    assert samples[("tpu_worker_loss", ())] == 2.5
    assert samples[("tpu_worker_step_duration_seconds_count", ())] == 4
    phase_seconds = {
        labels[0][1]: value
        for (name, labels), value in samples.items()
        if name == "tpu_worker_phase_seconds_total"
    }
    assert phase_seconds["first_step"] == pytest.approx(5.0, abs=0.05)
    assert phase_seconds["step"] == pytest.approx(0.6, abs=0.05)
    for phase in ("init", "compile", "data_wait", "checkpoint_save", "checkpoint_restore"):
        assert ("tpu_worker_phase_seconds_total", (("phase", phase),)) in samples


def test_custom_phases_are_bounded_and_validated() -> None:
    reporter = Reporter()
    with reporter.phase("eval"):
        pass
    with pytest.raises(ValueError, match="must match"), reporter.phase("Bad Name"):
        pass
    with pytest.raises(ValueError, match="record_step"), reporter.phase("step"):
        pass
    for index in range(7):
        with reporter.phase(f"custom_{index}"):
            pass
    with pytest.raises(ValueError, match="at most 8 custom phases"), reporter.phase("one_more"):
        pass


def test_metric_names_are_stable() -> None:
    text = generate_latest(WorkerMetrics().registry).decode()
    names = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert names == {
        "tpu_worker_steps": "counter",
        "tpu_worker_step": "gauge",
        "tpu_worker_step_duration_seconds": "histogram",
        "tpu_worker_examples": "counter",
        "tpu_worker_tokens": "counter",
        "tpu_worker_model_flops": "counter",
        "tpu_worker_peak_flops_per_second": "gauge",
        "tpu_worker_loss": "gauge",
        "tpu_worker_last_progress_timestamp_seconds": "gauge",
        "tpu_worker_phase_seconds": "counter",
        "tpu_worker_start_time_seconds": "gauge",
        "tpu_worker_end_time_seconds": "gauge",
        "tpu_worker_watchdog_threshold_seconds": "gauge",
        "tpu_worker_build_info": "gauge",
        "tpu_worker_checkpoint_requests": "counter",
    }


# -- watchdog ------------------------------------------------------------------------------


def test_watchdog_threshold() -> None:
    assert threshold(None, 10, 300) == 300
    assert threshold(0.5, 10, 3) == 5
    assert threshold(0.5, 10, 30) == 30


def test_watchdog_is_armed_by_the_first_step_and_fires_on_a_stall() -> None:
    reporter = Reporter()
    stalls: list[str] = []
    watchdog = Watchdog(reporter, k=10, floor_s=2.0, on_stall=stalls.append)
    now = time.monotonic()
    assert watchdog.check(now + 1000) is None  # compiling: not armed
    reporter.start_loop()
    reporter.record_step(1)
    assert watchdog.check(reporter.last_activity + 1.5) is None
    stall = watchdog.check(reporter.last_activity + 2.5)
    assert stall is not None
    assert "no step progress for 2.5s after step 1" in stall
    assert "floor 2s" in stall


def test_watchdog_thread_calls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    reporter = Reporter()
    reporter.start_loop()
    reporter.record_step(1)
    fired = threading.Event()
    watchdog = Watchdog(
        reporter, k=10, floor_s=0.2, interval_s=0.05, on_stall=lambda _: fired.set()
    )
    watchdog.start()
    assert fired.wait(30)
    watchdog.stop()


# -- peak FLOP/s ---------------------------------------------------------------------------

CPUINFO = """processor\t: 0
cpu MHz\t\t: 2596.140
flags\t\t: fpu sse2 avx avx2 fma avx512f
processor\t: 1
cpu MHz\t\t: 2400.000
flags\t\t: fpu sse2 avx avx2 fma avx512f
"""


def test_cpu_peak_estimate() -> None:
    estimate = peak.cpu_estimate(CPUINFO, cores=2)
    assert estimate is not None
    assert estimate.flops_per_cycle == 16 * 2 * 2  # 512-bit fp32 lanes x FMA x 2 units
    assert estimate.flops == pytest.approx(2 * 2596.14e6 * 64)
    avx2 = peak.cpu_estimate(CPUINFO.replace(" avx512f", ""), cores=1)
    assert avx2 is not None and avx2.flops_per_cycle == 32
    assert peak.cpu_estimate("nothing useful") is None


def test_peak_per_device() -> None:
    assert peak.peak_flops_per_device("TPU v5 lite", "tpu", 4) == 197e12
    assert peak.peak_flops_per_device("cpu", "cpu", 2, cpu_override=1e9) == 1e9
    assert peak.peak_flops_per_device("cpu", "gpu", 1) is None
