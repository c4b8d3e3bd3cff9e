"""In-place restarts that cannot finish (``policies/in_place.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, stamp_at
from tpu_operator.api.status import Reason
from tpu_operator.policies import in_place

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("status", "outcome", "fallback", "reason", "requeue"),
    [
        ({}, "Starting", None, None, None),  # not an in-place restart
        ({"restartKind": "InPlace", "inPlaceSince": stamp_at(90)}, "Starting", None, None, 50.0),
        (
            {"restartKind": "InPlace", "inPlaceSince": stamp_at(0)},
            "Starting",
            None,
            Reason.IN_PLACE_TIMEOUT,
            None,
        ),
        ({"restartKind": "InPlace", "inPlaceSince": stamp_at(0)}, "Running", None, None, None),
        (
            {"restartKind": "InPlace", "inPlaceSince": stamp_at(90)},
            "Starting",
            "no answer",
            Reason.SUPERVISOR_UNREACHABLE,
            None,
        ),
        ({"restartKind": "InPlace", "runningSince": stamp_at(95)}, "Starting", "x", None, None),
    ],
)
def test_an_in_place_restart_that_cannot_finish(status, outcome, fallback, reason, requeue):
    job = facts(
        100.0, recorded={"attempt": 2, **status}, failurePolicy={"inPlaceTimeoutSeconds": 60}
    )
    plan = plan_of(job)
    found = in_place.failure(job, plan, World(fallback=fallback), 2, outcome)
    assert (found.reason if found else None) == reason
    assert plan.requeue == requeue
