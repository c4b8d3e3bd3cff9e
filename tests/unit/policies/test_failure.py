"""A failed attempt: the failure policy and the kind of restart (``policies/failure.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, facts, plan_of, reasons
from tpu_operator.api.status import Phase, Reason, RestartKind
from tpu_operator.placement.pools import Allocation, PoolGone
from tpu_operator.policies import failure
from tpu_operator.policies.plan import Act
from tpu_operator.state.gang import WorkerFailure

pytestmark = pytest.mark.unit


def failed(reason: Reason, exit_code: int | None = 1) -> WorkerFailure:
    return WorkerFailure(reason, f"{reason} on j-0-0", "j-0-0", "n0", exit_code, None)


@pytest.mark.parametrize(
    ("cause", "policy", "used", "phase", "counted", "kind"),
    [
        (failed(Reason.WORKER_FAILED), {}, 0, Phase.RESTARTING, 1, RestartKind.RECREATE),
        (failed(Reason.WORKER_FAILED), {"maxRestarts": 2}, 2, Phase.FAILED, 2, None),
        # Disruptions are not counted against maxRestarts by default.
        (
            failed(Reason.EVICTED, None),
            {"maxRestarts": 0},
            0,
            Phase.RESTARTING,
            0,
            RestartKind.RECREATE,
        ),
        (
            failed(Reason.NODE_LOST, None),
            {"maxRestarts": 0},
            0,
            Phase.RESTARTING,
            0,
            RestartKind.RECREATE,
        ),
        (
            failed(Reason.WORKER_FAILED, 3),
            {"rules": [{"action": "FailJob", "values": [3]}]},
            0,
            Phase.FAILED,
            0,
            None,
        ),
    ],
)
def test_restart_or_fail(cause, policy, used, phase, counted, kind):
    job = facts(recorded={"attempt": 1, "countedRestarts": used}, failurePolicy=policy)
    plan = plan_of(job)
    world = World()
    failure.attempt_failed(job, plan, world, cause, 1)
    status = plan.status
    assert status.phase == phase
    assert status.counted_restarts == counted
    assert status.last_failure is not None and status.last_failure.reason == cause.reason
    if phase == Phase.RESTARTING:
        assert (status.attempt, status.restart_kind, plan.act) == (2, kind, Act.NOTHING)
        assert reasons(plan) == ["Restarting"]
        for action in plan.after_commit:
            action()
        assert world.metrics.restarts == [("TPUJob", cause.reason)]
    else:
        assert (status.attempt, plan.act) == (1, Act.STOP)
        assert reasons(plan) == ["Failed"]


def test_a_restart_renews_the_pools_that_vanished_for_its_pods():
    job = facts(recorded={"attempt": 1, "nodePools": ["gone"]})
    plan = plan_of(job)
    world = World(
        gone=[PoolGone(0, "gone", True, "slice 0: node pool gone has no nodes")],
        allocation=Allocation(None, "no free pool"),
    )
    failure.attempt_failed(job, plan, world, failed(Reason.NODE_LOST, None), 1)
    assert plan.status.node_pools == ["auto:claim-0-2"]
    assert reasons(plan) == ["Restarting", "NodePoolGone"]


def test_a_restart_moves_a_slice_off_a_deleted_pool_to_a_free_one_first():
    job = facts(recorded={"attempt": 1, "nodePools": ["gone"]})
    plan = plan_of(job)
    world = World(
        gone=[PoolGone(0, "gone", True, "slice 0: node pool gone has no nodes")],
        allocation=Allocation(["spare"], spares=[0]),
    )
    failure.attempt_failed(job, plan, world, failed(Reason.NODE_LOST, None), 1)
    assert plan.status.node_pools == ["spare"]
    assert reasons(plan) == ["Restarting", "NodePoolGone"]
    assert (
        "node pool gone has no nodes (deleted); moved to spare node pool spare"
        in (plan.events[1][2])
    )
    # A deleted pool is not reported as broken: it does not come back to be given out.
    assert plan.status.broken_node_pools == []


@pytest.mark.parametrize(
    ("reason", "pod", "limit", "counts", "worn"),
    [
        # A worker's exit on slice 1's pool: counted there; the second one wears it out.
        (Reason.WORKER_FAILED, "j-1-0", 2, [(0, 0), (2, 2)], [1]),
        (Reason.NODE_LOST, "j-1-1", 2, [(0, 0), (2, 2)], [1]),
        # An eviction is not the pool's fault; a limit of 0 never moves a slice.
        (Reason.EVICTED, "j-1-0", 2, [(0, 0), (2, 1)], []),
        (Reason.WORKER_FAILED, "j-1-0", 0, [(0, 0), (2, 2)], []),
        # A pod of slice 0 that is gone is still counted on its slice (by its name).
        (Reason.POD_DELETED, "j-0-1", 2, [(1, 0), (1, 1)], []),
    ],
)
def test_failures_are_counted_per_slice_and_pool(reason, pod, limit, counts, worn):
    slices = [
        {"index": 0, "name": "j-0", "phase": "Running", "workers": 2, "readyWorkers": 2},
        {
            "index": 1,
            "name": "j-1",
            "phase": "Running",
            "workers": 2,
            "readyWorkers": 2,
            "nodePool": "p1",
            "failures": 1,
            "poolFailures": 1,
        },
    ]
    job = facts(
        recorded={"attempt": 1, "slices": slices},
        numSlices=2,
        failurePolicy={"maxSliceFailuresPerPool": limit},
    )
    plan = plan_of(job)
    found = failure.count_slice_failure(job, plan, WorkerFailure(reason, "x", pod, None, 1, None))
    assert [(s.failures, s.pool_failures) for s in plan.status.slices] == counts
    assert sorted(found) == worn
