"""Gang assessment, failure-policy decisions, backoff and node-pool allocation (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpu_operator import catalog
from tpu_operator.api.policy import ExitCodeRule, FailurePolicy
from tpu_operator.api.status import Reason
from tpu_operator.decisions import backoff_seconds, decide
from tpu_operator.placement.pools import PoolView, Request, allocate
from tpu_operator.state.gang import Member, WorkerFailure, assess, may_end_attempt
from tpu_operator.state.views import PodView, node_view, pod_view

pytestmark = pytest.mark.unit


def pod(
    name: str,
    *,
    slice_index: int = 0,
    worker: int = 0,
    attempt: int = 1,
    phase="Running",
    ready=True,
    node="n0",
    **changes,
) -> PodView:
    base = PodView(
        name=name,
        namespace="ml",
        uid=f"uid-{name}",
        job_name="j",
        slice_name=f"j-{slice_index}",
        slice_index=slice_index,
        worker_index=worker,
        attempt=attempt,
        phase=phase,
        ready=ready,
        deletion_deadline=None,
        node=node,
        pool=None,
        pod_ip="127.1.0.1",
        exit_code=None,
        exit_reason=None,
        disruption=None,
        unschedulable=None,
        created=None,
        started=None,
        finished=None,
    )
    return replace(base, **changes)


MEMBERS = [Member(s, w, f"j-{s}-{w}") for s in range(2) for w in range(2)]


def gang(*pods, **kwargs):
    return assess(attempt=1, members=MEMBERS, pods=pods, **kwargs)


def all_running(**changes_by_name):
    return [
        pod(
            m.name,
            slice_index=m.slice_index,
            worker=m.worker_index,
            **changes_by_name.get(m.name, {}),
        )
        for m in MEMBERS
    ]


def test_progression_creating_starting_running_succeeded():
    assert gang().outcome == "Creating"
    assert len(gang().to_create) == 4
    starting = all_running(**{"j-1-1": {"ready": False, "phase": "Pending"}})
    state = gang(*starting)
    assert (state.outcome, state.ready, state.total) == ("Starting", 3, 4)
    assert gang(*all_running()).outcome == "Running"
    done = {m.name: {"phase": "Succeeded", "ready": False, "exit_code": 0} for m in MEMBERS}
    assert gang(*all_running(**done)).outcome == "Succeeded"


def test_leader_success_policy():
    leader_done = {"j-0-0": {"phase": "Succeeded", "ready": False, "exit_code": 0}}
    assert gang(*all_running(**leader_done)).outcome == "Running"
    assert gang(*all_running(**leader_done), success_policy="LeaderWorker").outcome == "Succeeded"


def test_one_failed_worker_fails_the_gang_with_its_exit_code():
    failed = {"j-1-0": {"phase": "Failed", "ready": False, "exit_code": 3, "node": "n7"}}
    state = gang(*all_running(**failed))
    assert state.outcome == "Failed"
    assert state.failure == WorkerFailure(
        "Failed", "pod j-1-0 on node n7 exited with code 3", "j-1-0", "n7", 3, None
    )


def test_disruption_anywhere_is_the_cause():
    changes = {
        "j-0-0": {
            "phase": "Failed",
            "ready": False,
            "exit_code": 1,
            "finished": "2026-01-01T00:00:01Z",
        },
        "j-1-1": {
            "phase": "Failed",
            "ready": False,
            "disruption": "EvictionByEvictionAPI",
            "finished": "2026-01-01T00:00:05Z",
        },
    }
    state = gang(*all_running(**changes))
    assert state.failure is not None and state.failure.reason == "Evicted"
    assert state.failure.disruption


def test_within_one_second_a_worker_aborted_by_a_dead_peer_is_not_the_cause():
    same_second = "2026-01-01T00:00:01Z"
    changes = {
        "j-0-1": {"phase": "Failed", "ready": False, "exit_code": 134, "finished": same_second},
        "j-1-0": {"phase": "Failed", "ready": False, "exit_code": 75, "finished": same_second},
        "j-1-1": {"phase": "Failed", "ready": False, "exit_code": 1, "finished": same_second},
    }
    state = gang(*all_running(**changes))
    assert state.failure is not None
    assert (state.failure.pod, state.failure.exit_code) == ("j-1-1", 1)
    earlier = {**changes, "j-0-1": {**changes["j-0-1"], "finished": "2026-01-01T00:00:00Z"}}
    assert gang(*all_running(**earlier)).failure.pod == "j-0-1"  # an earlier second wins


def test_worker_on_not_ready_node_is_node_loss():
    state = gang(*all_running(**{"j-0-1": {"node": "sick"}}), not_ready_nodes=frozenset({"sick"}))
    assert state.failure is not None
    assert (state.failure.reason, state.failure.pod) == ("NodeLost", "j-0-1")


def test_deleted_and_vanished_workers():
    deleting = {"j-0-1": {"deletion_deadline": "2026-01-01T00:00:30Z"}}
    assert gang(*all_running(**deleting)).failure.reason == "PodDeleted"
    present = [p for p in all_running() if p.name != "j-1-0"]
    # slice 1 had all its pods once: a missing pod is a failure, not one to create
    vanished = gang(*present, created_slices=frozenset({1}))
    assert vanished.outcome == "Failed" and vanished.failure.pod == "j-1-0"
    # before that, it is simply still to be created
    assert gang(*present).to_create == [Member(1, 0, "j-1-0")]
    # a tombstone tells why it vanished
    tomb = pod("j-1-0", slice_index=1, disruption="DeletionByPodGC", phase="Running")
    state = gang(*present, created_slices=frozenset({1}), tombstones={"j-1-0": tomb})
    assert state.failure.reason == "NodeLost"


def test_pods_of_other_attempts_are_stale():
    old = pod("j-0-0", attempt=0)
    state = gang(old)
    assert state.stale == [old]
    assert len(state.to_create) == 4


def test_unschedulable_message_is_reported():
    changes = {
        "j-0-0": {
            "phase": "Pending",
            "ready": False,
            "node": None,
            "unschedulable": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
        }
    }
    state = gang(*all_running(**changes))
    assert state.unschedulable == (
        "j-0-0",
        "0/3 nodes are available: 3 Insufficient google.com/tpu.",
    )


def failure(reason="Failed", exit_code=1):
    return WorkerFailure(reason, f"worker {reason}", "p", "n", exit_code, None)


def test_decisions_follow_the_policy():
    policy = FailurePolicy(max_restarts=2)
    restart = decide(failure(), policy, 0)
    assert (restart.restart, restart.counted, restart.reason) == (True, True, "Failed")
    exhausted = decide(failure(), policy, 2)
    assert (exhausted.restart, exhausted.reason) == (False, Reason.MAX_RESTARTS_EXCEEDED)
    disrupted = decide(failure("Evicted", None), policy, 2)
    assert (disrupted.restart, disrupted.counted) == (True, False)
    counted = decide(failure("NodeLost", None), FailurePolicy(count_disruptions=True), 0)
    assert counted.counted
    rules = FailurePolicy(
        rules=[
            ExitCodeRule(action="FailJob", values=[42]),
            ExitCodeRule(action="RestartNotCounted", operator="NotIn", values=[1, 42]),
        ]
    )
    assert decide(failure(exit_code=42), rules, 0).reason == Reason.FATAL_EXIT_CODE
    assert decide(failure(exit_code=75), rules, 0).counted is False
    assert decide(failure(exit_code=1), rules, 0).counted is True


def test_backoff_doubles_up_to_the_cap():
    policy = FailurePolicy(backoff_seconds=10, max_backoff_seconds=60)
    assert [backoff_seconds(policy, n) for n in range(1, 6)] == [10, 20, 40, 60, 60]
    assert backoff_seconds(FailurePolicy(backoff_seconds=0), 3) == 0


V5P_16 = catalog.from_short_type("v5p-16")


def pools(*specs):
    return {
        name: PoolView(name, accel, topo, nodes=n, ready=n, spot=spot)
        for name, accel, topo, n, spot in specs
    }


def test_allocation_is_all_or_nothing_and_exclusive():
    available = pools(
        ("a", "tpu-v5p-slice", "2x2x2", 2, False),
        ("b", "tpu-v5p-slice", "2x2x2", 2, False),
        ("c", "tpu-v5p-slice", "2x2x2", 2, True),
    )
    two = allocate([Request(V5P_16), Request(V5P_16)], available, held={})
    assert two.pools == ["a", "b"]
    blocked = allocate([Request(V5P_16), Request(V5P_16)], available, held={"a": "ml/other"})
    assert blocked.pools == ["b", "c"]
    none = allocate(
        [Request(V5P_16, spot=False), Request(V5P_16, spot=False)],
        available,
        held={"a": "ml/other"},
    )
    assert none.pools is None
    assert "a is held by ml/other" in none.message and "c is spot" in none.message


def test_allocation_explains_missing_shapes_and_honours_pins():
    available = pools(("small", "tpu-v5-lite-podslice", "2x4", 2, False))
    result = allocate([Request(V5P_16)], available, held={})
    assert result.pools is None
    assert "no node pool has that shape; the pools are tpu-v5-lite-podslice 2x4" in result.message
    pinned = allocate([Request(V5P_16, pinned="future-pool")], available, held={})
    assert pinned.pools == ["future-pool"]
    taken = allocate([Request(V5P_16, pinned="x")], available, held={"x": "ml/j"})
    assert taken.pools is None and "held by ml/j" in taken.message


def test_views_from_api_objects():
    body = {
        "metadata": {
            "name": "j-0-1",
            "namespace": "ml",
            "uid": "u",
            "labels": {
                "tpu-operator.dev/slice-name": "j-0",
                "tpu-operator.dev/job-name": "j",
                "tpu-operator.dev/slice-index": "0",
                "tpu-operator.dev/worker-index": "1",
                "tpu-operator.dev/restart-attempt": "3",
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
            "containerStatuses": [
                {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "worker",
                    "state": {
                        "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "t"}
                    },
                },
            ],
        },
    }
    view = pod_view(body)
    assert view is not None
    assert (view.attempt, view.worker_index, view.exit_code, view.exit_reason) == (
        3,
        1,
        137,
        "OOMKilled",
    )
    assert view.disruption == "PreemptionByScheduler"
    assert pod_view({"metadata": {"name": "other"}}) is None
    node = node_view(
        {
            "metadata": {
                "name": "n1",
                "labels": {
                    "cloud.google.com/gke-nodepool": "p",
                    "cloud.google.com/gke-tpu-accelerator": "tpu7x",
                },
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": {"google.com/tpu": "4"},
            },
        }
    )
    assert (node.pool, node.ready, node.tpu_chips) == ("p", True, 4)


@pytest.mark.parametrize(
    ("changes", "ends"),
    [
        ({}, False),
        ({"ready": False}, False),  # not ready yet (or a failing probe): no failure
        ({"phase": "Pending", "ready": False, "node": None}, False),
        ({"unschedulable": "0/3 nodes are available"}, False),
        ({"phase": "Failed", "exit_code": 1}, True),
        ({"worker_exit": 1}, True),  # the worker exited; the phase is still Running
        ({"phase": "Succeeded", "exit_code": 0}, True),
        ({"deletion_deadline": "2026-11-23T00:00:00Z"}, True),
        ({"disruption": "PreemptionByScheduler"}, True),
        (
            {
                "supervised": True,
                "ready": False,
                "worker_started": "2026-11-23T00:00:00Z",
                "not_ready_since": "2026-11-23T00:01:00Z",
            },
            True,
        ),
    ],
)
def test_an_event_that_may_end_the_attempt_is_told_from_one_that_cannot(changes, ends):
    """Such events are not held back by a large job's pacing; every failure the gang's
    assessment finds on a pod's own state must be among them."""
    view = pod("j-0-0", **changes)
    assert may_end_attempt(view) is ends
    if gang(view).failure is not None:
        assert may_end_attempt(view)
