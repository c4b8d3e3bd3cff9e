"""What one reconcile of a TPUJob reads (``JobFacts``, ``World``) and decides (``Plan``).

The policies take the facts and the plan explicitly and write only the plan: the status
to commit (once), the conditions, the events posted after that write, what is reported
after it (metrics), the act on the children that follows, and when to look again.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Protocol

from tpu_operator import contract
from tpu_operator.api.conditions import set_condition
from tpu_operator.api.job import TPUJobSpec, TPUJobStatus
from tpu_operator.api.monitoring import Monitoring
from tpu_operator.api.policy import FailurePolicy, Placement
from tpu_operator.api.status import ConditionType
from tpu_operator.catalog import SliceShape
from tpu_operator.placement.pools import Allocation, PoolGone, Request
from tpu_operator.progress.account import Account
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.state.gang import ProcessReport
from tpu_operator.state.views import PodView

MIN_REQUEUE_SECONDS = 0.05
"""The shortest requeue a reconciler asks for (0 would read as "no requeue")."""


class Act(Enum):
    """What a reconcile does to the job's children once its status is committed."""

    NOTHING = auto()
    RUN = auto()
    """Create or patch the Service and one TPUSlice per slice for the committed attempt."""
    STOP = auto()
    """Suspend the existing slices (their pods are deleted)."""
    DELETE = auto()
    """Delete the job (ttlSecondsAfterFinished)."""


@dataclass(frozen=True)
class SliceRefusal:
    """The apiserver's refusal of a job's TPUSlice write (the write follows the commit, so
    the next reconcile's status says it)."""

    uid: str
    """The job's UID (a job of the same name created later is another job)."""
    invalid: bool
    """Rejected as invalid (400/422): the spec makes a slice the API cannot take, and the
    job fails; otherwise (an admission policy, a quota) the write is retried."""
    message: str


class Metrics(Protocol):
    """The operator metrics a reconcile reports (after its status write)."""

    def pod_created(self, seconds: float) -> None: ...
    def restart(self, kind: str, reason: str) -> None: ...
    def time_to_running(self, seconds: float) -> None: ...
    def waited(self, reason: str, seconds: float) -> None: ...
    def slice_moved(self, to: str) -> None: ...


class World(Protocol):
    """What the policies read of the cluster beyond the job itself (the operator's caches),
    and the one thing they may do to it: reserve, in memory, the pools an allocation
    chose (``reconcile/pools.py``)."""

    metrics: Metrics

    def allocate(self, requests: list[Request]) -> Allocation:
        """Free pools for ``requests``, all or none, reserved for the job when found."""
        ...

    def claims(self, slices: int, renewal: int | None = None) -> list[str]:
        """The slice-pool label values of an allocation (``pools.slice_pool_values``)."""
        ...

    def resolve_claims(self, refs: list[str]) -> tuple[list[str], dict[int, str], list[str]]:
        """Claim references whose pool GKE created, replaced by its name."""
        ...

    def vanished_pools(
        self, refs: list[str], created: Iterable[int], placement: Placement | None
    ) -> list[PoolGone]:
        """The recorded pools with no nodes left, and what to do about each, for slices
        placed as ``placement`` says (the capacity step the job is on)."""
        ...

    def unhealthy_pools(self, refs: list[str]) -> dict[int, str]:
        """The recorded pools (by slice index) that have nodes but are unhealthy (a VM not
        ready or cordoned, or fewer VMs than a slice needs), and why."""
        ...

    def not_ready_nodes(self, names: Iterable[str | None]) -> frozenset[str]: ...

    def noticed_nodes(self) -> Mapping[str, str]:
        """TPU nodes with a notice of maintenance or termination, and the notice."""
        ...

    def terminating_nodes(self, before: float) -> Mapping[str, float]:
        """TPU nodes GKE takes back before ``before`` (Unix time; flex-start VMs at the end
        of their run duration), and when."""
        ...

    def pools_end(self, pools: list[str]) -> float | None:
        """The earliest time GKE takes back a VM of ``pools`` (Unix time), if it said."""
        ...

    def pods_on_node(self, node: str) -> list[PodView]: ...

    def others_on_pools(self, pools: list[str]) -> list[PodView]:
        """Pods with the operator's labels that are not its workers, on ``pools``."""
        ...

    def in_place_fallback(self, attempt: int) -> str | None:
        """Why an in-place restart into ``attempt`` gave up on stopping the processes."""
        ...

    def in_place_started(self, attempt: int) -> bool:
        """The in-place restart into ``attempt`` told every pod that stays to start it
        (until then, a pod whose stopped process's readiness is still held up would look
        like a running worker of ``attempt``)."""
        ...

    def service_conflict(self) -> str:
        """Why the job's headless Service name belongs to another object, if it does."""
        ...

    def slice_refusal(self) -> SliceRefusal | None:
        """The apiserver's last refusal of the job's TPUSlices."""
        ...

    def scheduler_looked_at(self, name: str) -> dt.datetime | None:
        """When the scheduler ``name`` last looked at a pod of the operator's (None: not
        since the operator started)."""
        ...


@dataclass
class JobFacts:
    """What one reconcile knows of its job: read once by the driver, read only after."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    created: dt.datetime
    now: dt.datetime
    spec: TPUJobSpec
    raw_spec: dict[str, Any]
    """The spec as written, with the machine type chosen for a shape that fits two."""
    shape: SliceShape
    slices: dict[int, dict[str, Any]]
    """The job's TPUSlices (owned by its UID), by slice index."""
    recorded: dict[str, Any]
    """The status as read."""
    load_pods: Callable[[], list[PodView]]
    track: JobTrack | None = None
    """The progress sampler's track of the current attempt."""
    supervised: bool = False
    """Restarts may run in place: the workers run the supervisor (failurePolicy)."""
    supervision_refused: str | None = None
    """Why the workers, which could run the supervisor, do not."""
    machine_note: str = ""
    """Why this machine type, when the operator chose it (a shape that fits two)."""
    machine_wait: str = ""
    """The cluster has neither machine type of a shape that fits two and the job may not
    ask GKE for one: what the job waits for (it starts no attempt until one is there)."""
    reports: Mapping[str, ProcessReport] = field(default_factory=dict)
    """Supervisors' reports on stopped training processes, by pod name."""
    kueue: bool = False
    """Kueue admits the job (labelled with a queue, operator run with --kueue)."""

    @property
    def policy(self) -> FailurePolicy:
        return self.spec.failure_policy or FailurePolicy()

    @property
    def monitoring(self) -> Monitoring:
        return self.spec.monitoring or Monitoring()

    @property
    def total_workers(self) -> int:
        """Workers of the current attempt (an elastic job may run on fewer slices)."""
        active = self.recorded.get("activeSlices")
        slices = active if isinstance(active, int) and active > 0 else self.spec.num_slices
        return min(slices, self.spec.num_slices) * self.shape.hosts

    @property
    def holder(self) -> str:
        return f"{contract.JOB_KIND} {self.namespace}/{self.name}"

    @property
    def previous_phase(self) -> str | None:
        return self.recorded.get("phase")

    @functools.cached_property
    def pods(self) -> list[PodView]:
        """Every pod of the job, any attempt (copied out of the cache only if asked for:
        a running job's reconcile reads its slices' parts instead)."""
        return self.load_pods()

    def created_slices(self, attempt: int) -> frozenset[int]:
        """Slices whose pods of ``attempt`` were all seen created once."""
        return frozenset(
            i
            for i, s in self.slices.items()
            if int((s.get("status") or {}).get("createdAttempt", 0)) >= attempt
        )


@dataclass
class Plan:
    """What one reconcile of a job decides."""

    status: TPUJobStatus
    account: Account
    now: dt.datetime
    generation: int | None
    conditions: list[dict[str, Any]]
    act: Act = Act.NOTHING
    requeue: float | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message): posted once the status is written."""
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    """Metrics reported once the status is written."""
    checkpoint_for: list[str] = field(default_factory=list)
    """New disruption notices: the workers are asked to checkpoint (after the write)."""
    template: dict[str, Any] | None = None
    """The pod template the slices run, when an admission changed it (None: the spec's)."""
    provisioning: list[str] = field(default_factory=list)
    """Slices whose pools GKE is still to create, and why they are not there yet."""
    pools_gone: list[str] = field(default_factory=list)
    """Recorded pools with no nodes left, and what the slice does about it."""

    @classmethod
    def of(cls, facts: JobFacts, publish_interval: float) -> Plan:
        """The plan of a reconcile that has decided nothing yet: the status as read."""
        status = TPUJobStatus.model_validate(facts.recorded)
        account = Account(
            status,
            created=facts.created,
            now=facts.now,
            track=facts.track,
            publish_interval=publish_interval,
            desired_slices=facts.spec.num_slices,
        )
        return cls(
            status=status,
            account=account,
            now=facts.now,
            generation=facts.generation,
            conditions=[c.wire() for c in status.conditions],
        )

    def after(self, seconds: float) -> None:
        """Look again after ``seconds`` at the latest (the soonest ask wins)."""
        seconds = max(seconds, MIN_REQUEUE_SECONDS)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def condition(self, type_: ConditionType, status: bool, reason: str, message: str = "") -> None:
        self.conditions = set_condition(
            self.conditions,
            type_,
            status,
            reason,
            message,
            at=self.now,
            generation=self.generation,
        )

    def condition_is(self, type_: ConditionType, value: bool) -> bool:
        wanted = "True" if value else "False"
        return any(c.get("type") == type_ and c.get("status") == wanted for c in self.conditions)

    def condition_reason(self, type_: ConditionType) -> str | None:
        return next((c.get("reason") for c in self.conditions if c.get("type") == type_), None)

    def has_condition(self, type_: ConditionType) -> bool:
        return any(c.get("type") == type_ for c in self.conditions)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))
