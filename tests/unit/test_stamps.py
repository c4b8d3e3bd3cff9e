"""Stamps: the age of each key's last mark, and only the marks of the last ``keep`` seconds."""

from __future__ import annotations

import pytest

from tests.unit.fakeapi import ManualClock
from tpu_operator.runtime.stamps import Stamps

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("marks", "at", "ages", "kept"),
    [
        pytest.param([], 0.0, {"a": None}, 0, id="never marked"),
        pytest.param([("a", 0.0)], 3.0, {"a": 3.0, "b": None}, 1, id="one mark"),
        pytest.param(
            [("a", 0.0), ("b", 4.0), ("a", 6.0)],
            7.0,
            {"a": 1.0, "b": 3.0},
            2,
            id="a mark again restarts its age",
        ),
        pytest.param(
            [("a", 0.0), ("b", 4.0), ("c", 11.0)],
            11.0,
            {"a": None, "b": 7.0, "c": 0.0},
            2,
            id="older than keep: dropped by a newer mark",
        ),
        pytest.param(
            [("a", 0.0), ("b", 1.0), ("a", 9.0), ("c", 12.0)],
            12.0,
            {"a": 3.0, "b": None, "c": 0.0},
            2,
            id="a key marked again is not dropped for its first mark",
        ),
        pytest.param(
            [("a", 0.0)],
            50.0,
            {"a": 50.0},
            1,
            id="nothing newer marked: an old mark still tells its age",
        ),
        pytest.param(
            [("a", 5.0), ("b", 2.0), ("c", 14.0)],
            14.0,
            {"a": 9.0, "b": 12.0, "c": 0.0},
            3,
            id="a clock that stepped back loses no younger mark (an older one waits)",
        ),
    ],
)
def test_ages_and_what_is_kept(
    marks: list[tuple[str, float]], at: float, ages: dict[str, float | None], kept: int
) -> None:
    clock = ManualClock(1000.0)
    stamps: Stamps[str] = Stamps(10.0, clock)
    for key, offset in marks:
        clock.now = 1000.0 + offset
        stamps.mark(key)
    clock.now = 1000.0 + at
    assert {key: stamps.age(key) for key in ages} == ages
    assert len(stamps) == kept


def test_every_deletion_of_a_large_restart_is_remembered_until_its_ttl() -> None:
    """A 12,736-pod gang restart marks every pod within seconds: all are kept (none is
    deleted twice), and once the TTL has passed the next mark leaves only itself."""
    clock = ManualClock(1000.0)
    stamps: Stamps[str] = Stamps(30.0, clock)
    for n in range(12_736):
        clock.now = 1000.0 + n / 1000
        stamps.mark(f"uid-{n}")
    assert len(stamps) == 12_736
    assert stamps.age("uid-0") == pytest.approx(12.735)
    clock.now = 1100.0
    stamps.mark("uid-new")
    assert len(stamps) == 1
    assert stamps.age("uid-12735") is None
