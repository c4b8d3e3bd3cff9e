"""TPUJob: a JAX training job on one or more TPU slices (the TPUJob CRD's schema)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tpu_operator.api.capacity import FallbackStatus, JobPlacement
from tpu_operator.api.common import ApiModel, Condition, Failure, cel, rules
from tpu_operator.api.monitoring import Goodput, Monitoring, Progress
from tpu_operator.api.policy import (
    MAX_SECONDS,
    FailurePolicy,
    PortsSpec,
    SuccessPolicy,
)
from tpu_operator.api.shape import (
    ShapeFields,
    dns_label_rule,
    hosts_expr,
    name_rule,
    shape_rules,
    valid_shape_expr,
)
from tpu_operator.api.status import Phase, ResolvedShape, RestartKind
from tpu_operator.api.template import PodTemplate


class JobSliceSpec(ShapeFields):
    """Shape of each slice of the job."""

    model_config = {**ShapeFields.model_config, "json_schema_extra": rules(*shape_rules())}


class Elastic(ApiModel):
    """Train on fewer slices while a slice cannot be replaced (docs/tasks/restarts.md)."""

    min_slices: int = Field(ge=1, le=1024)
    """The fewest slices the job can train on (1 to numSlices). When a restart cannot
    bring a slice back (its node pool is unhealthy, or its failures there reached
    failurePolicy.maxSliceFailuresPerPool, and no free healthy pool of its shape is
    there to move it to), the next attempt runs without it on the others, if at least
    minSlices remain; the job grows back to numSlices once a healthy pool is there."""


class TPUJobSpec(ApiModel):
    """A training job: slice shape, number of slices, worker template and policies."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                f"self.numSlices == 1 || !{valid_shape_expr('self.slice')} || "
                f"{hosts_expr('self.slice')} > 1",
                message_expression=(
                    "'numSlices: multislice jobs need multi-host slices, and ' + "
                    "(has(self.slice.type) ? self.slice.type : self.slice.accelerator + ' ' + "
                    "self.slice.topology) + ' runs on a single host. Use numSlices: 1 or a "
                    "multi-host shape such as v5p-16 or v5litepod-16'"
                ),
                field_path=".numSlices",
            ),
            cel(
                "!has(self.placement) || !has(self.placement.nodePools) || "
                "size(self.placement.nodePools) == self.numSlices",
                "placement.nodePools pins one node pool per slice: give exactly numSlices "
                "entries, or leave it unset to let the operator pick free pools",
                field_path=".placement.nodePools",
            ),
            cel(
                "!has(self.elastic) || self.elastic.minSlices <= self.numSlices",
                "elastic.minSlices: the fewest slices the job trains on must be 1 to "
                "numSlices, not more",
                field_path=".elastic.minSlices",
            ),
        ),
    }
    slice: JobSliceSpec
    """Shape of each slice: a short type (v5p-128) or accelerator and topology."""
    num_slices: int = Field(default=1, ge=1, le=1024)
    """Number of slices; more than one is a multislice job (Megascale over DCN)."""
    template: PodTemplate
    """Pod template of every worker; one container must be named "worker"."""
    placement: JobPlacement | None = None
    failure_policy: FailurePolicy | None = None
    success_policy: SuccessPolicy = "AllWorkers"
    """AllWorkers: the job succeeds when every worker exits 0. LeaderWorker: when worker 0
    of slice 0 exits 0 (the others are then stopped)."""
    suspend: bool = False
    """Suspend the job: its pods are deleted, the job is kept; false resumes it.
    Kueue sets this field (label the job with kueue.x-k8s.io/queue-name)."""
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    """Fail the job (DeadlineExceeded) when it has been active this long."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """Delete the finished job (and its slices and pods) this long after it finished."""
    waiting_timeout_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    """Fail the job (WaitingTimeout) when it has waited this long for capacity: node pools
    for its slices, a Kueue admission, or pods that cannot be scheduled, are refused or
    that no scheduler looks at, each wait counted from when it began. Unset: it waits
    for as long as it takes."""
    ports: PortsSpec | None = None
    monitoring: Monitoring | None = None
    """Progress sampling, stall and straggler detection."""
    elastic: Elastic | None = None
    """Train on fewer slices (at least elastic.minSlices) while one cannot be replaced,
    and grow back once it can. Unset: every attempt runs on numSlices slices."""

    @model_validator(mode="after")
    def _elastic_fits(self) -> TPUJobSpec:
        if self.elastic is not None and self.elastic.min_slices > self.num_slices:
            raise ValueError(
                f"elastic.minSlices: the fewest slices the job trains on must be 1 to "
                f"numSlices ({self.num_slices}), not {self.elastic.min_slices}"
            )
        return self


class SliceSummary(ApiModel):
    index: int
    name: str
    phase: str
    workers: int
    ready_workers: int
    node_pool: str | None = None
    failures: int = 0
    """Attempts that ended with a failure of this slice's worker (lastFailure's pod)."""
    pool_failures: int = 0
    """Of those, the failures on the node pool it has now that its hosts may be to blame
    for (a worker's exit, a stall, a lost node); a slice that moves starts again at 0
    (failurePolicy.maxSliceFailuresPerPool)."""


class DroppedSlice(ApiModel):
    """A slice an elastic job runs without (spec.elastic)."""

    index: int
    reason: str
    """Why it could not be brought back: its node pool's state, or its failures there."""
    since: str | None = None
    """When the job began to run without it."""
    worn: bool = False
    """Dropped for its failures on its node pool: it comes back only on another pool."""


class BrokenPool(ApiModel):
    """A node pool a slice of the job moved off because it was broken."""

    node_pool: str
    slice: int
    """The slice that moved off it."""
    moved_to: str
    """The pool the slice moved to."""
    spare: bool = False
    """The slice moved to a spare pool (spec.placement.spares, or the operator's
    --spare-node-pool-selector)."""
    reason: str
    """What was wrong with it: its VMs' state, or the slice's failures on it."""
    since: str | None = None
    """When the slice moved off it."""


class GrowBack(ApiModel):
    """An elastic job's way back to numSlices slices: a checkpoint first."""

    requested_at: str
    """When the workers were asked to checkpoint."""
    checkpoint_save_seconds: float | None = None
    """The checkpoint-save seconds worker 0 had reported by then: more means the
    checkpoint was written (without figures the job waits a while instead)."""


class QueueStatus(ApiModel):
    """Kueue's view of a job labelled kueue.x-k8s.io/queue-name (docs/tasks/kueue.md)."""

    workload: str = ""
    """The job's Workload (kueue.x-k8s.io/v1beta2), in the job's namespace."""
    local_queue: str = ""
    cluster_queue: str = ""
    """The ClusterQueue that admitted the job (empty until admitted)."""
    state: str = ""
    """Missing, Queued, Reserved, Admitted, Evicted or Finished."""
    reason: str = ""
    message: str = ""
    """Kueue's reason and message (why it is not admitted, why it was evicted)."""
    flavors: dict[str, str] | None = None
    """Resource -> ResourceFlavor of the admission."""
    admissions: int = 0
    """How often the job was admitted (each admission runs a new attempt)."""
    position_in_local_queue: int | None = None
    position_in_cluster_queue: int | None = None
    """Where a queued job stands (0: next), from Kueue's visibility API (pending
    workloads); unset when that API is not served (Kueue's VisibilityOnDemand)."""


class TPUJobStatus(ApiModel):
    """Observed state of a TPUJob."""

    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    """Current attempt (1 for the first run; each gang restart adds one)."""
    restarts: int = 0
    """Gang restarts so far, counted or not."""
    counted_restarts: int = 0
    """Restarts counted against failurePolicy.maxRestarts."""
    restarts_by_reason: dict[str, int] = Field(default_factory=dict)
    restart_kind: RestartKind | None = None
    """How the current attempt came up after the last gang restart: InPlace (the
    supervisors restarted the training processes in the same pods), Recreate, or Mixed
    (the slices in recreatedSlices recreated, the others in place)."""
    recreated_slices: list[int] | None = None
    """The slices whose pods the last gang restart recreated when it was Mixed (by slice
    index); the job's other slices restarted in place."""
    in_place_restarts: int = 0
    """Gang restarts in which some or all slices restarted in place (InPlace or Mixed, of
    restarts)."""
    in_place_since: str | None = None
    """When the running in-place (or mixed) restart began
    (failurePolicy.inPlaceTimeoutSeconds)."""
    active_slices: int | None = None
    """Slices the current attempt runs on (spec.elastic); numSlices unless some are in
    droppedSlices."""
    dropped_slices: list[DroppedSlice] = Field(default_factory=list)
    """Slices an elastic job runs without, by index, and why; empty at full size."""
    grow_back: GrowBack | None = None
    """Set while an elastic job that runs without some slices waits for its workers'
    checkpoint before it restarts on all of them (a healthy pool is there again)."""
    broken_node_pools: list[BrokenPool] = Field(default_factory=list, max_length=1024)
    """The node pools slices of the job moved off, while they are unhealthy (each leaves
    the list once healthy again or gone; condition NodePoolsHealthy). No job is given
    such a pool until it is healthy."""
    spare_node_pools: list[str] = Field(default_factory=list, max_length=1024)
    """Node pools a slice of the job moved off to a spare, healthy again: held in reserve
    for the job in place of the spare the slice took, as spec.placement.spares are (no
    other job's placement and no first placement takes them; a slice of the job moving
    off a broken pool does). A pool leaves the list when it is gone or a slice of the job
    runs on it."""
    checkpoint_requests: int = 0
    """How often the workers were asked to checkpoint ahead of a node disruption."""
    disruption_notices: list[str] = Field(default_factory=list, max_length=64)
    """The node disruption notices (maintenance, termination) the workers were asked to
    checkpoint for, newest last: one entry per attempt and kind of notice, however many
    nodes have it (``attempt N: <notice>``)."""
    ready: str = ""
    """Ready workers of the current attempt, as ready/total."""
    slices_ready: str = ""
    """Slices whose workers are all ready, as ready/total."""
    workers: int = 0
    ready_workers: int = 0
    active_pods: int = 0
    """Worker pods (of any attempt) that exist, have not finished and are not marked for
    deletion."""
    terminating_pods: int = 0
    """Worker pods marked for deletion that have not stopped yet. A suspended or finished
    object's node pools and chips are free once both counts are 0 (condition
    PodsStopped)."""
    slices: list[SliceSummary] = Field(default_factory=list)
    shape: ResolvedShape | None = None
    node_pools: list[str] | None = None
    """Node pool held by each slice (multi-host slices), by slice index."""
    start_time: str | None = None
    completion_time: str | None = None
    restart_at: str | None = None
    """When the next attempt's pods may be created (restart backoff)."""
    last_failure: Failure | None = None
    message: str = ""
    """What the job is doing or waiting for, in a sentence."""
    running_since: str | None = None
    """When every worker of the current attempt was first running."""
    progress: Progress | None = None
    goodput: Goodput | None = None
    fallback: FallbackStatus | None = None
    """The capacity step the job is on (spec.placement.fallbacks), once it has fallen back."""
    queue: QueueStatus | None = None
    """Kueue admission (jobs labelled kueue.x-k8s.io/queue-name, operator run with
    --kueue)."""


class TPUJobRoot(ApiModel):
    """Rules evaluated at the object root (they need metadata.name)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            dns_label_rule("TPUJob"),
            name_rule(
                "self.spec.slice",
                "1 + size(string(self.spec.numSlices - 1))",
                "TPUJob",
            ),
        ),
    }
