"""A job's assessment slice by slice (``reconcile/gangs.py``): the same state as over all
of its pods at once, and a slice's part worked out again only when its inputs change."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_gang import pod
from tpu_operator import contract
from tpu_operator.reconcile.gangs import GangParts
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.listwatch import NODES, PODS
from tpu_operator.state.gang import ProcessReport, assess, members_of, nodes_of, stopping_count
from tpu_operator.state.views import PodView, node_view

pytestmark = pytest.mark.unit

NS, JOB = "ml", "j"


def worker(slice_index: int, w: int, attempt: int = 1, **changes: Any) -> PodView:
    name = contract.pod_name(contract.slice_name(JOB, slice_index), w)
    assert name == f"{JOB}-{slice_index}-{w}"  # as test_gang's pods are named
    changes.setdefault("node", f"n-{slice_index}-{w}")
    return pod(name, slice_index=slice_index, worker=w, attempt=attempt, **changes)


def node(name: str, ready: bool = True) -> Any:
    return node_view(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "labels": {contract.NODE_LABEL_ACCELERATOR: "tpu-v5-lite-podslice"},
            },
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
        }
    )


def cluster(slices: int, hosts: int) -> tuple[Caches, Any, Any]:
    pods, nodes = PODS.store(), NODES.store()
    for s in range(slices):
        for w in range(hosts):
            view = node(f"n-{s}-{w}")
            nodes.put((None, view.name, f"uid-{view.name}"), view)
    return Caches(pods=pods, slices={}, jobs={}, nodes=nodes), pods, nodes


def put(pods: Any, view: PodView) -> None:
    pods.put((NS, view.name, view.uid), view)


def by_slices(caches: Caches, parts: GangParts, slices: int, hosts: int, **kw: Any) -> Any:
    return parts.assess(
        caches,
        namespace=NS,
        job=JOB,
        attempt=kw.pop("attempt", 1),
        num_slices=slices,
        hosts=hosts,
        created=kw.pop("created", frozenset(range(slices))),
        success_policy=kw.pop("success_policy", "AllWorkers"),
        **kw,
    )


# One pod per member at most, drawn from what a worker can be doing.
PHASES = st.sampled_from(
    [
        {},
        {"ready": False, "phase": "Pending"},
        {"ready": False, "phase": "Pending", "unschedulable": "0/4 nodes are available"},
        {"phase": "Succeeded", "ready": False, "exit_code": 0, "finished": "2026-01-01T00:00:05Z"},
        {"phase": "Failed", "ready": False, "exit_code": 1, "finished": "2026-01-01T00:00:04Z"},
        {"phase": "Failed", "ready": False, "exit_code": 75, "finished": "2026-01-01T00:00:04Z"},
        {"disruption": "PreemptionByScheduler", "finished": "2026-01-01T00:00:06Z"},
        {"deletion_deadline": "2026-01-01T00:01:00Z"},
        {"node": "gone-node"},
        {"node": "sick-node"},
        {"attempt": 0},
        {"attempt": 0, "deletion_deadline": "2026-01-01T00:01:00Z"},
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    slices=st.integers(1, 3),
    hosts=st.integers(1, 3),
    data=st.data(),
    policy=st.sampled_from(["AllWorkers", "LeaderWorker"]),
)
def test_by_slices_is_the_assessment_over_every_pod(
    slices: int, hosts: int, data: st.DataObject, policy: Any
) -> None:
    caches, pods, nodes = cluster(slices, hosts)
    sick = node("sick-node", ready=False)
    nodes.put((None, sick.name, "uid-sick"), sick)
    created = frozenset(data.draw(st.sets(st.integers(0, slices - 1))))
    for s in range(slices):
        for w in range(hosts):
            choice = data.draw(st.sampled_from(["absent", "tombstone", "pod"]))
            if choice == "absent":
                continue
            view = worker(s, w, **data.draw(PHASES))
            if choice == "tombstone":
                caches.tombstones.record(view)
            else:
                put(pods, view)
    everything = caches.pods_of_job(NS, JOB)
    tombstones: dict[str, PodView] = {}
    for s in range(slices):
        tombstones.update(caches.tombstones.of_slice(NS, contract.slice_name(JOB, s), 1))
    whole = assess(
        attempt=1,
        members=[
            m for s in range(slices) for m in members_of(contract.slice_name(JOB, s), s, hosts)
        ],
        pods=everything,
        created_slices=created,
        tombstones=tombstones,
        not_ready_nodes=caches.not_ready_nodes(nodes_of(everything, tombstones)),
        success_policy=policy,
    )
    gang = by_slices(caches, GangParts(), slices, hosts, created=created, success_policy=policy)
    assert gang is not None
    part = gang.state
    assert (part.outcome, part.total, part.ready, part.succeeded) == (
        whole.outcome,
        whole.total,
        whole.ready,
        whole.succeeded,
    )
    assert part.failure == whole.failure
    assert part.unschedulable == whole.unschedulable
    assert part.to_create == whole.to_create
    assert sorted(p.name for p in part.stale) == sorted(p.name for p in whole.stale)
    assert sorted(p.name for p in part.active) == sorted(p.name for p in whole.active)
    assert part.slices == whole.slices
    assert (gang.active_pods, gang.terminating_pods) == stopping_count(everything)


def test_a_part_is_worked_out_again_only_when_its_inputs_change() -> None:
    caches, pods, nodes = cluster(3, 2)
    for s in range(3):
        for w in range(2):
            put(pods, worker(s, w, ready=False, phase="Pending"))
    parts = GangParts()
    first = by_slices(caches, parts, 3, 2)
    assert first is not None and first.recomputed == 3 and first.state.outcome == "Starting"
    again = by_slices(caches, parts, 3, 2)
    assert again is not None and again.recomputed == 0 and again.state.ready == 0

    put(pods, worker(1, 0))  # one pod of slice 1 turns ready
    moved = by_slices(caches, parts, 3, 2)
    assert moved is not None and moved.recomputed == 1 and moved.state.ready == 1

    caches.tombstones.record(worker(2, 1, phase="Pending", ready=False))  # slice 2's
    tomb = by_slices(caches, parts, 3, 2)
    assert tomb is not None and tomb.recomputed == 1

    sick = node("n-0-0", ready=False)  # any node event: every part again
    nodes.put((None, sick.name, f"uid-{sick.name}"), sick)
    caches.nodes_changed()
    lost = by_slices(caches, parts, 3, 2)
    assert lost is not None and lost.recomputed == 3
    assert lost.state.outcome == "Failed" and lost.state.failure is not None
    assert lost.state.failure.reason == "NodeLost"

    restarted = by_slices(caches, parts, 3, 2, attempt=2, created=frozenset())
    assert restarted is not None and restarted.recomputed == 3
    assert len(restarted.state.stale) == 6 and restarted.state.outcome == "Creating"


def test_pods_outside_the_slices_or_a_cache_without_versions_walk_every_pod() -> None:
    caches, pods, _ = cluster(2, 2)
    for s in range(2):
        for w in range(2):
            put(pods, worker(s, w))
    parts = GangParts()
    assert by_slices(caches, parts, 2, 2) is not None
    # numSlices lowered to 1 while slice 1's pods still exist: the walk sees them.
    assert by_slices(caches, parts, 1, 2) is None
    assert len(parts) == 0, "a job that cannot be assessed by slices keeps no parts"
    plain = Caches(pods={}, slices={}, jobs={}, nodes={})
    assert by_slices(plain, parts, 1, 2) is None


def test_reports_are_never_kept() -> None:
    caches, pods, _ = cluster(1, 2)
    for w in range(2):
        put(pods, worker(0, w))
    parts = GangParts()
    report = {contract.pod_name(contract.slice_name(JOB, 0), 0): ProcessReport(attempt=1)}
    assert by_slices(caches, parts, 1, 2, reports=report).recomputed == 1
    assert by_slices(caches, parts, 1, 2).recomputed == 1, "the part with reports was not kept"
    assert by_slices(caches, parts, 1, 2).recomputed == 0
