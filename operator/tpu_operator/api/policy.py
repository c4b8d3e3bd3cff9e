"""Failure, success and placement policy fields shared by TPUJob and standalone TPUSlices."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tpu_operator import contract
from tpu_operator.api.common import ApiModel, cel, rules
from tpu_operator.api.template import ports_words

ExitCodeAction = Literal["FailJob", "Restart", "RestartNotCounted"]
RestartMode = Literal["Auto", "InPlace", "Recreate"]

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A Kubernetes label value (at most 63 characters): node pool, reservation and node
selector values become node selector values of the pods."""
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
LABEL_KEY = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
MAX_SECONDS = 2**31 - 1
"""Upper bound of durations in seconds (about 68 years), as Kubernetes bounds its own
int32 durations: a time this far ahead is still a date the operator can compute."""


class ExitCodeRule(ApiModel):
    """What to do when the worker container exits with one of these codes."""

    action: ExitCodeAction
    """FailJob: fail at once, no restart. Restart: restart the gang, counted against
    maxRestarts. RestartNotCounted: restart without counting (e.g. a known-transient code)."""
    operator: Literal["In", "NotIn"] = "In"
    """In: the rule matches these codes; NotIn: it matches every non-zero code but these."""
    values: list[Annotated[int, Field(ge=1, le=255)]] = Field(min_length=1, max_length=64)
    """Exit codes (1-255; 0 is success) of the container named worker."""


class FailurePolicy(ApiModel):
    """When and how the gang restarts after a worker fails."""

    max_restarts: int = Field(default=3, ge=0, le=10000)
    """Restarts allowed before the job fails (counted restarts only)."""
    count_disruptions: bool = False
    """Count restarts caused by disruptions (preemption, eviction, node loss, maintenance)
    against maxRestarts. Off by default: a disruption is not the job's fault."""
    rules: list[ExitCodeRule] = Field(default_factory=list, max_length=32)
    """Exit-code rules, first match wins. Unmatched non-zero codes restart, counted.
    The worker's retryable exit code (75: stall watchdog, SIGTERM) restarts by default."""
    backoff_seconds: int = Field(default=10, ge=0, le=3600)
    """Delay before the first restart; doubles with each further restart."""
    max_backoff_seconds: int = Field(default=300, ge=0, le=86400)
    """Upper bound of the restart delay."""
    max_slice_failures_per_pool: int = Field(default=3, ge=0, le=1000)
    """(TPUJobs) A slice whose workers failed this many times on the same node pool (a
    worker's exit, a stall, a lost node) is recreated on another free pool of its shape
    at its next restart: its hosts may be faulty in a way node health does not show. 0:
    never moved for this. Counted per slice in status.slices[].poolFailures."""
    node_not_ready_timeout_seconds: int = Field(default=60, ge=0, le=3600)
    """The pods' NoExecute tolerationSeconds: how long Kubernetes leaves a worker on a
    NotReady or unreachable node before it evicts the pod. The operator does not wait for
    it: a worker on a node that is not ready ends the attempt at once (reason NodeLost)."""
    restart_mode: RestartMode = "Auto"
    """How the gang restarts (TPUJobs). Auto: in place when the worker container's
    command is tpu-worker (its supervisor restarts the training process in the pods the
    job already has) and every pod of the attempt is alive on a ready node; otherwise, and
    after a pod or node is lost, by recreating the pods. InPlace: as Auto, for images
    whose entrypoint runs tpu-worker (command not set in the template). Recreate: always
    delete and recreate every pod."""
    in_place_timeout_seconds: int = Field(default=300, ge=10, le=86400)
    """An in-place restart whose workers are not all running after this long ends the
    attempt (reason InPlaceRestartTimeout); the next attempt recreates the pods."""


SuccessPolicy = Literal["AllWorkers", "LeaderWorker"]
Provisioning = Literal["ExistingPools", "Auto"]
Capacity = Literal["FlexStart", "QueuedProvisioning"]
MAX_RUN_DURATION_SECONDS = 7 * 24 * 3600
"""GKE runs flex-start VMs (queued or not) for at most seven days."""


class Placement(ApiModel):
    """Where slices may run. Multi-host slices always get a node pool of their own."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                f"!has(self.nodeSelector) || self.nodeSelector.all(k, k.matches('{LABEL_KEY}'))",
                "placement.nodeSelector: every key must be a label key, such as disktype or "
                "example.com/disktype",
                field_path=".nodeSelector",
            ),
            cel(
                "!has(self.maxRunDurationSeconds) || has(self.capacity)",
                "placement.maxRunDurationSeconds applies to flex-start VMs only: set "
                "placement.capacity to FlexStart or QueuedProvisioning, or remove it",
                field_path=".maxRunDurationSeconds",
            ),
            cel(
                "!has(self.capacity) || !has(self.spot) || self.spot == false",
                "placement.capacity: flex-start VMs are not Spot VMs; remove placement.spot "
                "(or set it to false), or remove placement.capacity",
                field_path=".capacity",
            ),
            cel(
                "!has(self.capacity) || !has(self.reservation)",
                "placement.capacity: flex-start VMs do not come from a reservation; remove "
                "placement.reservation or placement.capacity",
                field_path=".capacity",
            ),
        ),
    }
    node_pools: list[LabelValue] | None = Field(default=None, max_length=1024)
    """Pin slice i to node pool nodePools[i] (cloud.google.com/gke-nodepool); one pool
    per slice, all different. Unset: the operator picks free matching pools."""
    spot: bool | None = None
    """true: only Spot VMs; false: only on-demand VMs; unset: either."""
    reservation: LabelValue | None = None
    """Only nodes of this reservation (cloud.google.com/reservation-name)."""
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=64)
    """Extra node labels the slice's nodes must carry."""
    provisioning: Provisioning | None = None
    """ExistingPools: a multi-host slice waits for a free node pool of its shape.
    Auto: when none is free, its pods ask GKE to create one for this slice alone (node
    auto-provisioning on Standard clusters, Autopilot): they select the node label
    tpu-operator.dev/slice-pool=<unique value> and tolerate its NoSchedule taint (GKE
    workload separation), and the pool is recorded once its nodes appear; a pool GKE
    removed while the slice still needs it is asked for again. Unset: the operator's
    --default-provisioning (ExistingPools unless the operator was installed otherwise)."""
    capacity: Capacity | None = None
    """How GKE obtains the slice's VMs (docs/tasks/capacity.md). FlexStart: flex-start VMs
    (Dynamic Workload Scheduler), the pods select cloud.google.com/gke-flex-start=true.
    QueuedProvisioning: flex-start with queued provisioning, every VM of the request at
    once or none; the pods select cloud.google.com/gke-queued=true and consume a
    ProvisioningRequest (queued-provisioning.gke.io) that Kueue's ProvisioningRequest
    admission check creates, or, for a job outside Kueue, the operator (one per slice).
    Unset: on-demand, Spot or reserved VMs as the other fields say."""
    max_run_duration_seconds: int | None = Field(default=None, ge=1, le=MAX_RUN_DURATION_SECONDS)
    """(capacity only) The longest the VMs may run, in seconds (at most 7 days, GKE's
    default). GKE takes them back then; the operator asks the workers to checkpoint when
    GKE announces it and restarts the job on new capacity without counting the restart."""


class PortsSpec(ApiModel):
    """Ports the workers use. Keep them clear of libtpu's (8431-8438, 8471, 8476)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                f"!(self.metrics in {sorted(contract.RESERVED_PORTS)})",
                "metrics: this port is reserved for libtpu, JAX, Megascale or GKE's TPU "
                f"device plugin ({ports_words(contract.RESERVED_PORTS)}); pick another, "
                f"e.g. {contract.DEFAULT_METRICS_PORT}",
                field_path=".metrics",
            ),
            *(
                cel(
                    f"!(self.{field} in {sorted(contract.LIBTPU_PORTS)})",
                    f"{field}: this port is libtpu's ({ports_words()}); pick another, e.g. "
                    f"{default}",
                    field_path=f".{field}",
                )
                for field, default in (
                    ("coordinator", contract.DEFAULT_COORDINATOR_PORT),
                    ("megascale", contract.DEFAULT_MEGASCALE_PORT),
                )
            ),
            cel(
                "self.metrics != self.coordinator && self.metrics != self.megascale && "
                "self.coordinator != self.megascale",
                "ports: coordinator, megascale and metrics must be three different ports",
            ),
        ),
    }
    coordinator: int = Field(default=contract.DEFAULT_COORDINATOR_PORT, ge=1, le=65535)
    """JAX distributed coordinator port on global process 0 (JAX >= 0.8.1 default: 8482)."""
    megascale: int = Field(default=contract.DEFAULT_MEGASCALE_PORT, ge=1, le=65535)
    """Megascale (multislice DCN) coordinator port."""
    metrics: int = Field(default=contract.DEFAULT_METRICS_PORT, ge=1, le=65535)
    """Worker Prometheus metrics port (pods may use hostNetwork, so it must not collide)."""
