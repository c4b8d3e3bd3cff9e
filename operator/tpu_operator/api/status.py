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
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"
    """Kueue-managed (kueue.x-k8s.io/queue-name): waiting for Kueue to admit the job, or
    evicted by Kueue and waiting to be admitted again. No pods, like Suspended."""


TERMINAL_PHASES: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ConditionType(StrEnum):
    """Condition types (standard Kubernetes conditions in ``status.conditions``)."""

    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    PODS_SCHEDULED = "PodsScheduled"
    STALLED = "Stalled"
    STRAGGLER = "Straggler"
    READY = "Ready"
    """TPUSlice: every worker of the current attempt is running."""
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
    FATAL_EXIT_CODE = "FatalExitCode"
    WORKER_CONFIG_ERROR = "WorkerConfigError"
    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    WAITING_TIMEOUT = "WaitingTimeout"
    """The job waited for capacity longer than spec.waitingTimeoutSeconds."""
    INVALID_SPEC = "InvalidSpec"
    # Lifecycle, placement and progress (conditions and events).
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    NOT_SUSPENDED = "NotSuspended"
    ACTIVE = "Active"
    NODE_POOLS_ASSIGNED = "NodePoolsAssigned"
    WAITING_FOR_NODE_POOLS = "WaitingForNodePools"
    NODE_POOL_GONE = "NodePoolGone"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULED = "Scheduled"
    RESTARTING = "Restarting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    PROGRESSING = "Progressing"
    STRAGGLER = "Straggler"
    NO_STRAGGLER = "NoStraggler"
    PODS_STOPPING = "PodsStopping"
    ALL_PODS_STOPPED = "AllPodsStopped"
    SERVICE_CONFLICT = "ServiceConflict"
    PODS_FORBIDDEN = "PodsForbidden"
    """The apiserver refuses the worker pods: an admission plugin or policy (a missing
    ServiceAccount or PriorityClass, a quota, Pod Security, a ValidatingAdmissionPolicy or
    webhook). Retried until the cause is gone (PodsScheduled False, and the slice's Ready
    condition)."""
    NO_SCHEDULER = "NoScheduler"
    """No scheduler has looked at any pod of the attempt for a while: the scheduler their
    ``schedulerName`` names does not run (or none does). The pods wait for it."""
    SLICE_CREATION_FAILED = "SliceCreationFailed"
    """The apiserver refuses the job's TPUSlices (an admission policy or webhook, a
    quota on TPUSlices): retried until the cause is gone. A TPUSlice it rejects as
    invalid fails the job with InvalidSpec and the apiserver's message."""
    POD_CREATION_FAILED = "PodCreationFailed"
    """Creating the worker pods failed for another reason the apiserver gave (an
    unavailable admission webhook, throttling); retried like PodsForbidden."""
    # Kueue (docs/tasks/kueue.md); Kueue's own reasons are used as they are for the conditions.
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    WORKLOAD_EVICTED = "WorkloadEvicted"
    """Kueue evicted the job's Workload (preemption, ...): its pods are stopped."""
    WORKLOAD_CREATED = "WorkloadCreated"
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


class ResolvedShape(ApiModel):
    """The slice shape as the catalog resolved it."""

    accelerator: str
    topology: str
    type: str
    """Short TPU type (TPU_ACCELERATOR_TYPE), e.g. v5p-128."""
    chips: int
    chips_per_host: int
    hosts: int

    @classmethod
    def of(cls, shape: SliceShape) -> ResolvedShape:
        return cls(
            accelerator=shape.accelerator,
            topology=shape.topology,
            type=shape.short_type,
            chips=shape.chips,
            chips_per_host=shape.chips_per_host,
            hosts=shape.hosts,
        )
