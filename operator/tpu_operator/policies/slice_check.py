"""The ``accelerator.gke.io/slice`` admission check for the Kueue Workloads of TPUJobs (pure).

On GKE Ironwood (tpu7x) dynamic slicing through Kueue, a ClusterQueue lists an
AdmissionCheck whose ``controllerName`` is ``accelerator.gke.io/slice``. GKE's controller
for it (the Kueue slice controller, AI-Hypercomputer/xpk branch ``slice-main``, directory
``slice/``) serves only Workloads owned by a JobSet, a Job or a LeaderWorkerSet, so the
operator serves that check for the Workloads its TPUJobs own, the way GKE's does with its
feature gates at their defaults (``UseRetryMechanismForSliceCreation`` and
``FailOnUntoleratedDegradedSlice`` off):

- Slice names, annotations and the state of a Slice: ``internal/core/slice.go``
  (``SliceName``, ``SliceWithMetadata``, ``isStale``, ``isError``,
  ``BuildCreationEventMessage``), ``internal/core/core.go`` (``GetSliceState``,
  ``SliceStates``), ``internal/core/constants.go``.
- Partitions from the topology assignment, cut into one chunk per Slice:
  ``internal/topology/topology.go`` (``ParseAssignment``) and ``syncSlicesForAssignment``.
- The check's states, messages, the ``TPUSliceFailure`` condition and which Slices are made
  or deleted: ``internal/controller/workload_controller.go`` (``Reconcile``,
  ``syncSlicesForAssignment``, ``validatePartitionConflicts``, ``validatePartitionCount``,
  ``evictWorkload``, ``updateWorkloadStatus``, ``prepareAdmissionCheckStatus``,
  ``buildAdmissionCheckMessage``); message limits from ``internal/util/api``.

One rule is the operator's own: a partition of the admission whose nodes' state label
turned other than HEALTHY or DEGRADED makes the check ``Retry`` (``RuntimeFailure``), so
Kueue places the job again without waiting for GKE to fail the formed Slice.

Where the operator differs from GKE's controller in form, not in effect: it creates no
Slice in a pass that ends in ``Retry`` (GKE's creates and then deletes it), and it waits,
rather than acts, while a host of the assignment lacks its partition label or the ids do
not split evenly into the Slices (``partitions_from_assignment`` is None).

Pure: the reconciler reads the Workload, the Slices and the nodes, writes the check entry
(only when ``decide`` returns a state), and creates or deletes what the plan says.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_operator import contract, timestamps
from tpu_operator.builders.workload import HOSTNAME_LEVEL, _domains

CONTROLLER_NAME = "accelerator.gke.io/slice"
OWNER_NAMESPACE = "accelerator.gke.io/owner-workload-namespace"
OWNER_NAME = "accelerator.gke.io/owner-workload-name"
OWNER_POD_SET = "accelerator.gke.io/owner-podset-name"
RETRY_SECONDS = 10
"""GKE's ``--retry-delay-on-slice-failure`` default: the check's ``requeueAfterSeconds``."""
ACTIVATION_TIMEOUT = 180.0
"""GKE's ``--activation-timeout`` default: a Slice not formed after this long is STALE."""
RECHECK_SECONDS = 2.0
"""How often the operator looks at forming Slices again."""

TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
"""The node label a formed Slice's nodes carry; the check's podSetUpdate selects it."""
FAILURE_CONDITION = "TPUSliceFailure"
"""The Workload condition GKE sets when the check goes Retry."""
DELETION, CONFIGURATION_FAILURE, RUNTIME_FAILURE = (
    "Deletion",
    "ConfigurationFailure",
    "RuntimeFailure",
)
SLICES_CREATED, FAILED_CREATE_SLICE = "SlicesCreated", "FailedCreateSlice"
ADMISSION_CHECK_UPDATED = "AdmissionCheckUpdated"

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"

CREATED, ACTIVATING, ACTIVE, ACTIVE_DEGRADED = "CREATED", "ACTIVATING", "ACTIVE", "ACTIVE_DEGRADED"
FAILED, DELETED, STALE = "FAILED", "DELETED", "STALE"
SLICE_STATES = (CREATED, ACTIVATING, ACTIVE, ACTIVE_DEGRADED, FAILED, DELETED, STALE)
"""GKE's ``core.SliceStates``: the order the check message lists them in."""

_MAX_NAME = 49
_HASH_LENGTH = 5
_READY_CONDITION = "Ready"
_FAILED_REASONS = ("FAILED", "SliceCreationFailed")
_MAX_CONDITION_MESSAGE = 32 * 1024
_MAX_EVENT_MESSAGE = 1024


def gke_slice_name(namespace: str, workload: str, pod_set: str, index: int) -> str:
    """Byte-for-byte GKE's core.SliceName (hashing names over 49 characters)."""
    name = f"{namespace}-{workload}-{pod_set}-{index}".encode()
    if len(name) <= _MAX_NAME:
        return name.decode()
    digest = hashlib.sha256(name).hexdigest()[:_HASH_LENGTH]
    return f"{name[: _MAX_NAME - (_HASH_LENGTH + 1)].decode(errors='replace')}-{digest}"


def _ready_condition(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (body.get("status") or {}).get("conditions") or ():
        if cond.get("type") == _READY_CONDITION:
            return dict(cond)
    return None


def _time(value: Any) -> dt.datetime | None:
    try:
        return timestamps.parse(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _older_than_timeout(value: Any, now: dt.datetime) -> bool:
    moment = _time(value)
    return moment is not None and (now - moment).total_seconds() >= ACTIVATION_TIMEOUT


def slice_state(body: Mapping[str, Any], now: dt.datetime) -> str:
    """GKE's seven states: "DELETED", "FAILED", "STALE", "ACTIVE", "ACTIVE_DEGRADED",
    "CREATED", "ACTIVATING" (GetSliceState, default feature gates: retry-on-failure gate off,
    so SliceCreationFailed counts as FAILED)."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return DELETED
    cond = _ready_condition(body)
    if cond is not None and cond.get("status") != "True" and cond.get("reason") in _FAILED_REASONS:
        return FAILED
    if cond is None:
        if _older_than_timeout((body.get("metadata") or {}).get("creationTimestamp"), now):
            return STALE
        return CREATED
    if cond.get("status") == "False" and _older_than_timeout(cond.get("lastTransitionTime"), now):
        return STALE
    if cond.get("status") == "True" and cond.get("reason") in (ACTIVE, ACTIVE_DEGRADED):
        return str(cond["reason"])
    return ACTIVATING


def partitions_from_assignment(
    topology_assignment: Mapping[str, Any],
    partition_of: Mapping[str, str],
    slices: int,
) -> tuple[tuple[str, ...], ...] | None:
    """GKE's ParseAssignment + chunking: partition ids in first-appearance order over the
    assignment's hostname-level domains, cut into `slices` equal chunks (slice i gets chunk
    i). None when the assignment has no hostname level, a host has no partition id, or the
    ids do not split evenly."""
    levels = list(topology_assignment.get("levels") or ())
    if HOSTNAME_LEVEL not in levels or slices < 1:
        return None
    ids: list[str] = []
    for host, _pods in _domains(dict(topology_assignment), levels.index(HOSTNAME_LEVEL)):
        pid = partition_of.get(host)
        if not pid:
            return None
        if pid not in ids:
            ids.append(pid)
    if not ids or len(ids) % slices:
        return None
    size = len(ids) // slices
    return tuple(tuple(ids[i * size : (i + 1) * size]) for i in range(slices))


@dataclass(frozen=True)
class CheckFacts:
    """What the check of one Workload is decided from."""

    check: str
    """The Workload's admission check name (entry in status.admissionChecks)."""
    current: Mapping[str, Any]
    """That entry as read (state, message, podSetUpdates...)."""
    namespace: str
    workload: str
    """The Workload's name."""
    pod_set: str
    accelerator: str
    """e.g. ``tpu7x``: the Slices' ``spec.type``."""
    topology: str
    """The slice topology, e.g. ``4x4x8``."""
    partitions_per_slice: int
    """``placement/dynamic.partitions_needed(shape)``."""
    wanted: tuple[tuple[str, ...], ...] | None
    """``partitions_from_assignment`` of the admission; None: no usable assignment (quota not
    reserved, no topology assignment, a host without the label)."""
    release: bool
    """The Workload is evicted, finished, deactivated or being deleted."""
    pods_gone: bool
    """The job has no pod left (its Slices may go)."""
    mine: Mapping[str, Mapping[str, Any]]
    """Name -> Slice body, every Slice annotated with this workload (OWNER_* annotations)."""
    taken: Mapping[str, str]
    """Partition id -> Slice name, over every Slice in the cluster (anyone's)."""
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    """Partition id -> state, for partitions of ``wanted`` whose nodes' state label is not
    HEALTHY/DEGRADED."""
    now: dt.datetime = field(default_factory=timestamps.now)


@dataclass(frozen=True)
class CheckPlan:
    """What to write and do; the caller writes the check entry only when ``state`` is set."""

    state: str | None = None
    """New check state ("Pending", "Ready", "Retry") or None: leave the entry as it is."""
    message: str = ""
    requeue_after: int | None = None
    """``requeueAfterSeconds`` for Retry."""
    pod_set_updates: tuple[dict[str, Any], ...] = ()
    """For Ready: the pods select the nodes of the formed Slices."""
    failure: tuple[str, str] | None = None
    """(reason, message) for the Workload condition TPUSliceFailure=True."""
    create: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(Slice name, partition ids) to create."""
    delete: tuple[str, ...] = ()
    """Slice names to delete."""
    event: tuple[str, str] | None = None
    """(reason, message), e.g. ("SlicesCreated", 'The Slices "a", "b" have been created')."""
    recheck: float | None = None
    """Look again after this long (forming, retrying)."""
    updated: tuple[str, str] | None = None
    """GKE's ``AdmissionCheckUpdated`` event when the state changes (reason, message)."""


def _go_quote(text: str) -> str:
    """Go's ``%q`` of a plain string (names and ids: printable ASCII)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _truncate(message: str, limit: int) -> str:
    if len(message) <= limit:
        return message
    suffix = " ..."
    return message[: limit - len(suffix)] + suffix


def _retry(reason: str, message: str, delete: Sequence[str] = ()) -> CheckPlan:
    """GKE's ``evictWorkload``: Retry after RETRY_SECONDS with TPUSliceFailure=True."""
    message = _truncate(message, _MAX_CONDITION_MESSAGE)
    return CheckPlan(
        state=RETRY,
        message=message,
        requeue_after=RETRY_SECONDS,
        failure=(reason, message),
        delete=tuple(delete),
    )


def _check_message(states: Mapping[str, str], mine: Mapping[str, Mapping[str, Any]]) -> str:
    """GKE's ``buildAdmissionCheckMessage`` (default gates)."""
    counts = dict.fromkeys(SLICE_STATES, 0)
    for state in states.values():
        counts[state] += 1
    listed = [f"{counts[state]} {state}" for state in SLICE_STATES if counts[state]]
    message = (
        f"Slices are in states: {', '.join(listed)}"
        if listed
        else "Waiting for Slices to be created"
    )
    if counts[FAILED]:
        errors = []
        for name, state in sorted(states.items()):
            cond = _ready_condition(mine.get(name) or {}) if state == FAILED else None
            if cond is not None:
                errors.append(f"{name}: {cond.get('message', '')}")
        if errors:
            message += ". Errors: " + "; ".join(errors)
    return _truncate(message, _MAX_CONDITION_MESSAGE)


def _validate(facts: CheckFacts, to_create: Sequence[tuple[str, tuple[str, ...]]]) -> str | None:
    """GKE's ``validatePartitionConflicts`` (an id held by any other Slice, this
    Workload's included) and ``validatePartitionCount``, joined as ``errors.Join`` joins
    them; None when both pass."""
    errors = []
    conflicts = [
        f"{pid} (used by {facts.taken[pid]})"
        for name, ids in to_create
        for pid in ids
        if facts.taken.get(pid, name) != name
    ]
    if conflicts:
        quoted = " ".join(_go_quote(c) for c in conflicts)
        errors.append(f"partition IDs [{quoted}] are already used by existing Slices")
    wrong = [name for name, ids in to_create if len(ids) != facts.partitions_per_slice]
    if wrong:
        errors.append(f"incorrect number of partitions for slices: [{' '.join(wrong)}]")
    return "\n".join(errors) or None


def decide(facts: CheckFacts) -> CheckPlan:
    """The check's next state and the Slices to create or delete (GKE's ``Reconcile``)."""
    states = {name: slice_state(body, facts.now) for name, body in facts.mine.items()}
    live = tuple(sorted(name for name, state in states.items() if state != DELETED))
    current = str(facts.current.get("state") or "")

    if facts.release:
        if not live:
            return CheckPlan()
        if facts.pods_gone:
            return CheckPlan(delete=live)
        return CheckPlan(recheck=RECHECK_SECONDS)
    if current == RETRY:  # Kueue evicts the Workload and resets the check to Pending
        return CheckPlan(delete=live)
    if current == REJECTED or facts.wanted is None:
        return CheckPlan(recheck=None if current == REJECTED else RECHECK_SECONDS)

    desired = len(facts.wanted)
    if current == READY and (len(live) != len(states) or len(states) != desired):
        return _retry(DELETION, "Slice has been deleted", live)
    if len(live) != len(states):  # GKE waits for deleted Slices to be gone
        return CheckPlan(recheck=RECHECK_SECONDS)
    if facts.unhealthy:
        named = ", ".join(f"{pid} {state}" for pid, state in sorted(facts.unhealthy.items()))
        return _retry(RUNTIME_FAILURE, f"Partitions no longer HEALTHY or DEGRADED: {named}", live)

    to_create: list[tuple[str, tuple[str, ...]]] = []
    wrong: list[str] = []
    for index, ids in enumerate(facts.wanted):
        name = gke_slice_name(facts.namespace, facts.workload, facts.pod_set, index)
        body = facts.mine.get(name)
        if body is None:
            to_create.append((name, tuple(ids)))
        elif tuple((body.get("spec") or {}).get("partitionIds") or ()) != tuple(ids):
            wrong.append(name)
    invalid = _validate(facts, to_create) if to_create else None
    if invalid is not None:
        return _retry(CONFIGURATION_FAILURE, invalid, wrong)

    kept = {name: state for name, state in states.items() if name not in wrong}
    kept.update((name, CREATED) for name, _ids in to_create)
    bodies = dict(facts.mine)
    active = sum(1 for state in kept.values() if state in (ACTIVE, ACTIVE_DEGRADED))
    failed = sum(1 for state in kept.values() if state == FAILED)
    message = _check_message(kept, bodies)
    if active == desired:
        plan = CheckPlan(
            state=READY,
            message=message,
            pod_set_updates=(
                {"name": facts.pod_set, "nodeSelector": {TOPOLOGY_SELECTOR: facts.topology}},
            ),
        )
    elif failed:
        plan = _retry(RUNTIME_FAILURE, message)
    else:
        plan = CheckPlan(state=PENDING, message=message)

    if plan.state == RETRY:  # every Slice goes at once; none is made
        return replace(
            plan,
            delete=tuple(sorted({*wrong, *live})),
            updated=_updated(facts.check, current, RETRY),
        )
    delete = tuple(sorted({*wrong, *(name for name in kept if kept[name] in (FAILED, STALE))}))
    forming = any(state in (CREATED, ACTIVATING) for state in kept.values())
    unchanged = plan.state == current and plan.message == str(facts.current.get("message") or "")
    event = None
    if to_create:
        names = ", ".join(sorted(_go_quote(name) for name, _ids in to_create))
        event = (
            SLICES_CREATED,
            _truncate(f"The Slices {names} have been created", _MAX_EVENT_MESSAGE),
        )
    return CheckPlan(
        state=None if unchanged else plan.state,
        message="" if unchanged else plan.message,
        pod_set_updates=() if unchanged else plan.pod_set_updates,
        create=tuple(to_create),
        delete=delete,
        event=event,
        recheck=RECHECK_SECONDS if forming or delete or plan.state != READY else None,
        updated=None if plan.state == current else _updated(facts.check, current, str(plan.state)),
    )


def _updated(check: str, before: str, after: str) -> tuple[str, str]:
    return (
        ADMISSION_CHECK_UPDATED,
        f"Admission check {_go_quote(check)} updated state"
        f" from {_go_quote(before)} to {_go_quote(after)}",
    )


def create_failed(name: str, error: str) -> CheckPlan:
    """A Slice could not be created: the check stays Pending with the error (GKE's
    ``FailedCreateSlice``)."""
    message = f"Error creating Slice {_go_quote(name)}: {error}"
    return CheckPlan(
        state=PENDING,
        message=_truncate(message, _MAX_CONDITION_MESSAGE),
        event=(FAILED_CREATE_SLICE, _truncate(message, _MAX_EVENT_MESSAGE)),
        recheck=RECHECK_SECONDS,
    )


def failure_condition(
    plan: CheckPlan, condition: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The Workload's TPUSliceFailure condition to write with the plan's check state, given
    the current one (GKE's ``updateWorkloadStatus``): True with the plan's failure; False with
    "Previously: ..." when the check leaves Retry after a failure; None: leave it."""
    if plan.failure is not None:
        reason, message = plan.failure
        return {"type": FAILURE_CONDITION, "status": "True", "reason": reason, "message": message}
    if plan.state in (None, RETRY) or condition is None or condition.get("status") != "True":
        return None
    return {
        "type": FAILURE_CONDITION,
        "status": "False",
        "reason": condition.get("reason", ""),
        "message": _truncate(
            "Previously: " + str(condition.get("message", "")), _MAX_CONDITION_MESSAGE
        ),
    }


def slice_body(name: str, ids: Sequence[str], facts: CheckFacts) -> dict[str, Any]:
    """The Slice to create: accelerator.gke.io/v1beta1 Slice, the three OWNER_* annotations
    (GKE's), the operator's managed-by label; spec type/topology/partitionIds."""
    return {
        "apiVersion": contract.SLICE_API_VERSION,
        "kind": "Slice",
        "metadata": {
            "name": name,
            "annotations": {
                OWNER_NAMESPACE: facts.namespace,
                OWNER_NAME: facts.workload,
                OWNER_POD_SET: facts.pod_set,
            },
            "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
        },
        "spec": {"type": facts.accelerator, "topology": facts.topology, "partitionIds": list(ids)},
    }
