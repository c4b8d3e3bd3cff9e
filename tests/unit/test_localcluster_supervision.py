"""localcluster's supervision of its components: the back-off (pure) and the supervisor's
decisions, driven with stand-in processes, a state file and a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import supervision
from localcluster.layout import Layout, write_state
from localcluster.supervision import Backoff, Restart, Supervisor, describe_exit, next_restart

pytestmark = pytest.mark.unit


# Back-off ---------------------------------------------------------------------------------


def test_the_first_exit_is_restarted_at_once() -> None:
    assert next_restart(0, ran=5.0) == Restart(streak=1, delay=0.0)


def test_exits_in_a_row_double_the_wait_up_to_the_cap() -> None:
    streak, delays = 0, []
    for _ in range(9):
        restart = next_restart(streak, ran=0.5)
        streak = restart.streak
        delays.append(restart.delay)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert streak == 9


def test_a_long_run_starts_a_new_series() -> None:
    policy = Backoff()
    assert next_restart(7, ran=policy.reset_after) == Restart(streak=1, delay=0.0)
    assert next_restart(7, ran=policy.reset_after - 0.1) == Restart(streak=8, delay=policy.cap)


def test_the_kubelets_numbers_give_its_crash_loop() -> None:
    kubelet = Backoff(first=10.0, cap=300.0, reset_after=600.0)
    streak, delays = 0, []
    for _ in range(7):
        restart = next_restart(streak, ran=1.0, policy=kubelet)
        streak = restart.streak
        delays.append(restart.delay)
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]


@pytest.mark.parametrize(
    ("returncode", "text"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (-9, "exited with code 137 (SIGKILL)"),
        (-15, "exited with code 143 (SIGTERM)"),
        (-40, "exited with code 168 (signal 40)"),
    ],
)
def test_exits_are_described_as_a_shell_reports_them(returncode: int, text: str) -> None:
    assert describe_exit(returncode) == text


# The supervisor's decisions -----------------------------------------------------------------


@dataclass
class FakeProcess:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A supervisor over stand-in processes of two components; ``respawn`` records what
    it starts and gives each start a new PID."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = Clock()
        monkeypatch.setattr(supervision.time, "monotonic", self.clock)
        self.layout = Layout(tmp_path)
        self.children: dict[str, FakeProcess] = {
            "kube-scheduler": FakeProcess(100),
            "etcd": FakeProcess(101),
        }
        self.state: dict[str, Any] = {
            "status": "running",
            "commands": {"kube-scheduler": ["sched"], "etcd": ["etcd"]},
            "held": [],
            "killed": {},
        }
        self.save()
        self.started: list[tuple[str, list[str]]] = []
        self.lines: list[str] = []
        self.supervisor = Supervisor(
            self.layout,
            lambda: self.children,  # type: ignore[arg-type, return-value]
            self.respawn,  # type: ignore[arg-type]
            self.lines.append,
            started={"kube-scheduler": self.clock.now, "etcd": self.clock.now},
        )

    def save(self) -> None:
        write_state(self.layout, self.state)

    def respawn(self, name: str, argv: Sequence[str]) -> FakeProcess:
        self.started.append((name, list(argv)))
        self.children[name] = FakeProcess(self.children[name].pid + 1000)
        return self.children[name]

    def exit(self, name: str, code: int, after: float) -> None:
        self.clock.now += after
        self.children[name].returncode = code

    def tick(self, after: float = 0.0) -> bool:
        self.clock.now += after
        return self.supervisor.tick()


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    return Harness(tmp_path, monkeypatch)


def test_an_exited_component_is_started_again_with_its_recorded_command(
    harness: Harness,
) -> None:
    harness.state["commands"]["kube-scheduler"] = ["sched", "--v=2"]
    harness.save()
    harness.exit("kube-scheduler", -9, after=120.0)
    assert harness.tick()
    assert harness.started == [("kube-scheduler", ["sched", "--v=2"])]
    assert harness.lines[0].startswith(
        "kube-scheduler exited with code 137 (SIGKILL) after 120.0 s; restarting in 0 s;"
    )
    assert harness.lines[1] == "kube-scheduler started again (pid 1100)"


def test_a_crash_loop_waits_out_its_back_off(harness: Harness) -> None:
    harness.exit("etcd", 1, after=0.5)
    harness.tick()
    harness.exit("etcd", 1, after=0.5)  # the restarted one exits at once too
    harness.tick()
    assert harness.started == [("etcd", ["etcd"])]
    assert "restarting in 1 s (exit 2 in a row)" in harness.lines[-1]
    harness.tick(after=0.9)
    assert len(harness.started) == 1
    harness.tick(after=0.1)
    assert len(harness.started) == 2
    harness.exit("etcd", 1, after=0.5)
    harness.tick()
    assert "restarting in 2 s (exit 3 in a row)" in harness.lines[-1]


def test_a_held_component_stays_down_until_released_then_starts_at_once(
    harness: Harness,
) -> None:
    harness.state["held"] = ["kube-scheduler"]
    harness.state["killed"] = {"kube-scheduler": 100}
    harness.save()
    harness.exit("kube-scheduler", -9, after=3.0)
    assert harness.tick()
    for _ in range(5):
        assert harness.tick(after=60.0)
    assert harness.started == []
    assert harness.lines == [
        "kube-scheduler exited with code 137 (SIGKILL) after 3.0 s: stopped on purpose, "
        "not restarted until it is started again"
    ]
    harness.state["held"] = []
    harness.save()
    harness.tick()
    assert harness.started == [("kube-scheduler", ["sched"])]


def test_a_kill_released_before_the_supervisor_looked_is_no_crash(harness: Harness) -> None:
    """kill_component then start_component at once: the exit is the kill's, restarted
    at once and not counted towards a crash loop."""
    harness.exit("kube-scheduler", 1, after=0.5)  # a real crash first: streak 1
    harness.tick()
    harness.state["killed"] = {"kube-scheduler": 1100}
    harness.save()
    harness.exit("kube-scheduler", -9, after=0.5)
    harness.tick()
    assert len(harness.started) == 2
    assert harness.lines[-2].endswith("stopped on purpose, starting it again")
    harness.exit("kube-scheduler", 1, after=0.5)  # the next crash is the 2nd in the series
    harness.tick()
    assert "restarting in 1 s (exit 2 in a row)" in harness.lines[-1]


def test_a_component_held_during_its_back_off_is_not_started(harness: Harness) -> None:
    harness.exit("etcd", 1, after=0.5)
    harness.tick()
    harness.exit("etcd", 1, after=0.5)
    harness.tick()  # waits 1 s
    harness.state["held"] = ["etcd"]
    harness.save()
    harness.tick(after=5.0)
    harness.tick(after=5.0)
    assert len(harness.started) == 1
    harness.state["held"] = []
    harness.save()
    harness.tick()
    assert len(harness.started) == 2


def test_nothing_is_started_once_the_cluster_stops(harness: Harness) -> None:
    harness.supervisor.closing.set()
    harness.exit("etcd", -15, after=1.0)
    assert harness.tick()
    assert harness.started == [] and harness.lines == []


def test_a_cluster_stopped_by_another_process_ends_supervision(harness: Harness) -> None:
    harness.state["status"] = "stopped"
    harness.save()
    harness.exit("etcd", -15, after=1.0)
    assert not harness.tick()
    assert harness.started == []
