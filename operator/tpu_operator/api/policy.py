"""Failure, success and placement policy fields shared by TPUJob and standalone TPUSlices."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tpu_operator import contract
from tpu_operator.api.common import ApiModel, cel, rules

ExitCodeAction = Literal["FailJob", "Restart", "RestartNotCounted"]


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
    node_not_ready_timeout_seconds: int = Field(default=60, ge=0, le=3600)
    """How long a worker may sit on a NotReady or unreachable node before it is evicted
    and the gang restarts (the pods' NoExecute tolerationSeconds)."""


SuccessPolicy = Literal["AllWorkers", "LeaderWorker"]


class Placement(ApiModel):
    """Where slices may run. Multi-host slices always get a node pool of their own."""

    node_pools: list[str] | None = Field(default=None, max_length=1024)
    """Pin slice i to node pool nodePools[i] (cloud.google.com/gke-nodepool); one pool
    per slice, all different. Unset: the operator picks free matching pools."""
    spot: bool | None = None
    """true: only Spot VMs; false: only on-demand VMs; unset: either."""
    reservation: str | None = Field(default=None, max_length=253)
    """Only nodes of this reservation (cloud.google.com/reservation-name)."""
    node_selector: dict[str, str] | None = None
    """Extra node labels the slice's nodes must carry."""


class PortsSpec(ApiModel):
    """Ports the workers use. Keep them clear of libtpu's (8431-8438, 8471, 8476)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                f"!(self.metrics in {sorted(contract.RESERVED_PORTS)})",
                "metrics: this port is reserved for libtpu, JAX or Megascale (8431-8438, 8471, "
                "8476, 8080, 8482, 2112); pick another, e.g. 9431",
                field_path=".metrics",
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
