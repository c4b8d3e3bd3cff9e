"""How a gang restart brings up the next attempt, slice by slice (``decisions.restart_kind``)
and when a mixed restart may start the processes it keeps (``supervisors.recreated_ready``):
pure, table-driven."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_gang import pod
from tpu_operator.api.status import Reason, RestartKind
from tpu_operator.decisions import restart_kind
from tpu_operator.reconcile.supervisors import recreated_ready
from tpu_operator.state.gang import WorkerFailure
from tpu_operator.state.views import PodView

pytestmark = pytest.mark.unit

SLICES, HOSTS = 3, 2


def gang(attempt: int = 1, **changes: dict) -> list[PodView]:
    """A supervised 3-slice, 2-host gang, every pod Running; ``changes`` by pod name
    (``None``: the pod is missing)."""
    pods = []
    for s in range(SLICES):
        for w in range(HOSTS):
            name = f"j-{s}-{w}"
            if name in changes and changes[name] is None:
                continue
            view = pod(name, slice_index=s, worker=w, attempt=attempt, node=f"n{s}{w}")
            pods.append(replace(view, **{"supervised": True, **(changes.get(name) or {})}))
    return pods


def failed(reason: Reason, pod_name: str = "j-1-0") -> WorkerFailure:
    return WorkerFailure(reason, f"{reason} on {pod_name}", pod_name, None, 1, None)


@pytest.mark.parametrize(
    ("failure", "changes", "not_ready", "kind", "recreate", "why"),
    [
        # Only a training process stopped (or hung): every slice in place.
        (failed(Reason.WORKER_FAILED), {}, (), RestartKind.IN_PLACE, [], "only training"),
        (failed(Reason.STALLED), {}, (), RestartKind.IN_PLACE, [], "only training"),
        # A pod lost, evicted or on a lost node: its slice recreated, the others in place.
        (
            failed(Reason.EVICTED),
            {"j-1-0": {"deletion_deadline": "2026-01-01T00:00:00Z", "disruption": "Preempted"}},
            (),
            RestartKind.MIXED,
            [1],
            "slice 1 recreated (slice 1: pod j-1-0 is being deleted), slices 0, 2 in place",
        ),
        (
            failed(Reason.POD_DELETED),
            {"j-1-0": None},
            (),
            RestartKind.MIXED,
            [1],
            "slice 1: 1 of its 2 pods exist",
        ),
        (
            failed(Reason.NODE_LOST, "j-2-1"),
            {},
            ("n21",),
            RestartKind.MIXED,
            [2],
            "slice 2: pod j-2-1 is on node n21, which is not ready",
        ),
        # The failure names a pod whose slice still looks whole: that slice is recreated.
        (
            failed(Reason.NODE_LOST, "j-0-1"),
            {},
            (),
            RestartKind.MIXED,
            [0],
            "slice 0: pod j-0-1: NodeLost",
        ),
        # A dead container in one slice (the supervisor is gone with it).
        (
            failed(Reason.WORKER_FAILED),
            {"j-0-0": {"worker_exit": 1}},
            (),
            RestartKind.MIXED,
            [0],
            "pod j-0-0 has no running worker container",
        ),
        # Two slices touched, one kept.
        (
            failed(Reason.EVICTED, "j-0-0"),
            {"j-0-0": {"disruption": "Preempted"}, "j-2-1": None},
            (),
            RestartKind.MIXED,
            [0, 2],
            "slices 0, 2 recreated",
        ),
        # Every slice touched: every pod recreated.
        (
            failed(Reason.WORKER_FAILED),
            {"j-0-0": {"phase": "Failed"}, "j-1-0": None, "j-2-0": {"supervised": False}},
            (),
            RestartKind.RECREATE,
            [],
            "pod j-0-0 has no running worker container",
        ),
        (
            failed(Reason.NODE_LOST, "j-9-9"),
            {},
            (),
            RestartKind.RECREATE,
            [],
            "a pod or its node is gone (NodeLost)",
        ),
        # An in-place restart that failed is never retried in place.
        (
            failed(Reason.SUPERVISOR_UNREACHABLE),
            {},
            (),
            RestartKind.RECREATE,
            [],
            "the in-place restart failed",
        ),
        (failed(Reason.IN_PLACE_TIMEOUT), {}, (), RestartKind.RECREATE, [], "in-place restart"),
    ],
)
def test_restart_kind_by_slice(failure, changes, not_ready, kind, recreate, why):
    choice = restart_kind(
        supervised=True,
        mode="Auto",
        failure=failure,
        pods=gang(**changes),
        num_slices=SLICES,
        hosts=HOSTS,
        not_ready_nodes=frozenset(not_ready),
    )
    assert (choice.kind, sorted(choice.recreate)) == (kind, recreate), choice.why
    assert why in choice.why


@pytest.mark.parametrize(
    ("supervised", "mode", "refused", "why"),
    [
        (False, "Recreate", None, "failurePolicy.restartMode is Recreate"),
        (False, "Auto", None, "the worker container does not run tpu-worker"),
        (False, "Auto", "hostNetwork pods", "hostNetwork pods"),
    ],
)
def test_unsupervised_pods_are_all_recreated(supervised, mode, refused, why):
    choice = restart_kind(
        supervised=supervised,
        mode=mode,
        refused=refused,
        failure=failed(Reason.EVICTED),
        pods=gang(**{"j-1-0": None}),
        num_slices=SLICES,
        hosts=HOSTS,
    )
    assert (choice.kind, choice.why, dict(choice.recreate)) == (RestartKind.RECREATE, why, {})


def test_a_single_slice_job_never_restarts_mixed():
    pods = [
        replace(pod(f"j-0-{w}", worker=w), supervised=True, disruption="Preempted" if w else None)
        for w in range(2)
    ]
    choice = restart_kind(
        supervised=True,
        mode="Auto",
        failure=failed(Reason.EVICTED, "j-0-1"),
        pods=pods,
        num_slices=1,
        hosts=2,
    )
    assert choice.kind == RestartKind.RECREATE
    assert choice.why == "a pod or its node is gone (Evicted)"


def test_a_message_names_at_most_eight_slices():
    pods = [
        replace(pod(f"j-{s}-0", slice_index=s), supervised=True, worker_exit=1 if s < 12 else None)
        for s in range(20)
    ]
    choice = restart_kind(
        supervised=True,
        mode="Auto",
        failure=failed(Reason.WORKER_FAILED, "j-0-0"),
        pods=pods,
        num_slices=20,
        hosts=1,
    )
    assert choice.kind == RestartKind.MIXED and len(choice.recreate) == 12
    assert "slices 0, 1, 2, 3, 4, 5, 6, 7 and 4 more recreated" in choice.why
    assert choice.why.count("slice ") < 20


@pytest.mark.parametrize(
    ("recreated", "pods", "ready"),
    [
        # Nothing recreated (an in-place restart): nothing to wait for.
        (frozenset(), gang(attempt=1), True),
        # A pod of the old attempt is left in a recreated slice.
        (frozenset({1}), gang(attempt=1), False),
        # The new pods exist, one is not running yet.
        (
            frozenset({1}),
            [p for p in gang(attempt=2) if p.slice_index == 1][:1]
            + [replace(p, phase="Pending") for p in gang(attempt=2) if p.name == "j-1-1"],
            False,
        ),
        # Only one of the two hosts exists.
        (frozenset({1}), [p for p in gang(attempt=2) if p.name == "j-1-0"], False),
        # Every pod of every recreated slice runs the new attempt.
        (frozenset({1, 2}), gang(attempt=2), True),
        # One has no IP yet (its supervisor cannot be reached).
        (
            frozenset({2}),
            [replace(p, pod_ip=None) if p.name == "j-2-0" else p for p in gang(attempt=2)],
            False,
        ),
    ],
)
def test_a_mixed_restart_starts_once_the_recreated_slices_run(recreated, pods, ready):
    assert recreated_ready(pods, recreated, 2, HOSTS) is ready
