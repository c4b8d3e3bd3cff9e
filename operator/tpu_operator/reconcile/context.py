"""What every reconciler shares: API access, caches, events, pool reservations, metrics."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from tpu_operator import contract
from tpu_operator.api.conditions import now as utc_now
from tpu_operator.api.conditions import set_condition, stamp
from tpu_operator.api.status import Reason
from tpu_operator.builders.workload import KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL
from tpu_operator.placement.pools import NO_SPARES, Spares
from tpu_operator.policies.plan import Metrics, SliceRefusal
from tpu_operator.policies.slice_phase import PodRefusal
from tpu_operator.reconcile.expectations import CreatedPods, DeletedPods, PodsInFlight
from tpu_operator.reconcile.pacing import StatusPacer, clock_only
from tpu_operator.reconcile.supervisors import Supervisors
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.events import ObjectRef
from tpu_operator.runtime.kube import ApiError, Kube, namespaced

RETRY_AFTER_CONFLICT = 0.2
"""Seconds before a reconcile whose status write lost to a concurrent change (409) runs
again, on fresh data."""


class Events(Protocol):
    """Where reconcilers post events (posted after the status write succeeded)."""

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


class Enqueue(Protocol):
    def add(self, key: tuple[str, str], after: float = 0.0) -> None: ...


class NoMetrics:
    def pod_created(self, seconds: float) -> None:
        pass

    def restart(self, kind: str, reason: str) -> None:
        pass

    def time_to_running(self, seconds: float) -> None:
        pass

    def waited(self, reason: str, seconds: float) -> None:
        pass

    def slice_moved(self, to: str) -> None:
        pass


@dataclass
class Reservations:
    """Node pools promised to a holder but maybe not yet visible in the caches.

    A reservation is made before the holder's status write (so two jobs reconciled at the
    same time cannot pick the same pool). The holder's next successful write replaces its
    reservations with the pools that write recorded (``hold``), or drops them when it
    holds none any more (``release``, also when the holder is gone). A write that fails
    keeps them: it may have lost to the holder's own earlier write of the same pools, one
    the caches do not show yet, and nothing else would hold those pools until they do.
    """

    by_pool: dict[str, str] = field(default_factory=dict)
    by_holder: dict[str, set[str]] = field(default_factory=dict)
    """The same reservations by holder, so a holder's commit touches only its own pools
    (a scan of ``by_pool`` per commit grew with the cluster's reserved pools)."""

    def reserve(self, holder: str, pools: list[str]) -> None:
        for pool in pools:
            previous = self.by_pool.get(pool)
            if previous is not None and previous != holder:
                self._forget(previous, pool)
            self.by_pool[pool] = holder
            self.by_holder.setdefault(holder, set()).add(pool)

    def hold(self, holder: str, pools: list[str]) -> None:
        """The holder's committed status records ``pools``: its reservations become those."""
        self.release(holder)
        self.reserve(holder, pools)

    def release(self, holder: str) -> None:
        for pool in self.by_holder.pop(holder, ()):
            del self.by_pool[pool]

    def _forget(self, holder: str, pool: str) -> None:
        pools = self.by_holder.get(holder)
        if pools is not None:
            pools.discard(pool)
            if not pools:
                del self.by_holder[holder]


@dataclass
class Context:
    kube: Kube
    caches: Caches
    events: Events
    jobs: Enqueue
    slices: Enqueue
    metrics: Metrics = field(default_factory=NoMetrics)
    reservations: Reservations = field(default_factory=Reservations)
    clock: Callable[[], dt.datetime] = utc_now
    services: set[tuple[str, str, str]] = field(default_factory=set)
    """Headless Services known to exist as their owner wants them (namespace, name, owner
    UID)."""
    service_conflicts: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """Services that exist but belong to another object: (namespace, name, UID of the
    object that wants it) -> why."""
    progress: Any = None
    """The ProgressSampler (None when progress sampling is off)."""
    pacer: StatusPacer = field(default_factory=StatusPacer)
    created_pods: CreatedPods = field(default_factory=CreatedPods)
    deleted_pods: DeletedPods = field(default_factory=DeletedPods)
    refused_slices: dict[tuple[str, str], SliceRefusal] = field(default_factory=dict)
    """Jobs whose TPUSlices the apiserver refused at their last write, by (namespace,
    name): what it said, for the job's next status (the write follows the commit)."""
    refused_pods: dict[tuple[str, str], PodRefusal] = field(default_factory=dict)
    """TPUSlices whose pods could not be created at their last try, by (namespace, name):
    why, for the slice's next status (the pods are created after the write)."""
    refused_dynamic_slices: dict[tuple[str, str], str] = field(default_factory=dict)
    """TPUSlices whose GKE Slice (dynamic slicing) could not be formed or deleted at their
    last try, by (namespace, name): what the apiserver said, for the slice's next status
    (Slices are formed and deleted after the write)."""
    pods_in_flight: PodsInFlight = field(default_factory=PodsInFlight)
    """Pods created on a node pool that the pod cache does not show yet (they hold it)."""
    supervisors: Supervisors | None = None
    """The control channel to the workers' supervisors (None: every restart recreates
    the pods)."""
    control_keys: set[tuple[str, str]] = field(default_factory=set)
    """Control-key Secrets known to exist (namespace, name)."""
    control_network_policy: frozenset[str] | None = None
    """Namespaces where a NetworkPolicy guards the workers' control port
    (--control-network-policy; None: no such policy): pods it cannot guard, with
    hostNetwork or in other namespaces, are not supervised."""
    default_provisioning: str = "ExistingPools"
    """placement.provisioning of the objects that leave it unset (--default-provisioning)."""
    default_spares: Spares = NO_SPARES
    """Spare node pools of every job (--spare-node-pool-selector): no first placement
    takes them; a slice moving off a broken pool may."""
    resource_flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Kueue ResourceFlavor name -> its spec, read when a job using it is admitted
    (reconcile/queueing.py)."""
    admission_checks: dict[str, str] = field(default_factory=dict)
    """Kueue AdmissionCheck name -> its controllerName, read once (reconcile/slice_check.py)."""
    active_checks: set[str] = field(default_factory=set)
    """The slice controller's AdmissionChecks seen Active or marked so by the operator."""
    slices_read: dict[tuple[str, str], float] = field(default_factory=dict)
    """TPUJob (namespace, name) -> when its slice admission check last listed the Slices
    (``reconcile/slice_check.py``: a settled check looks again only every so often)."""
    queue_topologies: dict[tuple[str, str], tuple[bool, float]] = field(default_factory=dict)
    """Kueue LocalQueue (namespace, name) -> whether its ClusterQueue has a flavor with a
    Topology (topology-aware scheduling), and when that was read
    (reconcile/queueing.queue_topology)."""
    queue_positions: dict[tuple[str, str], Any] = field(default_factory=dict)
    """Kueue LocalQueue (namespace, name) -> its pending workloads' positions, as last
    read from Kueue's visibility API (reconcile/queueing.QueuePositions)."""

    async def ensure_service(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the headless Service ``body`` unless it exists. One that exists but is
        owned by another object (a TPUJob and a standalone TPUSlice of the same name) is
        left alone and recorded as a conflict of the caller: the pods' DNS names would
        resolve through the other object's Service."""
        meta = body["metadata"]
        key = (namespace, meta["name"], _owner_uid(meta))
        if key in self.services or key in self.service_conflicts:
            return  # known (both are replaced at every resync: ``known_services``)
        path = namespaced(namespace, "services")
        if not await self.kube.create(path, body):  # it exists already
            current = await self.kube.get(namespaced(namespace, "services", meta["name"]))
            owner = _owner((current or {}).get("metadata") or {})
            if owner and owner.get("uid") != key[2]:
                self.service_conflicts[key] = (
                    f"Service {namespace}/{meta['name']} belongs to {owner.get('kind')} "
                    f"{owner.get('name')}, so the workers' DNS names would not resolve to "
                    "them; rename this object or the other one"
                )
                return
        self.services.add(key)

    def known_services(self, listed: Iterable[dict[str, Any]]) -> None:
        """Replace what is known of the operator's Services with a fresh listing (their
        metadata): those listed exist as their owners want them; one deleted since is
        created again at its owner's next reconcile, and conflicts are looked at again.

        Without it, every owner's next reconcile after a restart or a resync would POST
        its Service (409) and GET it: two requests per job every resync period."""
        self.services = {(m.get("namespace", ""), m.get("name", ""), _owner_uid(m)) for m in listed}
        self.service_conflicts.clear()

    def service_conflict(self, namespace: str, name: str, owner_uid: str) -> str:
        """Why the Service ``name`` that ``owner_uid`` wants belongs to another object."""
        return self.service_conflicts.get((namespace, name, owner_uid), "")


def _owner(meta: dict[str, Any]) -> dict[str, Any]:
    refs = meta.get("ownerReferences") or []
    return refs[0] if refs else {}


def _owner_uid(meta: dict[str, Any]) -> str:
    return str(_owner(meta).get("uid", ""))


def workload_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """The path of a Kueue Workload (or of the collection, without ``name``)."""
    return namespaced(
        namespace,
        WORKLOAD_PLURAL,
        name,
        group=KUEUE_GROUP,
        version=KUEUE_VERSION,
        subresource=subresource,
    )


def job_ref(body: dict[str, Any]) -> ObjectRef:
    meta = body["metadata"]
    return ObjectRef(
        contract.API_VERSION, contract.JOB_KIND, meta["namespace"], meta["name"], meta["uid"]
    )


def slice_ref(body: dict[str, Any]) -> ObjectRef:
    meta = body["metadata"]
    return ObjectRef(
        contract.API_VERSION, contract.SLICE_KIND, meta["namespace"], meta["name"], meta["uid"]
    )


async def write_status(
    kube: Kube,
    plural: str,
    body: dict[str, Any],
    status: dict[str, Any],
    pacer: StatusPacer | None = None,
) -> bool:
    """Replace the status (merge patch) if it changed in more than the clock-derived
    goodput figures (``pacing.clock_only``), guarded by the resourceVersion read.

    Returns False when the object changed since it was read (409): the caller's decision
    was made on stale data and the next reconcile, on fresh data, decides again. Every
    decision (a restart, a failure) is committed by this write before it is acted on.
    """
    current = body.get("status") or {}
    if current == status or clock_only(current, status):
        return True
    meta = body["metadata"]
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": meta["resourceVersion"]},
        "status": merge_diff(current, status),
    }
    path = namespaced(
        meta["namespace"],
        plural,
        meta["name"],
        group=contract.GROUP,
        version=contract.VERSION,
        subresource="status",
    )
    try:
        await kube.merge_patch(path, patch)
    except ApiError as exc:
        if exc.conflict or exc.not_found:
            return False
        raise
    if pacer is not None:
        pacer.wrote(meta["uid"])
    return True


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_diff(before, value)
            if nested:
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = value
    return patch


_EXPECTED = {
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "float_type": "a number",
    "float_parsing": "a number",
}
_JSON_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "an object",
    type(None): "null",
}
MAX_PROBLEMS = 5
"""Problems named in an Invalid message (the rest are counted)."""


def invalid_spec(exc: Exception) -> tuple[Reason, str]:
    """Reason and message for a spec the models cannot read.

    Each problem names its field as ``kubectl explain`` does (``spec.template.spec.
    containers[0].resources: must be an object, not a string``). The reason is
    ``InvalidPodTemplate`` when every problem is in the pod template, else ``InvalidSpec``.
    """
    if not isinstance(exc, ValidationError):
        return Reason.INVALID_SPEC, f"invalid spec: {exc}"
    errors = exc.errors(include_url=False)
    problems = []
    for error in errors[:MAX_PROBLEMS]:
        field = "spec" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
        )
        expected = _EXPECTED.get(error["type"])
        got = _JSON_TYPES.get(type(error["input"]), type(error["input"]).__name__)
        said = str(error.get("ctx", {}).get("error", "")) if error["type"] == "value_error" else ""
        problems.append(
            f"{field}: must be {expected}, not {got}"
            if expected
            else f"{field}: {said or error['msg']}"
        )
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    in_template = all(error["loc"][:1] == ("template",) for error in errors)
    reason = Reason.INVALID_POD_TEMPLATE if in_template else Reason.INVALID_SPEC
    return reason, "invalid spec: " + "; ".join(problems)


async def mark_invalid(ctx: Context, body: dict[str, Any], plural: str, exc: Exception) -> None:
    """An object whose spec the models cannot read: phase Failed, conditions Invalid and
    Failed (reason InvalidPodTemplate or InvalidSpec, the message naming each field), one
    Warning event. Written once per distinct message, never retried in a loop."""
    now = ctx.clock()
    status = dict(body.get("status") or {})
    reason, message = invalid_spec(exc)
    if status.get("phase") == "Failed" and status.get("message") == message:
        return
    generation = body["metadata"].get("generation")
    conditions = list(status.get("conditions") or [])
    for type_ in ("Invalid", "Failed"):
        conditions = set_condition(
            conditions, type_, True, reason, message, at=now, generation=generation
        )
    status.update(
        phase="Failed",
        message=message,
        conditions=conditions,
        completionTime=status.get("completionTime") or stamp(now),
    )
    if await write_status(ctx.kube, plural, body, status):
        ref = job_ref(body) if plural == contract.JOB_PLURAL else slice_ref(body)
        ctx.events.emit(ref, "Warning", "Invalid", message)
