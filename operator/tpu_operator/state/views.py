"""Compact, immutable views of the pods, slices and nodes the operator watches.

The watch caches keep these instead of whole objects: a 256-host slice's pods cost a few
hundred bytes each, and every assessment reads only these fields.
"""

from __future__ import annotations

import datetime as dt
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

from tpu_operator import contract
from tpu_operator.state.documents import (
    EMPTY_METADATA,
    Condition,
    ContainerStatus,
    NodeDocument,
    NodeSpec,
    NodeStatus,
    OwnerReference,
    PodDocument,
    PodSpec,
    PodStatus,
    Taint,
    Terminated,
    to_document,
)

DEFAULT_SCHEDULER = "default-scheduler"
"""The ``schedulerName`` of a pod that names none (the apiserver's default)."""
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


def carried_attempt(label: int, attempt: int, in_place_from: int | None) -> int:
    """The attempt a pod belongs to: ``label``, the attempt it was created for, unless its
    slice, now at ``attempt``, carried its pods in place from ``in_place_from`` on
    (``TPUSlice.spec.inPlaceFrom``): a pod created for any attempt from ``in_place_from``
    to ``attempt - 1`` runs ``attempt`` in the same pod (its label is never rewritten)."""
    if in_place_from is not None and in_place_from <= label < attempt:
        return attempt
    return label


OWN = "own"
"""A worker pod of a TPUSlice the operator knows (its controller owner reference, by UID,
and labels that agree with that slice): counted in its gang, held in its pools, stopped,
restarted and deleted by the operator."""
ORPHAN = "orphan"
"""A pod of a TPUSlice that is gone and that the operator does not remember (deleted
before this process started), being deleted by the garbage collector: it holds its pool
until it is gone, and nothing else."""
FOREIGN = "foreign"
"""A pod that carries the operator's labels and is not its worker (no TPUSlice controller
owner it knows, or labels that name another slice or job): it grants nothing. It
competes for chips like any pod, and is named when it is why workers do not schedule."""

Carries = Callable[[str | None, int], int]
"""The attempt a pod of the operator's belongs to, from its controller TPUSlice UID and
its ``restart-attempt`` label (``runtime/ownership.SliceOwners.carried``): the label's,
unless its slice's record says the job carried its pods into a later attempt in place
(``carried_attempt``)."""

Trusts = Callable[[str | None, str, str, str, bool], str]
"""How a pod is told apart (``runtime/ownership.SliceOwners.ownership``): from its
controller TPUSlice UID, namespace, slice and job labels and whether it is being deleted,
one of ``OWN``, ``ORPHAN``, ``FOREIGN``."""


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
    """The attempt the pod belongs to: its label's, or the later one its slice carried it
    into in place (``carried_attempt``). Every assessment, count and index reads this."""
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
    consumes: str | None = None
    """The ProvisioningRequest the pod consumes
    (``autoscaling.x-k8s.io/consume-provisioning-request``), if any."""
    not_ready_since: str | None = None
    """When the pod's Ready condition last turned False (while it is False)."""
    worker_started: str | None = None
    """When the worker container started running (while it runs)."""
    owner: str | None = None
    """UID of the TPUSlice its controller owner reference names (None: none)."""
    ownership: str = OWN
    """``OWN``, ``ORPHAN`` or ``FOREIGN`` (decided when the view is built: ``Trusts``)."""
    awaiting_scheduler: str | None = None
    """The pod's ``schedulerName`` while no scheduler has looked at it: Pending, on no
    node, without a PodScheduled condition (a scheduler sets one at its first attempt, the
    apiserver one for a scheduling gate). None once one has."""
    label_attempt: int = -1
    """The attempt the pod was created for (its ``restart-attempt`` label); below
    ``attempt`` in a pod carried in place (-1: the same as ``attempt``)."""

    @property
    def carried(self) -> bool:
        """Created for an earlier attempt and carried into ``attempt`` in place: a process
        of that earlier attempt may still run in it until its supervisor stopped it."""
        return 0 <= self.label_attempt < self.attempt

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
    def own(self) -> bool:
        """The operator's worker (``OWN``)."""
        return self.ownership == OWN

    @property
    def job_owned(self) -> bool:
        """A pod of a TPUJob's slice (a standalone TPUSlice's pods carry its own name as
        job name; a job's slices are always named ``<job>-<index>``)."""
        return self.job_name != self.slice_name

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def addressed(self) -> bool:
        """Its container runs where it can be reached: Running, with an IP."""
        return self.phase == "Running" and bool(self.pod_ip)

    @property
    def active(self) -> bool:
        return not self.terminal


def _worker_termination(
    statuses: list[ContainerStatus],
) -> tuple[int | None, str | None, str | None]:
    """Exit code, reason and finish time: the worker container's, else the first failing one."""
    ordered = sorted(statuses, key=lambda s: s.name != contract.WORKER_CONTAINER)
    chosen: Terminated | None = None
    for container in ordered:
        terminated = container.state.terminated if container.state else None
        if terminated is None:
            continue
        if chosen is None or (chosen.exitCode == 0 and terminated.exitCode != 0):
            chosen = terminated
    if chosen is None:
        return None, None, None
    return chosen.exitCode, chosen.reason, chosen.finishedAt


def _worker_state(statuses: list[ContainerStatus]) -> tuple[str | None, int | None]:
    """When the worker container started running (while it runs), and its exit code once
    it has terminated."""
    for container in statuses:
        if container.name == contract.WORKER_CONTAINER and container.state is not None:
            running, terminated = container.state.running, container.state.terminated
            return (
                running.startedAt if running is not None else None,
                terminated.exitCode if terminated is not None else None,
            )
    return None, None


NO_CONDITION = Condition()
NO_POD_STATUS = PodStatus()
NO_POD_SPEC = PodSpec()


def slice_owner(refs: list[OwnerReference] | None) -> str | None:
    """UID of the TPUSlice a pod's controller owner reference names, if it names one."""
    for ref in refs or ():
        if (
            ref.controller
            and ref.kind == contract.SLICE_KIND
            and ref.apiVersion.split("/")[0] == contract.GROUP
        ):
            return ref.uid
    return None


def pod_view(
    body: PodDocument | Mapping[str, Any],
    trusts: Trusts | None = None,
    carries: Carries | None = None,
) -> PodView | None:
    """The view of a worker pod, or None for a pod without the operator's labels.

    ``body``: the pod as decoded by the watch (``state/documents.py``), or as plain JSON
    (converted first). ``trusts``: how the pod is told apart from look-alikes (every pod
    is ``OWN`` without it: tests and tools that build views of pods they made).
    ``carries``: the attempt an own pod belongs to (its label's without it)."""
    pod = body if isinstance(body, PodDocument) else to_document(body, PodDocument)
    meta = pod.metadata or EMPTY_METADATA
    labels = meta.labels or {}
    slice_name = labels.get(contract.LABEL_SLICE_NAME)
    if not slice_name:
        return None
    owner = slice_owner(meta.ownerReferences)
    job_name = labels.get(contract.LABEL_JOB_NAME, slice_name)
    ownership = (
        OWN
        if trusts is None
        else trusts(
            owner, meta.namespace or "", slice_name, job_name, meta.deletionTimestamp is not None
        )
    )
    status = pod.status or NO_POD_STATUS
    conditions = {c.type: c for c in status.conditions or ()}
    ready_condition = conditions.get("Ready", NO_CONDITION)
    ready = ready_condition.status == "True"
    not_ready_since = (
        ready_condition.lastTransitionTime if ready_condition.status == "False" else None
    )
    disruption_condition = conditions.get("DisruptionTarget", NO_CONDITION)
    disruption = (
        disruption_condition.reason or "DisruptionTarget"
        if disruption_condition.status == "True"
        else None
    )
    if disruption is None and status.reason in _DISRUPTION_STATUS_REASONS:
        disruption = status.reason
    scheduled = conditions.get("PodScheduled", NO_CONDITION)
    unschedulable = (
        scheduled.message or "Unschedulable"
        if scheduled.status == "False" and scheduled.reason == "Unschedulable"
        else None
    )
    containers = status.containerStatuses or []
    exit_code, exit_reason, finished = _worker_termination(containers)
    worker_started, worker_exit = _worker_state(containers)
    spec = pod.spec or NO_POD_SPEC
    awaiting_scheduler = (
        spec.schedulerName or DEFAULT_SCHEDULER
        if "PodScheduled" not in conditions
        and not spec.nodeName
        and (status.phase or "Pending") == "Pending"
        and meta.deletionTimestamp is None
        else None
    )
    selector = spec.nodeSelector or {}
    pool = selector.get(contract.NODE_LABEL_NODEPOOL)
    if pool is None and selector.get(contract.NODE_LABEL_SLICE_POOL):
        pool = contract.claim_ref(selector[contract.NODE_LABEL_SLICE_POOL])
    label_attempt = _int(labels.get(contract.LABEL_RESTART_ATTEMPT), 0)
    attempt = (
        carries(owner, label_attempt) if carries is not None and ownership == OWN else label_attempt
    )
    return PodView(
        name=meta.name,
        namespace=_shared(meta.namespace or ""),
        uid=meta.uid,
        job_name=_shared(job_name),
        slice_name=_shared(slice_name),
        slice_index=_int(labels.get(contract.LABEL_SLICE_INDEX), 0),
        worker_index=_int(labels.get(contract.LABEL_WORKER_INDEX)),
        attempt=attempt,
        phase=_shared(status.phase or "Pending"),
        ready=ready,
        deletion_deadline=_shared(meta.deletionTimestamp),
        node=_shared(spec.nodeName),
        pool=_shared(pool),
        pod_ip=status.podIP,
        exit_code=exit_code,
        exit_reason=_shared(exit_reason),
        disruption=_shared(disruption),
        unschedulable=_shared(unschedulable),
        created=_shared(meta.creationTimestamp),
        started=_shared(status.startTime),
        finished=_shared(finished),
        worker_exit=worker_exit,
        supervised=(meta.annotations or {}).get(contract.ANNOTATION_SUPERVISED) == "true",
        consumes=_shared(
            (meta.annotations or {}).get(contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST)
        ),
        not_ready_since=_shared(not_ready_since),
        worker_started=_shared(worker_started),
        owner=owner,
        ownership=ownership,
        awaiting_scheduler=_shared(awaiting_scheduler),
        label_attempt=label_attempt if label_attempt != attempt else -1,
    )


class LostNodes(frozenset[str]):
    """Nodes lost to the pods on them (not Ready, gone, or in an Ironwood cube GKE marked
    unusable), with why for those where it is not that the node is not ready."""

    why: Mapping[str, str]

    def __new__(cls, names: Iterable[str], why: Mapping[str, str] | None = None) -> LostNodes:
        made = super().__new__(cls, names)
        made.why = dict(why or {})
        return made


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
    labels: Mapping[str, str] = field(default_factory=dict)
    """The node's labels but its hostname (spare node pools are selected by them; shared
    by every node with the same ones: ``pool_labels``)."""
    partitions: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Ironwood dynamic slicing: partition shape (4x4x4, 2x2x2, ...) -> (id, state), from
    the ``cloud.google.com/gke-tpu-partition-<shape>-id`` and ``-state`` labels."""
    terminates_at: float | None = None
    """When GKE takes the VM back (Unix time): the end of a flex-start VM's run duration,
    from its ``node.gke.io/machine-termination-datetime`` annotation."""


# GKE's notices of host events on TPU and GPU nodes ("Manage GKE node disruption for GPUs
# and TPUs", cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu):
# upcoming maintenance as a node label holding its Unix start time, maintenance under way
# as another label, and the taint GKE's maintenance handler sets before it terminates the
# node (graceful termination). Spot preemption shows as the same taint and as pods'
# DisruptionTarget condition.
MAINTENANCE_TIME_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"


def maintenance_notice(labels: Mapping[str, str], taints: list[Taint]) -> str | None:
    """The node's disruption notice in words (one per event: the words change with it)."""
    for taint in taints:
        if taint.key == IMPENDING_TERMINATION_TAINT:
            suffix = f" since {taint.timeAdded}" if taint.timeAdded else ""
            return f"impending termination (taint {IMPENDING_TERMINATION_TAINT}{suffix})"
    active = labels.get(ACTIVE_MAINTENANCE_LABEL)
    if active and active.lower() not in ("false", "0"):
        return f"maintenance under way ({ACTIVE_MAINTENANCE_LABEL}={active})"
    when = labels.get(MAINTENANCE_TIME_LABEL)
    if when:
        return f"maintenance scheduled at {when} ({MAINTENANCE_TIME_LABEL})"
    return None


NO_NODE_STATUS = NodeStatus()
NO_NODE_SPEC = NodeSpec()


class _Labels(dict[str, str]):
    """A plain dict that can be weakly referenced (``_POOL_LABELS`` keeps them so)."""

    __slots__ = ("__weakref__",)


_POOL_LABELS: weakref.WeakValueDictionary[frozenset[tuple[str, str]], _Labels] = (
    weakref.WeakValueDictionary()
)


def pool_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """A node's labels but its hostname (``kubernetes.io/hostname``, one node's by
    definition, never a pool's), as one shared dict for every node that has the same ones.

    The nodes of a pool carry the same labels, and each node's view held its own copy of
    every key and value: about 1.5 KB per node, 15 MiB of the operator's 10,240-node
    caches. A dict shared this way is dropped once no view holds it. Callers must not
    change it."""
    items = frozenset(
        (_shared(key), _shared(value))
        for key, value in labels.items()
        if key != contract.NODE_LABEL_HOSTNAME
    )
    shared = _POOL_LABELS.get(items)
    if shared is None:
        shared = _POOL_LABELS[items] = _Labels(items)
    return shared


def node_view(body: NodeDocument | Mapping[str, Any]) -> NodeView:
    """The view of a TPU node (``body`` as ``pod_view`` takes it)."""
    node = body if isinstance(body, NodeDocument) else to_document(body, NodeDocument)
    meta = node.metadata or EMPTY_METADATA
    labels = meta.labels or {}
    status = node.status or NO_NODE_STATUS
    spec = node.spec or NO_NODE_SPEC
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    allocatable = status.allocatable or {}
    return NodeView(
        name=_shared(meta.name),
        pool=_shared(labels.get(contract.NODE_LABEL_NODEPOOL)),
        accelerator=_shared(labels.get(contract.NODE_LABEL_ACCELERATOR)),
        topology=_shared(labels.get(contract.NODE_LABEL_TOPOLOGY)),
        ready=ready,
        unschedulable=bool(spec.unschedulable),
        spot=labels.get(contract.NODE_LABEL_SPOT) == "true",
        reservation=_shared(labels.get(contract.NODE_LABEL_RESERVATION)),
        tpu_chips=_int(allocatable.get(contract.TPU_RESOURCE), 0),
        machine_type=_shared(labels.get(INSTANCE_TYPE_LABEL)),
        slice_pool=_shared(labels.get(contract.NODE_LABEL_SLICE_POOL)),
        disruption_notice=maintenance_notice(labels, spec.taints or []),
        partitions=partition_labels(labels),
        terminates_at=termination_time(meta.annotations),
        labels=pool_labels(labels),
    )


def termination_time(annotations: Mapping[str, str] | None) -> float | None:
    """When GKE takes the VM back (``node.gke.io/machine-termination-datetime``, RFC 3339),
    as Unix time; None without the annotation or with a value that is not a time."""
    value = (annotations or {}).get(contract.NODE_ANNOTATION_TERMINATION)
    if not value:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


NO_PARTITIONS: Mapping[str, tuple[str, str]] = {}


def partition_labels(labels: Mapping[str, str]) -> Mapping[str, tuple[str, str]]:
    """shape -> (partition id, state) from a node's partition labels."""
    prefix = contract.PARTITION_LABEL_PREFIX
    found: dict[str, tuple[str, str]] = {}
    for key, value in labels.items():
        if key.startswith(prefix) and key.endswith("-id"):
            shape = key[len(prefix) : -len("-id")]
            found[shape] = (_shared(value), labels.get(contract.partition_state_label(shape), ""))
    return found or NO_PARTITIONS
