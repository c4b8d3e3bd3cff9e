"""A job's gang assessment, slice by slice, each slice's part kept until its inputs change.

Every reconcile of a TPUJob assesses the attempt over all of its pods
(``state/gang.assess``): about 5 us a pod, 65 ms for a 12,736-pod job. While such a job
starts or restarts it is reconciled a few hundred times (``reconcile/pacing.py``), so
that walk made the operator's CPU per pod grow with the size of the job (bench/HISTORY.md,
entries d162dfa and 34bcfd9). Here the job's state is the sum of its slices'
(``gang.combine``), and a slice's part is worked out again only when something it is
computed from changed:

- its pods: the pod store numbers every change under a slice (``Store.version``);
- the TPU nodes: any node event (``Caches.nodes_version``; a pod on a node that is not
  Ready or gone has failed);
- its tombstones (pods deleted while no reconcile saw them go);
- the attempt, the number of hosts, whether the slice has created its pods.

A reconcile then costs the slices whose pods had events since the last one, plus a
lookup per slice. Supervisors' reports (a training process stopped) are rare and short
lived: while there are any, every part is worked out afresh and none is kept.

The parts are kept only while the job runs an attempt; a finished, suspended or deleted
job's are dropped (``forget``), so nothing holds a view of a pod that is gone for long.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpu_operator import contract
from tpu_operator.runtime.caches import Caches
from tpu_operator.state.gang import (
    GangState,
    ProcessReport,
    SuccessPolicy,
    assess,
    combine,
    members_of,
    nodes_of,
    stopping_count,
)

PartKey = tuple[int, int, bool, int, int, int]
"""(attempt, hosts (0: a dropped slice), slice created, pods' version, nodes' version,
tombstones' version)"""


@dataclass(frozen=True, slots=True)
class SlicePart:
    """One slice's share of its job's assessment, and what it was computed from."""

    key: PartKey
    state: GangState
    pods: int
    """The job's pods filed under this slice, of any attempt."""
    stopping: tuple[int, int]
    """(active, terminating) among them (``state.gang.stopping_count``)."""


@dataclass(frozen=True, slots=True)
class JobGang:
    """A job's assessment and its pods' stopping counts, from its slices' parts."""

    state: GangState
    active_pods: int
    terminating_pods: int
    recomputed: int
    """Slices whose part was worked out in this reconcile (the rest were kept)."""


class GangParts:
    """Slice parts of the jobs that run an attempt, by job."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], dict[int, SlicePart]] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def forget(self, namespace: str, job: str) -> None:
        self._jobs.pop((namespace, job), None)

    def assess(
        self,
        caches: Caches,
        *,
        namespace: str,
        job: str,
        attempt: int,
        num_slices: int,
        hosts: int,
        created: frozenset[int],
        success_policy: SuccessPolicy,
        reports: Mapping[str, ProcessReport] | None = None,
        dropped: frozenset[int] = frozenset(),
    ) -> JobGang | None:
        """The job's gang state for ``attempt``; None when it cannot be had by slices: a
        pod of the job is filed under none of its ``num_slices`` slices (the spec lost
        slices), or the pod cache keeps no versions (unit tests' plain indexes). The
        caller then assesses every pod of the job at once. ``dropped``: slices the
        attempt runs without (elastic): they have no members, only stale pods."""
        kept = self._jobs.setdefault((namespace, job), {})
        for index in [i for i in kept if i >= num_slices]:
            del kept[index]
        nodes = caches.nodes_version
        leader = min((i for i in range(num_slices) if i not in dropped), default=0)
        parts: list[SlicePart] = []
        pods_seen = recomputed = 0
        for index in range(num_slices):
            name = contract.slice_name(job, index)
            version = caches.pods_version(namespace, name)
            if version is None:
                self.forget(namespace, job)
                return None
            key: PartKey = (
                attempt,
                0 if index in dropped else hosts,
                index in created,
                version,
                nodes,
                caches.tombstones.version(namespace, name),
            )
            part = kept.get(index)
            if part is None or part.key != key or reports:
                part = _part(
                    caches, key, namespace, job, name, index, success_policy, reports, leader
                )
                recomputed += 1
                if not reports:
                    kept[index] = part
            parts.append(part)
            pods_seen += part.pods
        if pods_seen != caches.count_pods_of_job(namespace, job):
            self.forget(namespace, job)
            return None
        return JobGang(
            state=combine(attempt, (p.state for p in parts), success_policy),
            active_pods=sum(p.stopping[0] for p in parts),
            terminating_pods=sum(p.stopping[1] for p in parts),
            recomputed=recomputed,
        )


def _part(
    caches: Caches,
    key: PartKey,
    namespace: str,
    job: str,
    name: str,
    index: int,
    success_policy: SuccessPolicy,
    reports: Mapping[str, ProcessReport] | None,
    leader_slice: int = 0,
) -> SlicePart:
    attempt, hosts, created = key[0], key[1], key[2]
    pods = [p for p in caches.pods_of_slice(namespace, name) if p.job_name == job]
    tombstones = caches.tombstones.of_slice(namespace, name, attempt)
    state = assess(
        attempt=attempt,
        members=members_of(name, index, hosts),
        pods=pods,
        created_slices=frozenset((index,)) if created else frozenset(),
        tombstones=tombstones,
        not_ready_nodes=caches.not_ready_nodes(nodes_of(pods, tombstones)),
        success_policy=success_policy,
        reports=reports,
        leader_slice=leader_slice,
    )
    return SlicePart(key, state, len(pods), stopping_count(pods))
