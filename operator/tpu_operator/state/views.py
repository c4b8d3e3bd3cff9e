"""Compact, immutable views of the pods, slices and nodes the operator watches.

The watch caches keep these instead of whole objects: a 256-host slice's pods cost a few
hundred bytes each, and every assessment reads only these fields.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload

from tpu_operator import contract
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL, claim_ref

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The node's machine type (``ct6e-standard-4t``), set by GKE on every node."""

_DISRUPTION_STATUS_REASONS = {"Evicted", "Preempting", "Terminated", "Shutdown", "NodeLost"}


@overload
def _shared(value: str) -> str: ...
@overload
def _shared(value: str | None) -> str | None: ...
def _shared(value: str | None) -> str | None:
    """One string object for every view holding the same text (``sys.intern``).

    Most of a view's strings repeat across thousands of pods and nodes: namespace, job,
    slice, phase, node pool, the node's name in its pods' views, timestamps of the same
    second. Each decoded event brings its own copies, and the views held them all. Interned
    strings are dropped again once no view holds them."""
    return sys.intern(value) if type(value) is str else value


def shared_copy(value: Any) -> Any:
    """A copy of a decoded JSON document (dicts, lists, scalars) whose strings, keys and
    values alike, are shared with every other copy holding the same text (``_shared``).

    The cached TPUJobs and TPUSlices repeat most of their strings: every key, condition
    types and reasons, the pod template of a job in each of its slices."""
    if isinstance(value, dict):
        return {_shared(k): shared_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shared_copy(v) for v in value]
    return _shared(value)  # strings shared; numbers, booleans and None as they are


def _int(value: object, default: int = -1) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    namespace: str
    uid: str
    job_name: str
    slice_name: str
    slice_index: int
    worker_index: int
    attempt: int
    phase: str
    ready: bool
    deletion_deadline: str | None
    """deletionTimestamp: when the pod's grace period ends, once it is being deleted."""
    node: str | None
    pool: str | None
    """The node pool the pod is pinned to (its ``cloud.google.com/gke-nodepool`` node
    selector), or the claim reference (``auto:<value>``) of the pool GKE is to create for
    its slice (its ``tpu-operator.dev/slice-pool`` node selector), if any."""
    pod_ip: str | None
    exit_code: int | None
    exit_reason: str | None
    disruption: str | None
    """Reason of a True DisruptionTarget condition (or a kubelet eviction reason)."""
    unschedulable: str | None
    """The scheduler's message while the pod cannot be placed."""
    created: str | None
    started: str | None
    finished: str | None
    worker_exit: int | None = None
    """Exit code of the worker container once it has terminated. The kubelet reports a
    container's end and the pod's phase in two writes (and a sidecar may keep the pod
    Running): the gang takes the worker's exit as the pod's outcome at once."""
    supervised: bool = False
    """The worker container runs the supervisor (in-place restarts)."""
    not_ready_since: str | None = None
    """When the pod's Ready condition last turned False (while it is False)."""
    worker_started: str | None = None
    """When the worker container started running (while it runs)."""

    @property
    def process_stopped(self) -> bool:
        """A supervised worker whose training process stopped: the container runs, but
        the supervisor's readiness turned False after the container started."""
        return (
            self.supervised
            and self.phase == "Running"
            and not self.ready
            and self.worker_exit is None
            and self.worker_started is not None
            and self.not_ready_since is not None
            and self.not_ready_since >= self.worker_started
        )

    @property
    def outcome_phase(self) -> str:
        """The pod's phase for the gang: Succeeded or Failed as soon as the worker exited."""
        if self.worker_exit is not None and self.phase in ("Pending", "Running"):
            return "Succeeded" if self.worker_exit == 0 else "Failed"
        return self.phase

    @property
    def deleting(self) -> bool:
        return self.deletion_deadline is not None

    @property
    def job_owned(self) -> bool:
        """A pod of a TPUJob's slice (a standalone TPUSlice's pods carry its own name as
        job name; a job's slices are always named ``<job>-<index>``)."""
        return self.job_name != self.slice_name

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        return not self.terminal


def _worker_termination(status: Mapping[str, Any]) -> tuple[int | None, str | None, str | None]:
    """Exit code, reason and finish time: the worker container's, else the first failing one."""
    statuses = list(status.get("containerStatuses") or [])
    statuses.sort(key=lambda s: s.get("name") != contract.WORKER_CONTAINER)
    chosen = None
    for container in statuses:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is None:
            continue
        if chosen is None or (chosen.get("exitCode") == 0 and terminated.get("exitCode") != 0):
            chosen = terminated
    if chosen is None:
        return None, None, None
    return chosen.get("exitCode"), chosen.get("reason"), chosen.get("finishedAt")


def _worker_started(status: Mapping[str, Any]) -> str | None:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == contract.WORKER_CONTAINER:
            running = (container.get("state") or {}).get("running") or {}
            started = running.get("startedAt")
            return started if isinstance(started, str) else None
    return None


def _worker_exit(status: Mapping[str, Any]) -> int | None:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == contract.WORKER_CONTAINER:
            terminated = (container.get("state") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            return code if isinstance(code, int) else None
    return None


def pod_view(body: Mapping[str, Any]) -> PodView | None:
    """The view of a worker pod, or None for a pod without the operator's labels."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    slice_name = labels.get(contract.LABEL_SLICE_NAME)
    if not slice_name:
        return None
    status = body.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready_condition = conditions.get("Ready") or {}
    ready = ready_condition.get("status") == "True"
    not_ready_since = (
        ready_condition.get("lastTransitionTime")
        if ready_condition.get("status") == "False"
        else None
    )
    disruption_condition = conditions.get("DisruptionTarget") or {}
    disruption = (
        disruption_condition.get("reason") or "DisruptionTarget"
        if disruption_condition.get("status") == "True"
        else None
    )
    if disruption is None and status.get("reason") in _DISRUPTION_STATUS_REASONS:
        disruption = status["reason"]
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = (
        scheduled.get("message") or "Unschedulable"
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        else None
    )
    exit_code, exit_reason, finished = _worker_termination(status)
    spec = body.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    pool = selector.get(contract.NODE_LABEL_NODEPOOL)
    if pool is None and selector.get(SLICE_POOL_LABEL):
        pool = claim_ref(selector[SLICE_POOL_LABEL])
    return PodView(
        name=meta.get("name", ""),
        namespace=_shared(meta.get("namespace", "")),
        uid=meta.get("uid", ""),
        job_name=_shared(labels.get(contract.LABEL_JOB_NAME, slice_name)),
        slice_name=_shared(slice_name),
        slice_index=_int(labels.get(contract.LABEL_SLICE_INDEX), 0),
        worker_index=_int(labels.get(contract.LABEL_WORKER_INDEX)),
        attempt=_int(labels.get(contract.LABEL_RESTART_ATTEMPT), 0),
        phase=_shared(status.get("phase") or "Pending"),
        ready=ready,
        deletion_deadline=_shared(meta.get("deletionTimestamp")),
        node=_shared(spec.get("nodeName")),
        pool=_shared(pool),
        pod_ip=status.get("podIP"),
        exit_code=exit_code,
        exit_reason=_shared(exit_reason),
        disruption=_shared(disruption),
        unschedulable=_shared(unschedulable),
        created=_shared(meta.get("creationTimestamp")),
        started=_shared(status.get("startTime")),
        finished=_shared(finished),
        worker_exit=_worker_exit(status),
        supervised=(meta.get("annotations") or {}).get(contract.ANNOTATION_SUPERVISED) == "true",
        not_ready_since=_shared(not_ready_since) if isinstance(not_ready_since, str) else None,
        worker_started=_shared(_worker_started(status)),
    )


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    pool: str | None
    accelerator: str | None
    topology: str | None
    ready: bool
    unschedulable: bool
    spot: bool
    reservation: str | None
    tpu_chips: int
    machine_type: str | None = None
    """``node.kubernetes.io/instance-type``: the VM's machine type, which fixes its chips."""
    slice_pool: str | None = None
    """``tpu-operator.dev/slice-pool``: set on the nodes of a pool GKE created for a slice."""
    disruption_notice: str | None = None
    """What GKE announces is about to disrupt the node (``maintenance_notice``), if any."""


# GKE's notices of host events on TPU and GPU nodes ("Manage GKE node disruption for GPUs
# and TPUs", cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu):
# upcoming maintenance as a node label holding its Unix start time, maintenance under way
# as another label, and the taint GKE's maintenance handler sets before it terminates the
# node (graceful termination). Spot preemption shows as the same taint and as pods'
# DisruptionTarget condition.
MAINTENANCE_TIME_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"


def maintenance_notice(labels: Mapping[str, str], taints: list[Any]) -> str | None:
    """The node's disruption notice in words (one per event: the words change with it)."""
    for taint in taints:
        if isinstance(taint, Mapping) and taint.get("key") == IMPENDING_TERMINATION_TAINT:
            since = taint.get("timeAdded")
            suffix = f" since {since}" if since else ""
            return f"impending termination (taint {IMPENDING_TERMINATION_TAINT}{suffix})"
    active = labels.get(ACTIVE_MAINTENANCE_LABEL)
    if active and active.lower() not in ("false", "0"):
        return f"maintenance under way ({ACTIVE_MAINTENANCE_LABEL}={active})"
    when = labels.get(MAINTENANCE_TIME_LABEL)
    if when:
        return f"maintenance scheduled at {when} ({MAINTENANCE_TIME_LABEL})"
    return None


def node_view(body: Mapping[str, Any]) -> NodeView:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    allocatable = status.get("allocatable") or {}
    return NodeView(
        name=_shared(meta.get("name", "")),
        pool=_shared(labels.get(contract.NODE_LABEL_NODEPOOL)),
        accelerator=_shared(labels.get(contract.NODE_LABEL_ACCELERATOR)),
        topology=_shared(labels.get(contract.NODE_LABEL_TOPOLOGY)),
        ready=ready,
        unschedulable=bool((body.get("spec") or {}).get("unschedulable")),
        spot=labels.get(contract.NODE_LABEL_SPOT) == "true",
        reservation=_shared(labels.get(contract.NODE_LABEL_RESERVATION)),
        tpu_chips=_int(allocatable.get(contract.TPU_RESOURCE), 0),
        machine_type=_shared(labels.get(INSTANCE_TYPE_LABEL)),
        slice_pool=_shared(labels.get(SLICE_POOL_LABEL)),
        disruption_notice=maintenance_notice(
            labels, list((body.get("spec") or {}).get("taints") or [])
        ),
    )
