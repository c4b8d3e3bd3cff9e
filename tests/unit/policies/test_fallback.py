"""``spec.placement.fallbacks`` (``policies/fallback.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons, stamp_at
from tpu_operator import crdgen
from tpu_operator.api.job import TPUJobStatus
from tpu_operator.placement.pools import Allocation
from tpu_operator.policies import fallback, start
from tpu_operator.policies.plan import Act

pytestmark = pytest.mark.unit

SPOT_THEN_ON_DEMAND = {
    "spot": True,
    "fallbacks": [{"afterSeconds": 600, "spot": False}],
}
RESERVATION_THEN_SPOT_THEN_ANY = {
    "reservation": "r1",
    "fallbacks": [
        {"afterSeconds": 300, "spot": True},
        {"afterSeconds": 900},
    ],
}


def condition(status: str, since: float, reason: str) -> dict[str, Any]:
    return {
        "type": "PodsScheduled",
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": stamp_at(since),
    }


NO_POOL = condition("False", 0, "WaitingForNodePools")


def on_step(step: int, since: float) -> dict[str, Any]:
    return {"step": step, "since": stamp_at(since), "capacity": "x"}


@pytest.mark.parametrize(
    ("placement", "now", "recorded", "step", "requeue"),
    [
        # waits on spot, looks again when the step would end
        (SPOT_THEN_ON_DEMAND, 100, {"conditions": [NO_POOL]}, 0, 500.0),
        (SPOT_THEN_ON_DEMAND, 600, {"conditions": [NO_POOL]}, 1, None),
        # the last step: nothing further
        (
            SPOT_THEN_ON_DEMAND,
            5000,
            {"conditions": [NO_POOL], "fallback": on_step(1, 600)},
            1,
            None,
        ),
        # not waiting for capacity: no clock runs
        (SPOT_THEN_ON_DEMAND, 5000, {"conditions": [condition("True", 0, "Scheduled")]}, 0, None),
        (
            SPOT_THEN_ON_DEMAND,
            5000,
            {"conditions": [condition("False", 0, "NoScheduler")]},
            0,
            None,
        ),
        (SPOT_THEN_ON_DEMAND, 5000, {}, 0, None),
        # pods that wait for the pool GKE is to create, or for the scheduler: it runs too
        (SPOT_THEN_ON_DEMAND, 600, {"conditions": [NO_POOL], "nodePools": ["auto:c"]}, 1, None),
        (
            SPOT_THEN_ON_DEMAND,
            600,
            {"conditions": [condition("False", 0, "Unschedulable")]},
            1,
            None,
        ),
        # an attempt whose workers all ran keeps its step
        (
            SPOT_THEN_ON_DEMAND,
            5000,
            {"conditions": [NO_POOL], "runningSince": stamp_at(9)},
            0,
            None,
        ),
        # Kueue decides a queued job's capacity
        (
            SPOT_THEN_ON_DEMAND,
            5000,
            {"conditions": [NO_POOL], "queue": {"state": "Admitted"}},
            0,
            None,
        ),
        # no fallbacks: nothing to do
        ({"spot": True}, 5000, {"conditions": [NO_POOL]}, 0, None),
        # each step's clock starts when the job moved onto it
        (RESERVATION_THEN_SPOT_THEN_ANY, 300, {"conditions": [NO_POOL]}, 1, None),
        (
            RESERVATION_THEN_SPOT_THEN_ANY,
            1000,
            {"conditions": [NO_POOL], "fallback": on_step(1, 300)},
            1,
            200.0,
        ),
        (
            RESERVATION_THEN_SPOT_THEN_ANY,
            1200,
            {"conditions": [NO_POOL], "fallback": on_step(1, 300)},
            2,
            None,
        ),
        # a wait that began after the step did counts from the wait
        (
            RESERVATION_THEN_SPOT_THEN_ANY,
            2500,
            {
                "conditions": [condition("False", 2000, "WaitingForNodePools")],
                "fallback": on_step(1, 300),
            },
            1,
            400.0,
        ),
    ],
)
def test_a_job_falls_back_after_waiting_on_its_step(placement, now, recorded, step, requeue):
    job = facts(now, recorded={"phase": "Pending", **recorded}, placement=placement)
    plan = plan_of(job)
    before = fallback.step_of(plan.status)
    fallback.check(job, plan)
    assert fallback.step_of(plan.status) == step
    assert plan.requeue == requeue
    moved = step != before
    assert reasons(plan) == (["CapacityFallback"] if moved else [])
    if moved:
        assert plan.status.fallback is not None
        assert plan.status.fallback.since == stamp_at(now)


def test_the_event_and_status_say_what_the_job_asked_for_and_asks_for_now():
    job = facts(
        900, recorded={"phase": "Pending", "conditions": [NO_POOL]}, placement=SPOT_THEN_ON_DEMAND
    )
    plan = plan_of(job)
    fallback.check(job, plan)
    assert plan.status.fallback is not None
    assert plan.status.fallback.wire() == {
        "step": 1,
        "since": stamp_at(900),
        "capacity": "on-demand",
    }
    ((_, _, message),) = plan.events
    assert message == (
        "waited 900 s for a node pool of spot (step 0); falling back to step 1 of "
        "placement.fallbacks: on-demand"
    )


def test_a_fallen_back_job_asks_for_pools_of_its_step():
    job = facts(
        900, recorded={"phase": "Pending", "conditions": [NO_POOL]}, placement=SPOT_THEN_ON_DEMAND
    )
    plan = plan_of(job)
    world = World(allocation=Allocation(None, "waiting"))
    start.start(job, plan, world, 0, None)
    assert [r.spot for r in world.allocated[-1]] == [True]
    fallback.check(job, plan)
    start.start(job, plan, world, 0, None)
    assert [r.spot for r in world.allocated[-1]] == [False]


FLEX_THEN_RESERVATION = {
    "capacity": "FlexStart",
    "maxRunDurationSeconds": 3600,
    "fallbacks": [{"afterSeconds": 600, "reservation": "r1"}],
}
SPOT_THEN_QUEUED = {
    "spot": True,
    "fallbacks": [{"afterSeconds": 600, "capacity": "QueuedProvisioning"}],
}


@pytest.mark.parametrize(
    ("placement", "step", "wire"),
    [
        (SPOT_THEN_ON_DEMAND, 0, {"spot": True}),
        (SPOT_THEN_ON_DEMAND, 1, {"spot": False}),
        (
            {**RESERVATION_THEN_SPOT_THEN_ANY, "provisioning": "Auto"},
            0,
            {"reservation": "r1", "provisioning": "Auto"},
        ),
        (
            {**RESERVATION_THEN_SPOT_THEN_ANY, "provisioning": "Auto"},
            1,
            {"spot": True, "provisioning": "Auto"},
        ),
        ({**RESERVATION_THEN_SPOT_THEN_ANY, "provisioning": "Auto"}, 2, {"provisioning": "Auto"}),
        # Flex-start, then a reservation: the step's capacity replaces the one before.
        (FLEX_THEN_RESERVATION, 0, {"capacity": "FlexStart", "maxRunDurationSeconds": 3600}),
        (FLEX_THEN_RESERVATION, 1, {"reservation": "r1"}),
        # Spot, then queued provisioning.
        (SPOT_THEN_QUEUED, 1, {"capacity": "QueuedProvisioning"}),
    ],
)
def test_the_slices_carry_the_placement_of_the_step(placement, step, wire):
    status = TPUJobStatus.model_validate({"fallback": {"step": step}} if step else {})
    assert fallback.wire_placement(placement, status) == wire
    job = facts(0, placement=placement)
    chosen = fallback.placement_of(job, status)
    assert chosen is not None
    assert (chosen.spot, chosen.reservation, chosen.capacity, chosen.max_run_duration_seconds) == (
        wire.get("spot"),
        wire.get("reservation"),
        wire.get("capacity"),
        wire.get("maxRunDurationSeconds"),
    )


def test_a_flex_start_job_falls_back_to_a_reservation_and_says_so():
    job = facts(
        900, recorded={"phase": "Pending", "conditions": [NO_POOL]}, placement=FLEX_THEN_RESERVATION
    )
    plan = plan_of(job)
    world = World(allocation=Allocation(None, "waiting"))
    start.start(job, plan, world, 0, None)
    # Flex-start capacity comes as a new pool of its own (a fresh claim).
    assert [(r.fresh, r.reservation) for r in world.allocated[-1]] == [(True, None)]
    said = len(plan.events)
    fallback.check(job, plan)
    ((_, _, message),) = plan.events[said:]
    assert message == (
        "waited 900 s for a node pool of flex-start (step 0); falling back to step 1 of "
        "placement.fallbacks: reservation r1"
    )
    start.start(job, plan, world, 0, None)
    assert [(r.fresh, r.reservation) for r in world.allocated[-1]] == [(False, "r1")]


def test_a_step_of_flex_start_capacity_has_the_rules_of_a_placement():
    crd = crdgen.crds()["tpu-operator.dev_tpujobs.yaml"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    step = schema["properties"]["spec"]["properties"]["placement"]["properties"]["fallbacks"]
    rules = {r["fieldPath"]: r["message"] for r in step["items"]["x-kubernetes-validations"]}
    assert "flex-start VMs only" in rules[".maxRunDurationSeconds"]
    assert set(step["items"]["properties"]) >= {"capacity", "maxRunDurationSeconds"}
    # the apiserver evaluates them: tests/operator/test_validation.py


def test_an_attempt_started_again_without_free_pools_stops_its_pods_meanwhile():
    recorded = {
        "phase": "Starting",
        "attempt": 1,
        "nodePools": ["p1"],
        "conditions": [condition("False", 0, "Unschedulable")],
    }
    job = facts(600, recorded=recorded, placement=SPOT_THEN_ON_DEMAND)
    plan = plan_of(job)
    assert fallback.check(job, plan)
    start.replace(job, plan, World(allocation=Allocation(None, "no on-demand pool")), 1)
    assert (plan.status.attempt, plan.status.node_pools) == (1, None)
    assert plan.act is Act.STOP and plan.status.phase == "Pending"
    plan = plan_of(job)
    assert fallback.check(job, plan)
    start.replace(job, plan, World(allocation=Allocation(["p2"])), 1)
    assert (plan.status.attempt, plan.status.node_pools) == (2, ["p2"])
    assert plan.act is Act.RUN
