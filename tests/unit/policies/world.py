"""What the policies' table tests build on: a job's facts, its plan, and a world of
plain values (``policies/plan.World``) that records what the policies asked of it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.unit.fakeapi import T0
from tpu_operator.api.job import TPUJobSpec
from tpu_operator.api.policy import Placement
from tpu_operator.placement.pools import Allocation, PoolGone, Request
from tpu_operator.policies.plan import JobFacts, Plan, SliceRefusal
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.state.views import PodView


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stamp_at(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Recorded:
    restarts: list[tuple[str, str]] = field(default_factory=list)
    running_after: list[float] = field(default_factory=list)
    waits: list[tuple[str, float]] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)

    def pod_created(self, seconds: float) -> None:
        pass

    def restart(self, kind: str, reason: str) -> None:
        self.restarts.append((kind, reason))

    def time_to_running(self, seconds: float) -> None:
        self.running_after.append(seconds)

    def waited(self, reason: str, seconds: float) -> None:
        self.waits.append((reason, seconds))

    def slice_moved(self, to: str) -> None:
        self.moves.append(to)


@dataclass
class World:
    """A cluster of plain values."""

    allocation: Allocation = field(default_factory=lambda: Allocation(["p1"]))
    gone: list[PoolGone] = field(default_factory=list)
    resolved: dict[int, str] = field(default_factory=dict)
    still_provisioning: list[str] = field(default_factory=list)
    not_ready: frozenset[str] = frozenset()
    unhealthy: dict[int, str] = field(default_factory=dict)
    noticed: dict[str, str] = field(default_factory=dict)
    terminating: dict[str, float] = field(default_factory=dict)
    on_node: dict[str, list[PodView]] = field(default_factory=dict)
    others: list[PodView] = field(default_factory=list)
    fallback: str | None = None
    started: bool = True
    """The in-place restart told every staying pod to start (``in_place_started``)."""
    conflict: str = ""
    refusal: SliceRefusal | None = None
    schedulers: dict[str, dt.datetime] = field(default_factory=dict)
    """When each scheduler last looked at a pod of the operator's."""
    metrics: Recorded = field(default_factory=Recorded)
    allocated: list[list[Request]] = field(default_factory=list)

    def allocate(self, requests: list[Request]) -> Allocation:
        self.allocated.append(requests)
        return self.allocation

    def claims(self, slices: int, renewal: int | None = None) -> list[str]:
        return [f"claim-{i}-{renewal}" for i in range(slices)]

    def resolve_claims(self, refs: list[str]) -> tuple[list[str], dict[int, str], list[str]]:
        out = [self.resolved.get(i, ref) for i, ref in enumerate(refs)]
        return out, self.resolved, self.still_provisioning

    def vanished_pools(
        self, refs: list[str], created: Iterable[int], placement: Placement | None
    ) -> list[PoolGone]:
        done = set(created)
        return [
            g
            for g in self.gone
            if g.index < len(refs)
            and refs[g.index] == g.pool
            and not (g.reclaim and g.index in done)
        ]

    def unhealthy_pools(self, refs: list[str]) -> dict[int, str]:
        return {i: why for i, why in self.unhealthy.items() if i < len(refs)}

    def not_ready_nodes(self, names: Iterable[str | None]) -> frozenset[str]:
        return frozenset(n for n in names if n in self.not_ready)

    def noticed_nodes(self) -> Mapping[str, str]:
        return self.noticed

    def terminating_nodes(self, before: float) -> Mapping[str, float]:
        return {n: when for n, when in self.terminating.items() if when < before}

    def pools_end(self, pools: list[str]) -> float | None:
        return min(self.terminating.values(), default=None)

    def pods_on_node(self, node: str) -> list[PodView]:
        return self.on_node.get(node, [])

    def others_on_pools(self, pools: list[str]) -> list[PodView]:
        return self.others

    def in_place_fallback(self, attempt: int) -> str | None:
        return self.fallback

    def in_place_started(self, attempt: int) -> bool:
        return self.started

    def service_conflict(self) -> str:
        return self.conflict

    def slice_refusal(self) -> SliceRefusal | None:
        return self.refusal

    def scheduler_looked_at(self, name: str) -> dt.datetime | None:
        return self.schedulers.get(name)


def spec(**fields: Any) -> dict[str, Any]:
    return {
        "slice": {"type": "v5p-16"},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        **fields,
    }


def facts(
    now: float = 100.0,
    *,
    recorded: dict[str, Any] | None = None,
    pods: list[PodView] | None = None,
    slices: dict[int, dict[str, Any]] | None = None,
    track: JobTrack | None = None,
    **fields: Any,
) -> JobFacts:
    raw = spec(**fields)
    model = TPUJobSpec.model_validate(raw)
    return JobFacts(
        namespace="ml",
        name="j",
        uid="u",
        generation=1,
        created=T0,
        now=at(now),
        spec=model,
        raw_spec=raw,
        shape=model.slice.resolve(),
        slices=slices or {},
        recorded=recorded or {},
        load_pods=lambda: list(pods or []),
        track=track,
    )


def plan_of(job: JobFacts) -> Plan:
    return Plan.of(job, publish_interval=30.0)


def reasons(plan: Plan) -> list[str]:
    return [reason for _, reason, _ in plan.events]
