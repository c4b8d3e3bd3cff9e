"""Benchmark: a TPUJob's gang assessment per reconcile, every pod walked vs by slices.

Every reconcile of a running TPUJob assesses its attempt. Two ways, side by side in one
process over the same pod and node stores:

- ``walk``: what each job reconcile did before ``reconcile/gangs.py``: every member and
  every pod of the job assessed at once (``state/gang.assess``), the nodes of every pod
  looked up, every pod counted for ``activePods``/``terminatingPods``;
- ``by slices, k changed``: ``GangParts.assess``, with a pod of ``k`` slices changed
  since the last reconcile (the pod store's version of those slices moved; the others'
  parts are kept).

The stores hold one job of ``--sizes`` hosts in slices of 64 (v5litepod-256), each pod
Running on a Ready node of its own. Figures: microseconds per assessment (the best of
``--repeat`` rounds of ``--number`` assessments) and the ratio to the walk. How many
slices change between two reconciles depends on the cluster: the pacing of a large job
(``reconcile/pacing.py``) waits for events on 1/64 of its pods, so between two reconciles
of a starting 12,736-host job some 200 pods moved, in at most 199 slices.

    .venv/bin/python bench/job_assess.py [--sizes 1024 4096 12736]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import micro

from tpu_operator import contract
from tpu_operator.reconcile.gangs import GangParts
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.listwatch import NODES, PODS, Store
from tpu_operator.state.gang import assess, members_of, nodes_of, stopping_count
from tpu_operator.state.views import PodView, node_view

NAMESPACE, JOB, HOSTS_PER_SLICE, ATTEMPT = "bench", "big", 64, 1


def worker(index: int) -> PodView:
    slice_index, w = divmod(index, HOSTS_PER_SLICE)
    slice_name = contract.slice_name(JOB, slice_index)
    return PodView(
        name=contract.pod_name(slice_name, w),
        namespace=NAMESPACE,
        uid=f"uid-{index}",
        job_name=JOB,
        slice_name=slice_name,
        slice_index=slice_index,
        worker_index=w,
        attempt=ATTEMPT,
        phase="Running",
        ready=True,
        deletion_deadline=None,
        node=f"node-{index}",
        pool=f"pool-{slice_index}",
        pod_ip="10.0.0.1",
        exit_code=None,
        exit_reason=None,
        disruption=None,
        unschedulable=None,
        created="2026-01-01T00:00:00Z",
        started="2026-01-01T00:00:01Z",
        finished=None,
    )


def filled(hosts: int) -> tuple[Caches, Store, list[PodView]]:
    pods, nodes = PODS.store(), NODES.store()
    views = [worker(i) for i in range(hosts)]
    for index, view in enumerate(views):
        pods.put((NAMESPACE, view.name, view.uid), view)
        node = node_view(
            {
                "metadata": {
                    "name": f"node-{index}",
                    "uid": f"node-uid-{index}",
                    "labels": {contract.NODE_LABEL_ACCELERATOR: "tpu-v5-lite-podslice"},
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
        nodes.put((None, node.name, f"node-uid-{index}"), node)
    return Caches(pods=pods, slices={}, jobs={}, nodes=nodes), pods, views


def walk(caches: Caches, slices: int) -> tuple[int, int]:
    members = [
        m
        for i in range(slices)
        for m in members_of(contract.slice_name(JOB, i), i, HOSTS_PER_SLICE)
    ]
    tombstones: dict[str, PodView] = {}
    for i in range(slices):
        tombstones.update(
            caches.tombstones.of_slice(NAMESPACE, contract.slice_name(JOB, i), ATTEMPT)
        )
    pods = caches.pods_of_job(NAMESPACE, JOB)
    state = assess(
        attempt=ATTEMPT,
        members=members,
        pods=pods,
        created_slices=frozenset(range(slices)),
        tombstones=tombstones,
        not_ready_nodes=caches.not_ready_nodes(nodes_of(pods, tombstones)),
    )
    assert state.outcome == "Running"
    return stopping_count(pods)


def by_slices(caches: Caches, parts: GangParts, slices: int) -> tuple[int, int]:
    gang = parts.assess(
        caches,
        namespace=NAMESPACE,
        job=JOB,
        attempt=ATTEMPT,
        num_slices=slices,
        hosts=HOSTS_PER_SLICE,
        created=frozenset(range(slices)),
        success_policy="AllWorkers",
    )
    assert gang is not None and gang.state.outcome == "Running"
    return gang.active_pods, gang.terminating_pods


def measure(hosts: int, number: int, repeat: int) -> str:
    """One table row: the walk and the assessment by slices, side by side."""
    caches, pods, views = filled(hosts)
    slices = hosts // HOSTS_PER_SLICE
    parts = GangParts()
    assert by_slices(caches, parts, slices) == walk(caches, slices) == (hosts, 0)

    def touch(changed: int) -> Callable[[int], None]:
        """Before each assessment: a changed pod in each of ``changed`` slices (its
        readiness's last transition moved; it stays Ready)."""

        def change(turn: int) -> None:
            for s in range(changed):
                view = views[s * HOSTS_PER_SLICE]
                pods.put((NAMESPACE, view.name, view.uid), replace(view, not_ready_since=str(turn)))

        return change

    slow = micro.best_us(lambda _: walk(caches, slices), number, repeat, touch(0))
    figures = []
    for changed in (0, 1, max(1, slices // 4), slices):
        fast = micro.best_us(
            lambda _: by_slices(caches, parts, slices), number, repeat, touch(changed)
        )
        figures.append(f"{fast:,.0f} ({fast / slow:.3f})")
    return f"| {hosts:,} | {slow:,.0f} | {' / '.join(figures)} |"


def main() -> None:
    micro.table(
        __doc__,
        ["hosts", "walk, us", "by slices, us (/ walk): 0 / 1 / a quarter / all slices changed"],
        measure,
        sizes=[1024, 4096, 12736],
        number=20,
    )


if __name__ == "__main__":
    main()
