"""Pools promised to holders (``Reservations``): by pool for allocations, by holder for
commits, the two always the same reservations."""

from __future__ import annotations

import pytest

from tpu_operator.reconcile.context import Reservations

pytestmark = pytest.mark.unit


def _by_holder(reservations: Reservations) -> dict[str, set[str]]:
    inverted: dict[str, set[str]] = {}
    for pool, holder in reservations.by_pool.items():
        inverted.setdefault(holder, set()).add(pool)
    return inverted


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("reserve", "a", ["p1", "p2"])], {"p1": "a", "p2": "a"}, id="reserve"),
        pytest.param(
            [("reserve", "a", ["p1", "p2"]), ("hold", "a", ["p2", "p3"])],
            {"p2": "a", "p3": "a"},
            id="a commit replaces the holder's reservations",
        ),
        pytest.param(
            [("reserve", "a", ["p1"]), ("reserve", "b", ["p2"]), ("release", "a", [])],
            {"p2": "b"},
            id="release drops only the holder's",
        ),
        pytest.param(
            [("reserve", "a", ["p1", "p2"]), ("reserve", "b", ["p2"]), ("release", "a", [])],
            {"p2": "b"},
            id="a pool reserved again belongs to its last holder",
        ),
        pytest.param(
            [("reserve", "a", ["p1"]), ("reserve", "b", ["p1"]), ("release", "b", [])],
            {},
            id="the last holder's release frees a pool taken over",
        ),
        pytest.param(
            [("reserve", "a", ["p1"]), ("hold", "a", []), ("release", "a", [])],
            {},
            id="a commit of no pools, then a release of nothing",
        ),
    ],
)
def test_reservations(steps: list[tuple[str, str, list[str]]], expected: dict[str, str]) -> None:
    reservations = Reservations()
    for action, holder, pools in steps:
        if action == "release":
            reservations.release(holder)
        else:
            getattr(reservations, action)(holder, pools)
    assert reservations.by_pool == expected
    assert reservations.by_holder == _by_holder(reservations)
