"""Status vocabulary shared by TPUJob and TPUSlice: phases, condition types and reasons.

Every phase, condition type and reason the operator writes is defined here once; the
reconcilers, the failure policy, metrics and docs use these names. ``StrEnum`` members
are plain strings on the wire (``Phase.RUNNING == "Running"``).
"""

from __future__ import annotations

from enum import StrEnum

from tpu_operator.api.common import ApiModel
from tpu_operator.catalog import SliceShape


class Phase(StrEnum):
    """Lifecycle phase of a TPUJob or TPUSlice."""

    PENDING = "Pending"
    """Waiting for node pools, or creating the attempt's slices and pods."""
    STARTING = "Starting"
    """The attempt's pods exist; not every worker runs yet."""
    RUNNING = "Running"
    """Every worker of the attempt has run; the phase holds until the attempt ends."""
    RESTARTING = "Restarting"
    """An attempt ended: the old pods or processes stop and the restart backoff runs before the
    next attempt."""
    SUCCEEDED = "Succeeded"
    """Terminal: the job succeeded under its successPolicy."""
    FAILED = "Failed"
    """Terminal: the job failed; the Failed condition says why."""
    SUSPENDED = "Suspended"
    """spec.suspend is true: no pods run; node pools are held until the old pods are gone."""
    QUEUED = "Queued"
    """Kueue-managed (kueue.x-k8s.io/queue-name): waiting for Kueue to admit the job, or
    evicted by Kueue and waiting to be admitted again. No pods, like Suspended."""


TERMINAL_PHASES: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ConditionType(StrEnum):
    """Condition types (standard Kubernetes conditions in ``status.conditions``)."""

    RUNNING = "Running"
    """True while every worker of the attempt runs; the reason is the phase."""
    RESTARTING = "Restarting"
    """True between an attempt's end and the next attempt's start."""
    SUSPENDED = "Suspended"
    """True while spec.suspend is (TPUSlice: the slice is suspended)."""
    SUCCEEDED = "Succeeded"
    """True once the job succeeded."""
    FAILED = "Failed"
    """True once the job failed; the reason says why (MaxRestartsExceeded, FatalExitCode, ...)."""
    INVALID = "Invalid"
    """True when the spec or template cannot be read; the message names each field."""
    PODS_SCHEDULED = "PodsScheduled"
    """False while the job waits for capacity, with the reason (WaitingForNodePools,
    Unschedulable, PodsForbidden, ...); True once every pod is placed."""
    STALLED = "Stalled"
    """True when no training step came for monitoring.stallTimeout; False (Progressing) while
    steps advance."""
    STRAGGLER = "Straggler"
    """True while a worker is much slower than its slice (named in the message)."""
    READY = "Ready"
    """TPUSlice: every worker of the current attempt is running."""
    NODE_POOLS_HEALTHY = "NodePoolsHealthy"
    """Set once a slice of the job moved off a broken node pool: False (NodePoolUnhealthy)
    while a pool it moved off is unhealthy (status.brokenNodePools names each), True once
    every such pool is healthy again or gone."""
    PODS_STOPPED = "PodsStopped"
    """A suspended or finished object: True once none of its pods exists any more (its
    node pools and chips are free); False with the count while they stop."""
    QUEUED = "Queued"
    """Kueue-managed job: True while its Workload waits for admission (reason and message
    are Kueue's: why it does not fit yet)."""
    ADMITTED = "Admitted"
    """Kueue-managed job: True while Kueue admits its Workload (quota reserved, checks
    passed); the message names the ClusterQueue and flavors."""
    EVICTED = "Evicted"
    """Kueue-managed job: True from Kueue's eviction (reason: Preempted,
    PodsReadyTimeout, ClusterQueueStopped ...) until it is admitted again."""


class Reason(StrEnum):
    """Reasons: of a failure (``Failure.reason``, ``restartsByReason``), of a condition,
    and of an event. One name means one thing wherever it appears."""

    # What ended an attempt (Failure.reason of lastFailure / a slice's failure).
    WORKER_FAILED = "Failed"
    """A worker container exited non-zero (the exit code is in the failure)."""
    EVICTED = "Evicted"
    """A worker pod was evicted or preempted (a disruption)."""
    NODE_LOST = "NodeLost"
    """A worker's node became not ready or disappeared (a disruption)."""
    POD_DELETED = "PodDeleted"
    """A running worker pod was deleted or vanished."""
    STALLED = "Stalled"
    """No training step for longer than monitoring.stallTimeout."""
    SUPERVISOR_UNREACHABLE = "SupervisorUnreachable"
    """The supervisor of a running worker did not answer on its control channel (the
    next attempt recreates the pods)."""
    IN_PLACE_TIMEOUT = "InPlaceRestartTimeout"
    """An in-place restart did not reach Running within
    failurePolicy.inPlaceTimeoutSeconds (the next attempt recreates the pods)."""
    # Why a job or slice failed for good (the Failed condition's reason).
    MAX_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
    """A counted restart beyond failurePolicy.maxRestarts."""
    FATAL_EXIT_CODE = "FatalExitCode"
    """A worker's exit code matched a failurePolicy rule with action FailJob."""
    WORKER_CONFIG_ERROR = "WorkerConfigError"
    """A worker exited 78: its settings or the pod env are invalid, which no restart fixes."""
    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    """The apiserver rejected a worker pod built from the template, or the template cannot be
    read."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """The job was active longer than spec.activeDeadlineSeconds."""
    WAITING_TIMEOUT = "WaitingTimeout"
    """The job waited for capacity longer than spec.waitingTimeoutSeconds."""
    INVALID_SPEC = "InvalidSpec"
    """The spec cannot be read, or the apiserver rejected a TPUSlice as invalid."""
    # Lifecycle, placement and progress (conditions and events).
    SUSPENDED = "Suspended"
    """spec.suspend is true: the pods are being deleted."""
    RESUMED = "Resumed"
    """A suspended or evicted job resumed as a new attempt."""
    NOT_SUSPENDED = "NotSuspended"
    """The job was never suspended."""
    ACTIVE = "Active"
    """A TPUSlice that is not suspended."""
    NODE_POOLS_ASSIGNED = "NodePoolsAssigned"
    """The node pools each slice got (or GKE created for it)."""
    WAITING_FOR_NODE_POOLS = "WaitingForNodePools"
    """No free node pool fits every multi-host slice, or GKE has not yet created the pools the
    slices asked for."""
    PROVISIONING_FAILED = "ProvisioningFailed"
    """A ProvisioningRequest the operator made for a slice failed, or its capacity expired
    or was revoked before the slice's pods took it: a new request follows."""
    NODE_POOL_GONE = "NodePoolGone"
    """A recorded node pool has no nodes left (deleted, or scaled to zero)."""
    NODE_POOL_UNHEALTHY = "NodePoolUnhealthy"
    """A slice whose pods a restart recreates had a node pool with a VM not ready or
    cordoned: the slice moved to a free healthy pool of its shape (or, with none free,
    waits for the repair). An unhealthy pool is given to no slice until it is healthy."""
    NODE_POOLS_HEALTHY = "NodePoolsHealthy"
    """Every node pool a slice of the job moved off (status.brokenNodePools) is healthy
    again, or gone."""
    SLICES_DROPPED = "SlicesDropped"
    """(Event.) An elastic job (spec.elastic) restarts without the slices a restart could
    not bring back (their node pool unhealthy, or their failures there at
    failurePolicy.maxSliceFailuresPerPool, with no free healthy pool to move to): the
    next attempt trains on the others (status.droppedSlices)."""
    SLICES_RESTORED = "SlicesRestored"
    """An elastic job that ran without some slices has a healthy node pool for each of
    them again: once its workers were asked to checkpoint, it restarts on all numSlices
    (a restart not counted against maxRestarts)."""
    UNSCHEDULABLE = "Unschedulable"
    """The scheduler cannot place the attempt's pods (its message is in the condition)."""
    SCHEDULED = "Scheduled"
    """Every pod of the attempt is placed."""
    WAIT_ENDED = "WaitEnded"
    """(Event.) The job waited for capacity (PodsScheduled False, or Queued by Kueue) and
    no longer does: how long, and what for."""
    CAPACITY_FALLBACK = "CapacityFallback"
    """(Event.) The job waited for a node pool longer than the next step of
    spec.placement.fallbacks allows and now asks for that step's capacity."""
    RESTARTING = "Restarting"
    """An attempt ended and the gang restarts."""
    RUNNING = "Running"
    """Every worker of the attempt runs."""
    SUCCEEDED = "Succeeded"
    """The job succeeded."""
    FAILED = "Failed"
    """The job failed (the Failed condition's reason says why)."""
    INVALID = "Invalid"
    """The spec or template cannot be read."""
    PROGRESSING = "Progressing"
    """Training steps advance (the Stalled condition is False)."""
    STRAGGLER = "Straggler"
    """A worker is much slower than the others of its slice."""
    NO_STRAGGLER = "NoStraggler"
    """No worker stands out."""
    PODS_STOPPING = "PodsStopping"
    """A suspended or finished object still has pods stopping."""
    ALL_PODS_STOPPED = "AllPodsStopped"
    """No pod of the object is left: its node pools and chips are free."""
    SERVICE_CONFLICT = "ServiceConflict"
    """The job's headless Service name is taken by another object."""
    PODS_FORBIDDEN = "PodsForbidden"
    """The apiserver refuses the worker pods: an admission plugin or policy (a missing
    ServiceAccount or PriorityClass, a quota, Pod Security, a ValidatingAdmissionPolicy or
    webhook). Retried until the cause is gone (PodsScheduled False, and the slice's Ready
    condition)."""
    NO_SCHEDULER = "NoScheduler"
    """No scheduler has looked at any pod of the attempt for a while, and the scheduler
    their ``schedulerName`` names has looked at no other pod of the operator's either: it
    does not run (or none does). The pods wait for it."""
    SLICE_CREATION_FAILED = "SliceCreationFailed"
    """The apiserver refuses the job's TPUSlices (an admission policy or webhook, a
    quota on TPUSlices): retried until the cause is gone. A TPUSlice it rejects as
    invalid fails the job with InvalidSpec and the apiserver's message."""
    POD_CREATION_FAILED = "PodCreationFailed"
    """Creating the worker pods failed for another reason the apiserver gave (an
    unavailable admission webhook, throttling); retried like PodsForbidden."""
    # Kueue (docs/tasks/kueue.md); Kueue's own reasons are used as they are for the
    # conditions.
    QUEUED = "Queued"
    """Kueue has not admitted the job's Workload (Kueue's own reason is in the Queued
    condition)."""
    ADMITTED = "Admitted"
    """Kueue admitted the job's Workload."""
    WORKLOAD_EVICTED = "WorkloadEvicted"
    """Kueue evicted the job's Workload (preemption, ...): its pods are stopped."""
    WORKLOAD_CREATED = "WorkloadCreated"
    """The operator created the job's Kueue Workload."""
    ADMISSION_CONFLICT = "AdmissionConflict"
    """Kueue admitted the job on terms its pods cannot take: a ResourceFlavor's node label
    or an admission check's podSetUpdate sets a node selector (label, annotation) key to
    another value than the job's own or another update's. The job fails (as Kueue's own
    jobs fail to start) and its Workload is marked Finished, which frees the quota."""
    # In-place restarts (docs/concepts/attempts-and-restarts.md).
    CHECKPOINT_REQUESTED = "CheckpointRequested"
    """GKE announced maintenance or termination of a node of a running job: its workers
    were asked to checkpoint now (once per notice)."""
    IN_PLACE_FALLBACK = "InPlaceFallback"
    """An in-place restart could not stop every training process: the pods are recreated
    instead."""
    IN_PLACE_REFUSED = "InPlaceRestartsRefused"
    """The workers could run the supervisor, but the operator does not let them: with the
    control-port NetworkPolicy, hostNetwork pods (their restarts recreate the pods)."""


FAILURE_REASONS: tuple[Reason, ...] = (
    Reason.WORKER_FAILED,
    Reason.EVICTED,
    Reason.NODE_LOST,
    Reason.POD_DELETED,
    Reason.STALLED,
    Reason.SUPERVISOR_UNREACHABLE,
    Reason.IN_PLACE_TIMEOUT,
)
"""The values of ``Failure.reason`` for what ended an attempt (restartsByReason keys)."""

DISRUPTION_REASONS: frozenset[Reason] = frozenset({Reason.EVICTED, Reason.NODE_LOST})
"""Failures caused by the platform, not the workload (not counted by default)."""


class RestartKind(StrEnum):
    """How a gang restart brings up the next attempt."""

    IN_PLACE = "InPlace"
    """The pods stay: each worker's supervisor stops its training process and, once every
    process of the job has stopped, starts the next attempt's."""
    RECREATE = "Recreate"
    """Every pod is deleted and, once all are gone, created again."""
    MIXED = "Mixed"
    """The pods of the slices the failure touched (a pod or node lost, an eviction, a dead
    container) are recreated; the other slices' supervisors restart their training
    processes in the pods they have (``status.recreatedSlices``). The next attempt's
    processes start once every old one has stopped and the recreated pods run."""


class ResolvedShape(ApiModel):
    """The slice shape as the catalog resolved it."""

    accelerator: str
    topology: str
    type: str
    """Short TPU type (TPU_ACCELERATOR_TYPE), e.g. v5p-128."""
    chips: int
    chips_per_host: int
    hosts: int
    machine_type: str | None = None
    """GKE machine type of its VMs, e.g. ct6e-standard-4t (for v5e and v6e 2x4, the one
    the operator chose when slice.chipsPerHost is unset)."""

    @classmethod
    def of(cls, shape: SliceShape) -> ResolvedShape:
        return cls(
            accelerator=shape.accelerator,
            topology=shape.topology,
            type=shape.short_type,
            chips=shape.chips,
            chips_per_host=shape.chips_per_host,
            hosts=shape.hosts,
            machine_type=shape.machine_type,
        )
