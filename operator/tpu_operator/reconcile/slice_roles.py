"""The two kinds of TPUSlice one ``SliceRun`` reconciles, and all that differs between them.

A job's child (``OwnedSlice``) only reports: its TPUJob decides its attempt
(``spec.attempt``, ``spec.notBefore``), chose its pool, owns the headless Service (and
reports a conflict over it), and carries pods into a new attempt in place, started by the
job's supervisors. A standalone TPUSlice (``StandaloneSlice``) is its own job of one
slice: its attempt is the one its status records (``policies/standalone.py``), it
allocates its own pool (or resolves the pool GKE created for its claim), makes its own
headless Service, and its pods carry its own name as job and slice name.

``role_of`` chooses the role once per reconcile; ``SliceRun`` asks it through the methods
of ``SliceRole`` and branches on the kind of slice nowhere else. A role reads the
reconcile's inputs and returns what it decided (a pool, a wait, a requeue); it writes no
attribute of the run.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tpu_operator import contract
from tpu_operator.api.conditions import parse
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceSpec, TPUSliceStatus
from tpu_operator.api.status import Phase
from tpu_operator.builders.pods import Owner
from tpu_operator.builders.service import headless_service
from tpu_operator.builders.wiring import Ports
from tpu_operator.catalog import SliceShape
from tpu_operator.placement.pools import requests_for
from tpu_operator.placement.provisioning import is_claim
from tpu_operator.policies import standalone
from tpu_operator.policies.standalone import Ending
from tpu_operator.policies.start import POOL_RETRY_SECONDS
from tpu_operator.reconcile.context import Context
from tpu_operator.reconcile.pools import (
    choose_pools,
    job_holder,
    machine_for,
    resolve_claims,
    slice_holder,
    slice_pool_values,
)
from tpu_operator.runtime.ownership import owned_by, slice_job_name
from tpu_operator.state.gang import WorkerFailure
from tpu_operator.state.views import PodView


def ports_of(spec: TPUSliceSpec) -> Ports:
    ports = spec.ports
    if ports is None:
        return Ports()
    return Ports(coordinator=ports.coordinator, megascale=ports.megascale, metrics=ports.metrics)


@dataclass(frozen=True)
class SlicePool:
    """The node pool a slice's pods go to in this reconcile."""

    name: str | None
    """The pool (or a claim GKE has not resolved yet); None: none."""
    waiting_for: str = ""
    """Why the slice has no pool yet (no free pool fits): its pods wait."""
    retry_after: float | None = None
    """When to look for a pool again (s)."""


class SliceRole(ABC):
    """What differs between a job's slice and a standalone one (``OwnedSlice``,
    ``StandaloneSlice``); the rest of a slice's reconcile is the same for both."""

    standalone: bool
    """The slice is its own job (``policies/slice_phase.py``'s one differing rung)."""
    reports_pool_when_stopping: bool
    """Its status keeps naming its pool while it stops."""
    posts_job_events: bool
    """It posts the events a job posts of its own course (resumed, waiting for node
    pools); a job's slice leaves them to its job."""

    def __init__(
        self, ctx: Context, body: dict[str, Any], spec: TPUSliceSpec, shape: SliceShape
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.spec = spec
        self.shape = shape
        meta = body["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]

    @property
    @abstractmethod
    def needs_pool(self) -> bool:
        """Its pods wait for a node pool before they are created."""

    @property
    @abstractmethod
    def job_name(self) -> str:
        """The job name its pods carry (their gang)."""

    @property
    @abstractmethod
    def pool_holder(self) -> str:
        """Who holds the pool its pods are created on (``reconcile/pools.py``)."""

    @property
    @abstractmethod
    def pod_slice_names(self) -> tuple[str, ...]:
        """``PodWiring.slice_names``: empty for the job's naming of its slices."""

    @property
    @abstractmethod
    def in_place_from(self) -> int | None:
        """The first attempt whose pods a new attempt carries in place (None: none)."""

    @property
    @abstractmethod
    def control_secret(self) -> str | None:
        """The Secret of the key its pods' supervisors take commands with (None: its
        pods run unsupervised)."""

    @abstractmethod
    def target_and_not_before(self, status: TPUSliceStatus) -> tuple[int, dt.datetime | None]:
        """The attempt the slice runs, and the time before which it creates no pod."""

    @abstractmethod
    def finished(self, phase: str) -> bool:
        """Whether a slice in ``phase`` is finished: it keeps its phase, stops its pods and
        creates none."""

    @abstractmethod
    def attempt_failed(
        self, status: TPUSliceStatus, failure: WorkerFailure, attempt: int, now: dt.datetime
    ) -> Ending:
        """``attempt`` failed with ``failure`` (``slice_phase``'s ``ended``): whether it
        restarts (``status`` is updated in place)."""

    @abstractmethod
    def gang_attempts(self, pods: list[PodView]) -> Collection[int]:
        """The attempts of the pods of its gang (``pods``: the slice's own), each once: no
        pod of a new attempt is created while one of an older attempt is left."""

    @abstractmethod
    def pool(self, status: TPUSliceStatus, stopping: bool) -> SlicePool:
        """The node pool its pods go to."""

    @abstractmethod
    def service_conflict(self) -> str:
        """Why the headless Service it makes belongs to another object ("": it does not,
        or it makes none)."""

    @abstractmethod
    async def ensure_service(self, ports: Ports) -> bool:
        """Make its headless Service unless it exists. True: what ``service_conflict``
        says changed (the next status says it)."""


class OwnedSlice(SliceRole):
    """A TPUJob's slice: its job decides, places, serves and restarts it in place."""

    standalone = False
    reports_pool_when_stopping = True  # the pool its job chose
    posts_job_events = False

    def __init__(
        self,
        ctx: Context,
        body: dict[str, Any],
        spec: TPUSliceSpec,
        shape: SliceShape,
        job: str,
    ) -> None:
        super().__init__(ctx, body, spec, shape)
        self.job = job

    @property
    def needs_pool(self) -> bool:
        return False  # its job chose its pool

    @property
    def job_name(self) -> str:
        return self.job

    @property
    def pool_holder(self) -> str:
        return job_holder(self.namespace, self.job)

    @property
    def pod_slice_names(self) -> tuple[str, ...]:
        return ()

    @property
    def in_place_from(self) -> int | None:
        return self.spec.in_place_from

    @property
    def control_secret(self) -> str | None:
        return self.spec.control_key_secret

    def target_and_not_before(self, status: TPUSliceStatus) -> tuple[int, dt.datetime | None]:
        return self.spec.attempt, parse(self.spec.not_before)

    def finished(self, phase: str) -> bool:
        return False  # its job decides: a finished job stops its slices (``spec.suspend``)

    def attempt_failed(
        self, status: TPUSliceStatus, failure: WorkerFailure, attempt: int, now: dt.datetime
    ) -> Ending:
        # Never asked (the ladder ends no job's slice): its job decides, the slice reports.
        return Ending(Phase.FAILED, failure.message)

    def gang_attempts(self, pods: list[PodView]) -> Collection[int]:
        # Every slice of the job: no straggler of attempt N on any slice meets N+1.
        return self.ctx.caches.attempts_of_job(self.namespace, self.job)

    def pool(self, status: TPUSliceStatus, stopping: bool) -> SlicePool:
        return SlicePool(self.spec.node_pool or status.node_pool)

    def service_conflict(self) -> str:
        return ""  # the job's Service: the job reports a conflict

    async def ensure_service(self, ports: Ports) -> bool:
        return False  # the job makes it


class StandaloneSlice(SliceRole):
    """A TPUSlice no TPUJob owns: its own job of one slice."""

    standalone = True
    reports_pool_when_stopping = False  # a stopped slice no longer holds its pool
    posts_job_events = True

    @property
    def needs_pool(self) -> bool:
        return self.shape.needs_pool

    @property
    def holder(self) -> str:
        return slice_holder(self.namespace, self.name)

    @property
    def job_name(self) -> str:
        return self.name

    @property
    def pool_holder(self) -> str:
        return self.holder

    @property
    def pod_slice_names(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def in_place_from(self) -> int | None:
        return None  # its restarts always recreate the pods

    @property
    def control_secret(self) -> str | None:
        return None  # its workers run no supervisor

    def target_and_not_before(self, status: TPUSliceStatus) -> tuple[int, dt.datetime | None]:
        return standalone.attempt(status, self.spec.suspend), parse(status.not_before)

    def finished(self, phase: str) -> bool:
        return standalone.finished(phase)

    def attempt_failed(
        self, status: TPUSliceStatus, failure: WorkerFailure, attempt: int, now: dt.datetime
    ) -> Ending:
        policy = self.spec.failure_policy or FailurePolicy()
        return standalone.attempt_failed(status, failure, policy, now, attempt)

    def gang_attempts(self, pods: list[PodView]) -> Collection[int]:
        return {p.attempt for p in pods}

    def pool(self, status: TPUSliceStatus, stopping: bool) -> SlicePool:
        """The pool it pins (``spec.nodePool``) or recorded; else one allocated now. A
        claim becomes the name of the pool GKE created for it."""
        node_pool = self.spec.node_pool or status.node_pool
        if not stopping and not node_pool and self.shape.needs_pool:
            return self._allocate()
        if is_claim(node_pool) and not self.spec.node_pool:
            return SlicePool(self._resolve_claim(node_pool))
        return SlicePool(node_pool)

    def _allocate(self) -> SlicePool:
        placement = self.spec.placement
        if placement is not None and placement.node_pools:
            # A standalone slice pins its pool with spec.nodePool; placement.nodePools is
            # the TPUJob's per-slice list.
            placement = placement.model_copy(update={"node_pools": None})
        claims = slice_pool_values(self.body["metadata"], None)
        requests = requests_for(self.shape, placement, 1, claims)
        allocation = choose_pools(self.ctx, self.holder, requests)
        if allocation.pools is None:
            return SlicePool(None, allocation.message, POOL_RETRY_SECONDS)
        return SlicePool(allocation.pools[0])

    def _resolve_claim(self, ref: str | None) -> str | None:
        refs, resolved, _ = resolve_claims(self.ctx, [ref or ""], self.shape)
        if resolved:
            self.ctx.reservations.reserve(self.holder, refs)
        return refs[0]

    def service_conflict(self) -> str:
        name = self.spec.service or self.name
        return self.ctx.service_conflict(self.namespace, name, self.uid)

    async def ensure_service(self, ports: Ports) -> bool:
        known = self.service_conflict()
        await self.ctx.ensure_service(
            self.namespace,
            headless_service(
                name=self.spec.service or self.name,
                namespace=self.namespace,
                selector={contract.LABEL_SLICE_NAME: self.name},
                owner=Owner(contract.API_VERSION, contract.SLICE_KIND, self.name, self.uid),
                ports=ports,
            ),
        )
        return self.service_conflict() != known


def role_of(
    ctx: Context, body: dict[str, Any], spec: TPUSliceSpec, shape: SliceShape
) -> SliceRole | None:
    """The role of the slice ``body``: its job's child, or standalone; None for a child
    whose job is gone or being deleted (the garbage collector removes the slice and its
    pods; it creates nothing in the meantime, and its pool stays held by its record and
    its pods: ``reconcile/pools.py``).

    A standalone slice's shape is the one ``spec`` resolves to with its machine type
    decided (a topology that fits two machine types is decided once and recorded); a
    job's child takes the shape its job decided."""
    job = slice_job_name(body)
    if job is None:
        recorded = (body.get("status") or {}).get("shape")
        holder = slice_holder(body["metadata"]["namespace"], body["metadata"]["name"])
        shape = machine_for(ctx, holder, spec, shape, spec.placement, recorded).shape
        return StandaloneSlice(ctx, body, spec, shape)
    if not owned_by(ctx.caches.job(body["metadata"]["namespace"], job), body):
        return None
    return OwnedSlice(ctx, body, spec, shape, job)
