"""A wait for capacity that ends (``policies/waits.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.test_patience import NO_POOL, QUEUED, SCHEDULED, condition
from tests.unit.policies.world import World, facts, plan_of
from tpu_operator.policies import waits

pytestmark = pytest.mark.unit

UNSCHEDULABLE = condition("PodsScheduled", "False", 40, "Unschedulable", "0/4 nodes")
ADMITTED = condition("Queued", "False", 50, "Admitted")


@pytest.mark.parametrize(
    ("recorded", "planned", "observed", "event"),
    [
        # Pools found after 100 s: one event, the time under the reason it waited for.
        ([NO_POOL], [SCHEDULED], [("WaitingForNodePools", 100.0)], "no longer waiting"),
        # Still waiting, for the same reason: nothing.
        ([NO_POOL], [NO_POOL], [], None),
        # Waiting for another reason now: the first wait ends, the next one begins.
        (
            [NO_POOL],
            [UNSCHEDULABLE],
            [("WaitingForNodePools", 100.0)],
            "now waiting for another reason",
        ),
        # Admitted by Kueue after 70 s in the queue.
        ([QUEUED], [ADMITTED], [("Pending", 70.0)], "no longer waiting"),
        # Never waited: nothing.
        ([SCHEDULED], [SCHEDULED], [], None),
        ([], [NO_POOL], [], None),
    ],
)
def test_a_wait_that_ends_is_an_event_and_a_metric_after_the_write(
    recorded, planned, observed, event
):
    job = facts(100.0, recorded={"attempt": 1, "conditions": recorded})
    plan = plan_of(job)
    plan.conditions = planned
    world = World()
    waits.ended(job, plan, world)
    assert world.metrics.waits == []  # only once the status is written
    for action in plan.after_commit:
        action()
    assert world.metrics.waits == observed
    messages = [m for _, r, m in plan.events if r == "WaitEnded"]
    if event is None:
        assert messages == []
    else:
        ((message),) = messages
        assert event in message and f"waited {observed[0][1]:.0f} s" in message
