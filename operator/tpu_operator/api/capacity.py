"""Capacity fallbacks of a TPUJob: the placements it falls back to after waiting for one.

``spec.placement`` is the first choice (its ``spot``, ``reservation`` and ``capacity``);
each entry of ``spec.placement.fallbacks`` is the next, taken once the job has waited
``afterSeconds`` for capacity on the one before (``policies/fallback.py``). A step is a
placement: a further kind of capacity is one more field of ``CapacityStep`` and of
``Placement``. ``status.fallback`` says
which step the job is on and since when.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tpu_operator.api.common import ApiModel, cel, rules
from tpu_operator.api.policy import (
    LABEL_KEY,
    MAX_RUN_DURATION_SECONDS,
    MAX_SECONDS,
    Capacity,
    LabelValue,
    Placement,
)

MAX_FALLBACKS = 8


class CapacityStep(ApiModel):
    """A placement to fall back to: its spot, reservation, capacity and
    maxRunDurationSeconds replace the ones before (unset: none of that kind)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                "!has(self.maxRunDurationSeconds) || has(self.capacity)",
                "maxRunDurationSeconds applies to flex-start VMs only: set capacity to "
                "FlexStart or QueuedProvisioning in this step, or remove it",
                field_path=".maxRunDurationSeconds",
            ),
            cel(
                "!has(self.capacity) || !has(self.spot) || self.spot == false",
                "capacity: flex-start VMs are not Spot VMs; remove spot from this step (or "
                "set it to false), or remove capacity",
                field_path=".capacity",
            ),
            cel(
                "!has(self.capacity) || !has(self.reservation)",
                "capacity: flex-start VMs do not come from a reservation; remove "
                "reservation or capacity from this step",
                field_path=".capacity",
            ),
        ),
    }
    after_seconds: int = Field(ge=1, le=MAX_SECONDS)
    """Fall back to this step once the job has waited this long for a node pool on the
    step before it (counted from when that wait, or that step, began)."""
    spot: bool | None = None
    """true: only Spot VMs; false: only on-demand VMs; unset: either."""
    reservation: LabelValue | None = None
    """Only nodes of this reservation (cloud.google.com/reservation-name); unset: any."""
    capacity: Capacity | None = None
    """FlexStart or QueuedProvisioning: flex-start VMs, as placement.capacity says; unset:
    on-demand, Spot or reserved VMs as this step's spot and reservation say."""
    max_run_duration_seconds: int | None = Field(default=None, ge=1, le=MAX_RUN_DURATION_SECONDS)
    """(capacity only) The longest this step's flex-start VMs may run, in seconds."""

    def words(self) -> str:
        return capacity_words(self.spot, self.reservation, self.capacity)


CAPACITY_WORDS = {"FlexStart": "flex-start", "QueuedProvisioning": "queued provisioning"}


def capacity_words(spot: bool | None, reservation: str | None, capacity: str | None = None) -> str:
    """``spot``, ``on-demand in reservation r``, ``flex-start``, ``any VMs``: a step in
    words."""
    if capacity:
        return CAPACITY_WORDS.get(capacity, capacity)
    kind = {True: "spot", False: "on-demand", None: ""}[spot]
    where = f"reservation {reservation}" if reservation else ""
    if kind and where:
        return f"{kind} in {where}"
    return kind or where or "any VMs"


class PoolSelector(ApiModel):
    """A label selector over node pools: a pool matches when its nodes carry every label."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                f"self.matchLabels.all(k, k.matches('{LABEL_KEY}'))",
                "placement.spares.selector.matchLabels: every key must be a label key, such "
                "as pool-role or example.com/pool-role",
                field_path=".matchLabels",
            ),
        ),
    }
    match_labels: dict[str, LabelValue] = Field(min_length=1, max_length=16)
    """Node labels (key: value) every node of a spare pool carries, e.g. a label set on
    the node pool in GKE (gcloud container node-pools create --node-labels);
    kubernetes.io/hostname, one node's name, is no pool's label and matches no pool."""


class SparePools(ApiModel):
    """Node pools held in reserve for the job: taken only to replace a slice whose own
    pool is broken (docs/tasks/restarts.md)."""

    model_config = {
        **ApiModel.model_config,
        "json_schema_extra": rules(
            cel(
                "has(self.nodePools) || has(self.selector)",
                "placement.spares: name the spare node pools (nodePools), select them by "
                "label (selector.matchLabels), or both",
            ),
        ),
    }
    node_pools: list[LabelValue] | None = Field(default=None, max_length=1024)
    """Spare node pools by name (cloud.google.com/gke-nodepool)."""
    selector: PoolSelector | None = None
    """Spare node pools by their nodes' labels."""


def _placement_rules() -> list[dict[str, str]]:
    extra = Placement.model_config.get("json_schema_extra") or {}
    assert isinstance(extra, dict)
    found: Any = extra.get("x-kubernetes-validations") or []
    return list(found)


class JobPlacement(Placement):
    """Where a job's slices may run, and what to fall back to when capacity does not come."""

    model_config = {
        **Placement.model_config,
        "json_schema_extra": rules(
            *_placement_rules(),
            cel(
                "!has(self.fallbacks) || !has(self.nodePools)",
                "placement.fallbacks choose among the cluster's free node pools and the pools "
                "GKE creates; pinned placement.nodePools leave nothing to fall back to: set "
                "one or the other",
                field_path=".fallbacks",
            ),
            cel(
                "!has(self.spares) || !has(self.nodePools)",
                "placement.spares: a job that pins its node pools (placement.nodePools) "
                "keeps them; remove placement.nodePools to let the operator place the "
                "slices and move a broken one to a spare, or remove placement.spares",
                field_path=".spares",
            ),
        ),
    }
    fallbacks: list[CapacityStep] | None = Field(default=None, max_length=MAX_FALLBACKS)
    """Placements to fall back to, in order, when the job waits for a node pool: each
    replaces spot and reservation once the job has waited its afterSeconds on the one
    before (e.g. spot: true here, then [{afterSeconds: 600, spot: false}]: Spot VMs, and
    on-demand ones after 10 minutes). The clock runs while the job waits for a free node
    pool, or its pods for the pool GKE is to create or for a node (PodsScheduled False:
    WaitingForNodePools, Unschedulable) before its workers all ran; pods already waiting
    start again as the next attempt (not a counted restart). status.fallback says the
    step. Not with Kueue, whose ResourceFlavors decide the capacity. waitingTimeoutSeconds
    still bounds the whole wait."""

    spares: SparePools | None = None
    """Node pools held in reserve for this job: its first placement never takes them;
    when a restart recreates a slice whose own pool is unhealthy (a VM not ready,
    cordoned or gone) or wore out (failurePolicy.maxSliceFailuresPerPool), the slice
    moves at once to a free healthy pool of its shape, a spare first, instead of
    waiting for the repair. The broken pool is given to no job until
    it is healthy again (status.brokenNodePools, condition NodePoolsHealthy), then it
    takes the place of the spare the slice took (status.spareNodePools), or is free if
    the slice took no spare. The operator's --spare-node-pool-selector adds spares that
    every job may move to and no job's first placement takes."""

    def step(self, index: int) -> Placement:
        """The placement of step ``index`` (0: this one; n: fallbacks[n-1])."""
        if index <= 0 or not self.fallbacks:
            return self
        chosen = self.fallbacks[min(index, len(self.fallbacks)) - 1]
        return self.model_copy(
            update={
                "spot": chosen.spot,
                "reservation": chosen.reservation,
                "capacity": chosen.capacity,
                "max_run_duration_seconds": chosen.max_run_duration_seconds,
            }
        )


class FallbackStatus(ApiModel):
    """The capacity step a job with placement.fallbacks is on."""

    step: int = 0
    """0: spec.placement's own spot and reservation; n: placement.fallbacks[n-1]."""
    since: str | None = None
    """When the job moved to this step (unset for step 0)."""
    capacity: str = ""
    """What the step asks for, in words: spot, on-demand, reservation r, any VMs."""
