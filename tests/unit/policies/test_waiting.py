"""Why the pods of an attempt wait (``policies/waiting.py``), in the order it is said."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.api.status import ConditionType
from tpu_operator.policies import waiting
from tpu_operator.policies.plan import SliceRefusal
from tpu_operator.state.gang import GangState, Member, Unseen
from tpu_operator.state.views import pod_view

pytestmark = pytest.mark.unit


def gang(**fields: Any) -> GangState:
    state = GangState(attempt=1, outcome="Starting", total=2)
    for key, value in fields.items():
        setattr(state, key, value)
    return state


def refusing_slice() -> dict[int, dict[str, Any]]:
    ready = {"type": "Ready", "status": "False", "reason": "PodsForbidden", "message": "quota"}
    return {0: {"status": {"attempt": 1, "conditions": [ready]}}}


OTHER = pod_view(
    {
        "metadata": {
            "name": "x",
            "namespace": "b",
            "uid": "x",
            "labels": {"tpu-operator.dev/slice-name": "s"},
        },
        "spec": {"nodeName": "n0"},
        "status": {"phase": "Running"},
    }
)


CASES: list[tuple[str, dict[str, Any], dict[str, Any], World, str | None, str]] = [
    ("nothing waits", {}, {}, World(), None, ""),
    (
        "GKE creates the pools",
        {"unschedulable": ("j-0-0", "no nodes")},
        {"provisioning": ["slice 0 (label ...): no nodes yet"]},
        World(),
        "WaitingForNodePools",
        "waiting for GKE to create node pools",
    ),
    (
        "the scheduler cannot place a pod",
        {"unschedulable": ("j-0-0", "0/4 nodes are available")},
        {},
        World(),
        "Unschedulable",
        "pod j-0-0 cannot be scheduled: 0/4 nodes are available",
    ),
    (
        "and others' pods are on the pool",
        {"unschedulable": ("j-0-0", "0/4 nodes are available")},
        {},
        World(others=[OTHER]),
        "Unschedulable",
        "not this job's workers are on its node pools: b/x on node n0",
    ),
    (
        "the apiserver refuses the pods",
        {"to_create": [Member(0, 0, "j-0-0")]},
        {"slices": refusing_slice()},
        World(),
        "PodsForbidden",
        "attempt 1: quota",
    ),
    (
        "the apiserver refuses the slices",
        {},
        {},
        World(refusal=SliceRefusal("u", False, "denied by policy")),
        "SliceCreationFailed",
        "denied by policy",
    ),
    (
        "no scheduler looks at the pods",
        {"unseen": Unseen("j-0-0", "volcano", "2026-01-01T00:00:00Z")},
        {},
        World(),
        "NoScheduler",
        "named 'volcano'",
    ),
    (
        "their scheduler is busy with other pods",
        {"unseen": Unseen("j-0-0", "volcano", "2026-01-01T00:00:00Z")},
        {},
        World(schedulers={"volcano": dt.datetime(2026, 1, 1, 0, 1, 30, tzinfo=dt.UTC)}),
        None,
        "",
    ),
    (
        "their scheduler stopped looking at pods",
        {"unseen": Unseen("j-0-0", "volcano", "2026-01-01T00:00:00Z")},
        {},
        World(schedulers={"volcano": dt.datetime(2026, 1, 1, 0, 0, 10, tzinfo=dt.UTC)}),
        "NoScheduler",
        "named 'volcano' (spec.template.spec.schedulerName) (which last looked at a pod",
    ),
]


@pytest.mark.parametrize(
    ("case", "state", "given", "world", "reason", "said"), CASES, ids=[c[0] for c in CASES]
)
def test_why_pods_wait(case, state, given, world, reason, said):
    given = dict(given)
    provisioning = given.pop("provisioning", [])
    job = facts(100.0, recorded={"attempt": 1, "nodePools": ["p1"]}, **given)
    plan = plan_of(job)
    plan.provisioning = provisioning
    explained = waiting.explain(job, plan, world, 1, gang(**state))
    assert explained is (reason is not None)
    assert plan.condition_reason(ConditionType.PODS_SCHEDULED) == reason
    assert said in plan.status.message
    if reason not in (None, "WaitingForNodePools"):
        assert reasons(plan) == [reason]  # once: it started waiting now


def test_a_reason_already_given_is_not_announced_again():
    job = facts(recorded={"attempt": 1})
    plan = plan_of(job)
    plan.condition(ConditionType.PODS_SCHEDULED, False, "SliceCreationFailed", "before")
    world = World(refusal=SliceRefusal("u", False, "denied"))
    assert waiting.explain(job, plan, world, 1, gang())
    assert reasons(plan) == []
