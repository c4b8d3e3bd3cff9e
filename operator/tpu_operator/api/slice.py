"""TPUSlice: one TPU slice running one gang of worker pods (the TPUSlice CRD's schema).

A TPUJob creates one TPUSlice per slice and sets the fields marked "set by the owning
TPUJob". A TPUSlice can also stand alone (serving, interactive), then it restarts itself
under its own failurePolicy and creates its own headless Service.
"""

from __future__ import annotations

from pydantic import Field

from tpu_operator.api.common import ApiModel, Condition, Failure, cel, rules
from tpu_operator.api.policy import LABEL_VALUE, FailurePolicy, Placement, PortsSpec
from tpu_operator.api.shape import ShapeFields, dns_label_rule, name_rule, shape_rules
from tpu_operator.api.status import Phase, ResolvedShape
from tpu_operator.api.template import PodTemplate

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""An RFC 1035 label: the name of a Service, and of the TPUJob it is named after."""
MAX_ATTEMPT = 2**31 - 1


class TPUSliceSpec(ShapeFields):
    """One slice: its shape, worker template and, when owned by a TPUJob, its place in it."""

    model_config = {
        **ShapeFields.model_config,
        "json_schema_extra": rules(
            *shape_rules(),
            cel(
                "self.sliceIndex < self.numSlices",
                "sliceIndex: the index of the slice in its job must be less than numSlices",
                field_path=".sliceIndex",
            ),
        ),
    }
    template: PodTemplate
    """Pod template of every worker; one container must be named "worker"."""
    placement: Placement | None = None
    node_pool: str | None = Field(
        default=None, max_length=63, pattern=f"^(auto:)?{LABEL_VALUE.lstrip('^')}"
    )
    """Node pool this slice runs in (set by the owning TPUJob, or a pin)."""
    failure_policy: FailurePolicy | None = None
    """Restart policy of a standalone slice (ignored when a TPUJob owns the slice)."""
    ports: PortsSpec | None = None
    suspend: bool = False
    """Delete the slice's running pods and create none until false again."""
    job_name: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    """Set by the owning TPUJob: the job's name."""
    service: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    """Set by the owning TPUJob: headless Service of the pods (default: the slice name)."""
    slice_index: int = Field(default=0, ge=0, le=1023)
    """Set by the owning TPUJob: index of this slice in the job."""
    num_slices: int = Field(default=1, ge=1, le=1024)
    """Set by the owning TPUJob: number of slices in the job."""
    world_slices: list[int] | None = Field(default=None, max_length=1024)
    """Set by the owning TPUJob while it runs on fewer slices than numSlices (elastic):
    the indices of the slices the attempt runs on, in order. The workers' multislice
    world is these slices: this slice's position in the list is its MEGASCALE_SLICE_ID,
    and the first one's worker 0 is the coordinator."""
    attempt: int = Field(default=0, ge=0, le=MAX_ATTEMPT)
    """Set by the owning TPUJob: the attempt whose pods this slice runs."""
    not_before: str | None = None
    """Set by the owning TPUJob: create no pods before this time (restart backoff)."""
    in_place_from: int | None = Field(default=None, ge=0, le=MAX_ATTEMPT)
    """Set by the owning TPUJob while it keeps this slice's pods across in-place restarts:
    the pods created for any attempt from this one to ``attempt - 1`` belong to
    ``attempt`` (the job restarts their training processes in place; their
    restart-attempt label keeps the attempt they were created for). The slice neither
    deletes them nor creates others."""
    await_start: bool = False
    """Set by the owning TPUJob while it restarts in place: the supervisors of the pods
    this slice creates start no training process until the job's start command, which
    comes once every process of the previous attempt stopped."""
    control_key_secret: str | None = Field(default=None, max_length=253)
    """Set by the owning TPUJob when its restarts may run in place: the Secret with the
    control-channel key, mounted into the supervised worker containers."""
    control_key_id: str | None = Field(default=None, pattern="^[0-9a-f]{32}$")
    """Set by the owning TPUJob with controlKeySecret: the id of the job's key; the
    supervisors use a mounted key only if it has this id."""
    gke_slice: str | None = Field(default=None, max_length=49, pattern=DNS_LABEL)
    """Set by the owning TPUJob when Kueue admitted it through the Ironwood slice admission
    check (``accelerator.gke.io/slice``): the GKE Slice formed for this slice, whose nodes
    its pods select. The slice forms and deletes no Slice of its own then."""


class TPUSliceStatus(ApiModel):
    """Observed state of a TPUSlice."""

    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    attempt: int = 0
    """Attempt whose pods the slice runs."""
    created_attempt: int = 0
    """Last attempt all of whose pods were seen created; a pod of that attempt that
    disappears afterwards ends the attempt rather than being recreated."""
    workers: int = 0
    ready_workers: int = 0
    active_pods: int = 0
    """Worker pods (of any attempt) that exist, have not finished and are not marked for
    deletion."""
    terminating_pods: int = 0
    """Worker pods marked for deletion that have not stopped yet. A suspended or finished
    object's node pools and chips are free once both counts are 0 (condition
    PodsStopped)."""
    ready: str = ""
    """Ready workers as ready/total."""
    shape: ResolvedShape | None = None
    node_pool: str | None = None
    restarts: int = 0
    """Restarts of a standalone slice."""
    counted_restarts: int = 0
    restarts_by_reason: dict[str, int] = Field(default_factory=dict)
    not_before: str | None = None
    """Standalone slice: create no pods of the next attempt before this time."""
    failure: Failure | None = None
    start_time: str | None = None
    completion_time: str | None = None
    message: str = ""
    provisioning_request: str | None = None
    """The ProvisioningRequest (autoscaling.x-k8s.io, queued-provisioning.gke.io) the
    slice's pods consume, when the operator made it (placement.capacity:
    QueuedProvisioning outside Kueue)."""
    provisioning_tries: int = 0
    """ProvisioningRequests of the current attempt that failed or expired before the
    slice's pods took their capacity (each try is a new request)."""
    provisioning_state: str = ""
    """Where the request stands: Pending, Accepted, Provisioned, Failed, BookingExpired
    or Revoked, with the autoscaler's message."""


class TPUSliceRoot(ApiModel):
    """Rules evaluated at the object root (they need metadata.name)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            dns_label_rule("TPUSlice"),
            name_rule("self.spec", "0", "TPUSlice"),
        ),
    }
