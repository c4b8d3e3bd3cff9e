"""A simulated GKE cluster autoscaler with node auto-provisioning (NAP), for TPU pods.

Off by default (``Cluster.start(autoprovisioning=Autoprovisioning())``, ``python -m
localcluster up --autoprovisioning``, or at run time ``cluster.agent.set_autoprovisioning``).
It imitates what GKE documents for unschedulable pods that request ``google.com/tpu``:

- **Scale-up of existing pools.** A pending pod that fits a declared pool with
  ``autoscaling: true`` that is below its size (its labels, taints and chips per VM, e.g.
  a pool scaled to zero that the pod pins with ``cloud.google.com/gke-nodepool``) makes the
  autoscaler add that pool's VMs; a multi-host TPU slice goes from 0 to all its VMs at
  once ("atomicity", https://cloud.google.com/kubernetes-engine/docs/concepts/tpus).
- **Node auto-provisioning.** A pending pod no existing pool can take gets a new pool
  built from its specification, as NAP does from "resource requests, node affinities and
  label selectors, taints and tolerations" of pending pods
  (https://cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning): the
  accelerator and topology from ``cloud.google.com/gke-tpu-accelerator`` and
  ``-topology``, the machine type from the chips requested (``ct6e-standard-4t`` for 4
  chips), a multi-host slice of chips/4 VMs registered all at once, Spot when the pod
  selects ``cloud.google.com/gke-spot: "true"``, the reservation it selects. Workload
  separation: a pod that selects a custom label ``key: value`` and tolerates a
  ``NoSchedule`` or ``NoExecute`` taint (or all effects) of the same key gets a pool
  labelled ``key=value`` and tainted ``key=value:NoSchedule``
  (https://cloud.google.com/kubernetes-engine/docs/how-to/workload-separation). Pods with
  the same requirements share a provisioning: one pool of ``vms`` VMs per ``vms`` pods of
  a multi-host shape, one VM per pod of a single-host shape. Pool names follow GKE's
  ``nap-<machine type>-<random>``.
- **Delays and scale-down.** The VMs register ``delay`` seconds after the decision (GKE:
  minutes). A managed pool (auto-provisioned or ``autoscaling``) whose VMs have held no
  unfinished pod, and that no pending pod could use, for ``idle`` seconds loses its VMs
  (GKE's default is 10 minutes unneeded); an auto-provisioned pool without VMs is deleted
  ("Deleting auto-provisioned node pools").
- **Events** on the pods, as the cluster autoscaler posts them: ``TriggeredScaleUp``
  (``pod triggered scale-up: [{pool 0->2 (max: 2)}]``) and ``NotTriggerScaleUp`` with the
  reason.

Where it differs from GKE: no resource limits, quotas or stockouts (every scale-up
succeeds after ``delay``); no zones beyond the pool's; CPU and memory requests are not
looked at; single-host pools scale up but are only scaled down whole; label keys NAP
understands beyond accelerator, topology, spot, reservation, zone, os, arch and machine
type make a pod not trigger a scale-up rather than being interpreted; no Spot taint; node
names are ``<pool>-<i>``, not GKE's instance names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from localcluster.agent.kube import Kube, list_watch
from localcluster.agent.status import now
from localcluster.pools import (
    ACCELERATOR_LABEL,
    FLEX_START_LABEL,
    INSTANCE_TYPE_LABEL,
    MAX_RUN_LABEL,
    POOL_LABEL,
    QUEUED_LABEL,
    RESERVATION_LABEL,
    SPOT_LABEL,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    Pool,
    topology_chips,
)

if TYPE_CHECKING:
    from localcluster.agent.nodes import NodeManager
    from localcluster.agent.pods import PodManager

log = logging.getLogger(__name__)

SCAN_SECONDS = 1.0
ASSIGNMENT_GRACE = 30.0
"""Seconds after its pool registered that a pod stays promised to it (the scheduler binds
it within moments; after this it may trigger a scale-up again)."""
MULTI_HOST_CHIPS = 4
SINGLE_HOST: dict[str, dict[str, int]] = {
    "tpu-v4-podslice": {"2x2x1": 4},
    "tpu-v5-lite-podslice": {"1x1": 1, "2x2": 4, "2x4": 8},
    "tpu-v5p-slice": {"2x2x1": 4},
    "tpu-v6e-slice": {"1x1": 1, "2x2": 4, "2x4": 8},
    "tpu7x": {"1x1x1": 1, "2x2x1": 4},
}
"""Single-host topologies and the chips of their one VM, per accelerator (GKE's plan-tpus
tables); every other valid topology is a multi-host slice of 4-chip VMs."""
NAP_LABELS = {
    ACCELERATOR_LABEL,
    TOPOLOGY_LABEL,
    SPOT_LABEL,
    RESERVATION_LABEL,
    INSTANCE_TYPE_LABEL,
    "topology.kubernetes.io/zone",
    "kubernetes.io/os",
    "kubernetes.io/arch",
}
"""Node labels NAP provisions for (its own vocabulary); other keys of Google's and
Kubernetes' domains are not provisioned for, custom keys only by workload separation."""
RESERVED_DOMAINS = ("kubernetes.io", "k8s.io", "google.com")
PROVREQ_PATH = "/apis/autoscaling.x-k8s.io/v1/provisioningrequests"
QUEUED_CLASS = "queued-provisioning.gke.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
FLEX_START_MAX_SECONDS = 7 * 24 * 3600
"""Flex-start VMs run for at most seven days (GKE's default run duration)."""
CAPACITY_LABELS = {FLEX_START_LABEL, QUEUED_LABEL, MAX_RUN_LABEL}


@dataclass(frozen=True)
class Autoprovisioning:
    """Settings of the simulated cluster autoscaler and node auto-provisioner."""

    nap: bool = True
    """Create node pools for pods no pool can take (False: only scale declared pools)."""
    delay: float = 5.0
    """Seconds from a scale-up decision until the pool's VMs register."""
    idle: float = 60.0
    """Seconds a managed pool may stay unused before its VMs are removed."""
    mode: Literal["run", "simulate"] = "run"
    """Mode of the pools NAP creates (run: pods run as processes)."""
    zone: str = "us-central2-b"
    provisioning_requests: Literal["provision", "fail", "expire", "hold"] = "provision"
    """What becomes of a ProvisioningRequest (``queued-provisioning.gke.io``) ``delay``
    seconds after it was accepted: its node pools are created all at once (Provisioned),
    it fails (Failed), its booking expires unused (Provisioned, then BookingExpired), or
    nothing (``hold``: accepted and never provisioned, as a request waits while GKE finds
    no capacity)."""
    termination_notice: float = 20.0
    """Seconds before the end of a flex-start VM's run duration that its node is tainted
    ``cloud.google.com/impending-node-termination`` (then it is taken back)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Autoprovisioning:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown autoprovisioning field(s) {sorted(unknown)}")
        return cls(**dict(data))


# What a pending pod needs (pure) -------------------------------------------------------


def tpu_request(pod: Mapping[str, Any]) -> int:
    """Chips the pod requests (``google.com/tpu`` requests, else limits, over containers)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(TPU_RESOURCE)
        if value is None:
            value = (resources.get("limits") or {}).get(TPU_RESOURCE)
        with contextlib.suppress(TypeError, ValueError):
            total += int(str(value)) if value is not None else 0
    return total


def pending_tpu_pod(pod: Mapping[str, Any]) -> bool:
    """A pod the scheduler found unschedulable that requests TPU chips on TPU nodes."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") != "Pending":
        return False
    if ACCELERATOR_LABEL not in (spec.get("nodeSelector") or {}) or tpu_request(pod) <= 0:
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes toleration matching of one taint."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key, operator = toleration.get("key"), toleration.get("operator") or "Equal"
        if not key and operator == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator")
    values = list(expression.get("values") or [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    with contextlib.suppress(TypeError, ValueError):
        if operator == "Gt":
            return int(labels[key]) > int(values[0])
        if operator == "Lt":
            return int(labels[key]) < int(values[0])
    return False


def selects(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """The pod's node selector and required node affinity accept a node with ``labels``."""
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def fits(pod: Mapping[str, Any], labels: Mapping[str, str], taints: list[Any], chips: int) -> bool:
    """The pod could run on an empty node with these labels, taints and chips."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    blocking = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    return (
        selects(pod, labels)
        and all(tolerates(tolerations, t) for t in blocking)
        and tpu_request(pod) <= chips
    )


def node_shape(pool: Pool) -> tuple[dict[str, str], list[dict[str, Any]], int]:
    """Labels (without the hostname), taints and chips of a VM of ``pool``."""
    labels = pool.node_labels(pool.node_names()[0])
    labels.pop("kubernetes.io/hostname", None)
    taints = pool.node_manifest(pool.node_names()[0], "")["spec"]["taints"]
    return labels, taints, pool.chips_per_vm if pool.accelerator else 0


def _separation(pod: Mapping[str, Any], key: str, value: str) -> dict[str, str] | None:
    """The taint NAP gives a pool for a custom label the pod selects, if the pod tolerates
    a taint of that key (workload separation), else None."""
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        if toleration.get("key") != key or toleration.get("effect") not in (
            None,
            "",
            "NoSchedule",
            "NoExecute",
        ):
            continue
        effect = "NoExecute" if toleration.get("effect") == "NoExecute" else "NoSchedule"
        return {"key": key, "value": value, "effect": effect}
    return None


def _reserved(key: str) -> bool:
    domain = key.split("/", 1)[0] if "/" in key else ""
    return any(domain == d or domain.endswith("." + d) for d in RESERVED_DOMAINS)


def nap_pool(
    pod: Mapping[str, Any],
    config: Autoprovisioning,
    *,
    queued: bool = False,
    max_run_seconds: int | None = None,
) -> Pool | str:
    """The node pool NAP would create for ``pod`` (one VM, or one multi-host slice), or why
    it would not trigger a scale-up. The name is left empty (a group gets one per pool).

    A pod that selects ``cloud.google.com/gke-flex-start: "true"`` gets flex-start VMs
    (labelled so, taken back after ``cloud.google.com/gke-max-run-duration-seconds`` or
    seven days). ``queued``: the pool of a ProvisioningRequest (``queued-provisioning.gke.io``),
    labelled and tainted ``cloud.google.com/gke-queued=true``, flex-start VMs that run for
    ``max_run_seconds`` (the request's parameter) or seven days; a pod that selects
    ``cloud.google.com/gke-queued`` gets no pool but through a request."""
    selector = dict((pod.get("spec") or {}).get("nodeSelector") or {})
    if selector.get(QUEUED_LABEL) == "true" and not queued:
        return (
            f"it selects {QUEUED_LABEL}: such node pools are created for ProvisioningRequests only"
        )
    if POOL_LABEL in selector:
        return f"it selects node pool {selector[POOL_LABEL]}, which cannot be scaled up"
    accelerator, topology = selector.get(ACCELERATOR_LABEL), selector.get(TOPOLOGY_LABEL)
    if accelerator not in SINGLE_HOST:
        return f"no TPU node pool can be auto-provisioned for accelerator {accelerator}"
    if not topology:
        return f"it selects {ACCELERATOR_LABEL} without {TOPOLOGY_LABEL}"
    try:
        chips = topology_chips(topology)
    except ValueError:
        return f"{topology} is not a TPU topology"
    requested = tpu_request(pod)
    if SINGLE_HOST[accelerator].get(topology) == requested:
        vms = 1
    elif requested == MULTI_HOST_CHIPS and chips > requested and chips % requested == 0:
        vms = chips // requested
    else:
        return f"no {accelerator} machine type has {requested} chips per VM for topology {topology}"
    labels: dict[str, str] = {}
    taints: list[dict[str, str]] = []
    flex = selector.get(FLEX_START_LABEL) == "true" or queued
    if flex:
        labels[FLEX_START_LABEL] = "true"
        if not queued:
            with contextlib.suppress(ValueError):
                max_run_seconds = int(selector.get(MAX_RUN_LABEL) or 0) or None
            if max_run_seconds:
                labels[MAX_RUN_LABEL] = str(max_run_seconds)
    if queued:
        labels[QUEUED_LABEL] = "true"
        taints.append({"key": QUEUED_LABEL, "value": "true", "effect": "NoSchedule"})
    for key, value in selector.items():
        if key in NAP_LABELS or key in CAPACITY_LABELS:
            continue
        if _reserved(key):
            return f"node auto-provisioning does not create node pools for label {key}"
        taint = _separation(pod, key, value)
        if taint is None:
            return (
                f"it selects label {key}={value} without tolerating a taint of that key "
                "(workload separation needs both)"
            )
        labels[key] = value
        taints.append(taint)
    pool = Pool(
        name="nap-pending",
        vms=vms,
        accelerator=accelerator,
        topology=topology,
        chips_per_vm=requested,
        spot=selector.get(SPOT_LABEL) == "true",
        reservation=selector.get(RESERVATION_LABEL),
        mode=config.mode,
        zone=config.zone,
        labels=labels,
        taints=tuple(taints),
        auto_provisioned=True,
        max_run_seconds=(max_run_seconds or FLEX_START_MAX_SECONDS) if flex else None,
    )
    wanted_type = selector.get(INSTANCE_TYPE_LABEL)
    if wanted_type and wanted_type != pool.gke_machine_type:
        return f"it selects machine type {wanted_type}, the shape needs {pool.gke_machine_type}"
    if not fits(pod, *node_shape(pool)):
        return "its node affinity or tolerations exclude the node pool it would need"
    return pool


def nap_name(pool: Pool) -> str:
    return f"nap-{pool.gke_machine_type}-{secrets.token_hex(4)}"


def plan_nap(
    pods: Sequence[Mapping[str, Any]], config: Autoprovisioning
) -> tuple[list[tuple[Pool, list[str]]], dict[str, str]]:
    """New pools for pending pods, grouped by identical requirements: (pool, pod UIDs) per
    pool to create, and pod UID -> why it triggers none."""
    groups: dict[tuple[Any, ...], tuple[Pool, list[Mapping[str, Any]]]] = {}
    refused: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        planned = nap_pool(pod, config)
        uid = pod["metadata"]["uid"]
        if isinstance(planned, str):
            refused[uid] = planned
            continue
        key = (
            planned.accelerator,
            planned.topology,
            planned.chips_per_vm,
            planned.spot,
            planned.reservation,
            tuple(sorted(planned.labels.items())),
            tuple(sorted(tuple(sorted(t.items())) for t in planned.taints)),
        )
        groups.setdefault(key, (planned, []))[1].append(pod)
    plans: list[tuple[Pool, list[str]]] = []
    for planned, members in groups.values():
        uids = [p["metadata"]["uid"] for p in members]
        if not planned.multi_host:
            pool = replace(planned, vms=len(uids))
            plans.append((replace(pool, name=nap_name(pool)), uids))
            continue
        for start in range(0, len(uids), planned.vms):
            plans.append(
                (replace(planned, name=nap_name(planned)), uids[start : start + planned.vms])
            )
    return plans, refused


# The loop ------------------------------------------------------------------------------


@dataclass
class _Promise:
    pool: str
    registered: float | None = None


@dataclass
class AutoProvisioner:
    """Watches pods, scales declared autoscaling pools and creates NAP pools."""

    kube: Kube
    nodes: NodeManager
    pods: PodManager
    config: Autoprovisioning
    templates: dict[str, Pool] = field(default_factory=dict)
    """Declared pools with ``autoscaling: true``, by name (their full size)."""
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    promised: dict[str, _Promise] = field(default_factory=dict)
    """Pod UID -> the pool being created or scaled up for it."""
    upcoming: dict[str, tuple[Pool, int, int]] = field(default_factory=dict)
    """Pools (or scale-ups) decided but not registered yet: (pool, VMs after, VMs before)."""
    created: set[str] = field(default_factory=set)
    """Names of the pools this provisioner created (deleted once idle)."""
    idle_since: dict[str, float] = field(default_factory=dict)
    reported: set[tuple[str, str]] = field(default_factory=set)
    run_started: dict[str, float] = field(default_factory=dict)
    """Flex-start pools (``Pool.max_run_seconds``) -> when their VMs registered."""
    accepted_at: dict[str, float] = field(default_factory=dict)
    """ProvisioningRequest UID -> when this autoscaler accepted (or first saw) it."""

    def __post_init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    # pods
    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self.seen.pop(uid, None)
            self.promised.pop(uid, None)
        else:
            self.seen[uid] = pod

    def on_synced(self, items: list[dict[str, Any]]) -> None:
        self.seen = {p["metadata"]["uid"]: p for p in items}

    async def run(self) -> None:
        """Watch pods and scan every second until cancelled."""
        watch = asyncio.create_task(
            list_watch(self.kube, "/api/v1/pods", {}, self.on_event, on_synced=self.on_synced)
        )
        try:
            while True:
                await asyncio.sleep(SCAN_SECONDS)
                try:
                    await self.scan()
                except Exception:  # a failed scan is retried at the next one
                    log.exception("autoprovisioner scan failed")
        finally:
            watch.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(watch, *self._tasks, return_exceptions=True)

    # one pass
    async def scan(self) -> None:
        current = time.monotonic()
        pending = [p for p in self.seen.values() if pending_tpu_pod(p)]
        pending_uids = {p["metadata"]["uid"] for p in pending}
        for uid, promise in list(self.promised.items()):
            expired = promise.registered and current - promise.registered > ASSIGNMENT_GRACE
            if uid not in pending_uids or expired:
                del self.promised[uid]
        # A pod that consumes a ProvisioningRequest gets capacity through it alone.
        waiting = self._without_room(
            [
                p
                for p in pending
                if p["metadata"]["uid"] not in self.promised
                and CONSUME_ANNOTATION not in (p["metadata"].get("annotations") or {})
            ]
        )
        waiting = await self._scale_declared(waiting)
        if self.config.nap and waiting:
            plans, refused = plan_nap(waiting, self.config)
            for pool, uids in plans:
                self._start(pool, pool.vms, None, uids)
        else:
            refused = {
                p["metadata"]["uid"]: "no node pool can take it and node auto-provisioning is off"
                for p in waiting
            }
        for uid, why in refused.items():
            await self._event(
                self.seen[uid], "NotTriggerScaleUp", f"pod didn't trigger scale-up: {why}"
            )
        await self._scale_down(pending, current)
        await self._serve_requests(current)
        await self._take_back(current)

    def _without_room(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pods for which no registered VM has room and no VM on its way is left, as
        the cluster autoscaler counts upcoming nodes: a pod that fits one of those is
        promised to its pool instead of triggering another scale-up."""
        used: dict[str, int] = {}
        for pod in self.seen.values():
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + tpu_request(pod)
        slots: list[list[Any]] = []  # [labels, taints, free chips, upcoming pool or None]
        for name, node in self.nodes.nodes.items():
            if node.pool.accelerator and not node.deleted and node.health == "ready":
                labels, taints, chips = node_shape(node.pool)
                slots.append([labels, taints, chips - used.get(name, 0), None])
        for name, (pool, after, before) in self.upcoming.items():
            taken = sum(1 for p in self.promised.values() if p.pool == name)
            labels, taints, chips = node_shape(pool)
            slots += [[labels, taints, chips, name] for _ in range(after - before - taken)]
        rest = []
        for pod in pods:
            slot = next((s for s in slots if fits(pod, s[0], s[1], s[2])), None)
            if slot is None:
                rest.append(pod)
                continue
            if slot[3]:  # a VM on its way: one pod each
                slots.remove(slot)
                self.promised[pod["metadata"]["uid"]] = _Promise(slot[3])
            else:
                slot[2] -= tpu_request(pod)
        return rest

    async def _scale_declared(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Scale declared autoscaling pools up for the pods that fit them; the rest."""
        rest = []
        wanted: dict[str, list[str]] = {}
        for pod in pods:
            target = next(
                (
                    t
                    for t in self.templates.values()
                    if t.name not in self.upcoming and self._room(t) and fits(pod, *node_shape(t))
                ),
                None,
            )
            if target is None:
                rest.append(pod)
            else:
                wanted.setdefault(target.name, []).append(pod["metadata"]["uid"])
        for name, uids in wanted.items():
            template = self.templates[name]
            present = self._present(name)
            # A multi-host slice comes whole; single-host VMs one per pod.
            more = template.vms if template.multi_host else present + len(uids)
            count = min(template.vms, more)
            self._start(template, count, present, uids)
        return rest

    def _present(self, name: str) -> int:
        return sum(1 for n in self.nodes.nodes.values() if n.pool.name == name and not n.deleted)

    def _room(self, template: Pool) -> bool:
        present = self._present(template.name)
        return present == 0 if template.multi_host else present < template.vms

    def _start(self, pool: Pool, count: int, present: int | None, uids: list[str]) -> None:
        """Decide a scale-up: promise the pods, post events, register the VMs after delay."""
        before = present or 0
        self.upcoming[pool.name] = (pool, count, before)
        for uid in uids:
            self.promised[uid] = _Promise(pool.name)
            message = (
                f"pod triggered scale-up: [{{{pool.name} {before}->{count} (max: {pool.vms})}}]"
            )
            self._spawn(self._event(self.seen[uid], "TriggeredScaleUp", message))
        log.info(
            "autoprovisioner: %s %s %d->%d for %d pod(s)",
            "creating" if present is None else "scaling up",
            pool.name,
            before,
            count,
            len(uids),
        )
        self._spawn(self._register(pool, count, present, uids))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _register(self, pool: Pool, count: int, present: int | None, uids: list[str]) -> None:
        await asyncio.sleep(self.config.delay)
        try:
            if pool.name not in self.nodes.pools:
                await self.nodes.add_pool(pool, count)
            else:
                names = [n for n in pool.node_names()[:count] if n not in self.nodes.nodes]
                await self.nodes.add_nodes(self.nodes.pools[pool.name], names)
            if present is None:
                self.created.add(pool.name)
                if pool.max_run_seconds:
                    self.run_started[pool.name] = time.monotonic()
        finally:
            self.upcoming.pop(pool.name, None)
        registered = time.monotonic()
        for uid in uids:
            if uid in self.promised:
                self.promised[uid].registered = registered

    async def _scale_down(self, pending: list[dict[str, Any]], current: float) -> None:
        managed = (self.created | set(self.templates)) & set(self.nodes.pools)
        busy_nodes = {
            (p.get("spec") or {}).get("nodeName")
            for p in self.seen.values()
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        for name in sorted(managed):
            pool = self.nodes.pools[name]
            names = [n for n, node in self.nodes.nodes.items() if node.pool.name == name]
            if not names:
                continue
            needed = any(n in busy_nodes for n in names) or any(
                self.promised.get(p["metadata"]["uid"], _Promise("")).pool == name
                or fits(p, *node_shape(pool))
                for p in pending
            )
            if needed or name in self.upcoming:
                self.idle_since.pop(name, None)
                continue
            since = self.idle_since.setdefault(name, current)
            if current - since < self.config.idle:
                continue
            self.idle_since.pop(name, None)
            log.info("autoprovisioner: %s idle for %.0f s, removing its VMs", name, current - since)
            for node in names:
                await self.pods.on_node_deleted(node, graceful=False)
            await self.nodes.remove_pool(name)
            self.created.discard(name)

    # ProvisioningRequests (queued-provisioning.gke.io)
    async def _serve_requests(self, current: float) -> None:
        """Accept new ProvisioningRequests of GKE's queued class, and ``delay`` seconds
        later provision them all at once, fail them or let their booking expire
        (``config.provisioning_requests``)."""
        status, listed = await self.kube.request("GET", PROVREQ_PATH)
        if status == 404:
            return  # the ProvisioningRequest CRD is not installed
        if status >= 300:
            log.warning("listing ProvisioningRequests: HTTP %s: %s", status, listed)
            return
        for request in listed.get("items") or []:
            spec = request.get("spec") or {}
            if spec.get("provisioningClassName") != QUEUED_CLASS:
                continue
            meta = request["metadata"]
            conditions = {
                c["type"]: c for c in (request.get("status") or {}).get("conditions") or []
            }
            done = ("Provisioned", "Failed", "BookingExpired", "CapacityRevoked")
            if any((conditions.get(kind) or {}).get("status") == "True" for kind in done):
                self.accepted_at.pop(meta["uid"], None)
                continue
            since = self.accepted_at.setdefault(meta["uid"], current)
            if "Accepted" not in conditions:
                await self._conditions(request, [("Accepted", "True", "Accepted", "")])
                continue
            if current - since < self.config.delay or self.config.provisioning_requests == "hold":
                continue
            await self._fulfil(request)

    async def _fulfil(self, request: dict[str, Any]) -> None:
        meta = request["metadata"]
        where = f"{meta['namespace']}/{meta['name']}"
        outcome = self.config.provisioning_requests
        if outcome == "fail":
            log.info("autoprovisioner: ProvisioningRequest %s failed (simulated)", where)
            await self._conditions(
                request,
                [
                    ("Provisioned", "False", "CapacityNotFound", ""),
                    ("Failed", "True", "CapacityNotFound", "simulated: no capacity was found"),
                ],
            )
            return
        if outcome == "expire":
            log.info("autoprovisioner: ProvisioningRequest %s booking expired (simulated)", where)
            await self._conditions(
                request,
                [
                    ("Provisioned", "True", "Provisioned", "capacity booked"),
                    (
                        "BookingExpired",
                        "True",
                        "BookingExpired",
                        "simulated: the booked capacity was not used in time",
                    ),
                ],
            )
            return
        plans, why = await self._request_pools(request)
        if not plans:
            await self._conditions(
                request,
                [
                    ("Provisioned", "False", "NotProvisionable", why),
                    ("Failed", "True", "NotProvisionable", why),
                ],
            )
            return
        for pool in plans:
            await self.nodes.add_pool(pool, pool.vms)
            self.created.add(pool.name)
            if pool.max_run_seconds:
                self.run_started[pool.name] = time.monotonic()
        names = ", ".join(p.name for p in plans)
        log.info("autoprovisioner: ProvisioningRequest %s provisioned: %s", where, names)
        await self._conditions(
            request, [("Provisioned", "True", "Provisioned", f"node pools {names} created")]
        )

    async def _request_pools(self, request: dict[str, Any]) -> tuple[list[Pool], str]:
        """The node pools a request's pod sets need, all of them, or why none can be had."""
        meta, spec = request["metadata"], request.get("spec") or {}
        parameters = spec.get("parameters") or {}
        max_run: int | None = None
        with contextlib.suppress(TypeError, ValueError):
            max_run = int(parameters.get("maxRunDurationSeconds") or 0) or None
        plans: list[Pool] = []
        for pod_set in spec.get("podSets") or []:
            name = (pod_set.get("podTemplateRef") or {}).get("name", "")
            status, template = await self.kube.request(
                "GET", f"/api/v1/namespaces/{meta['namespace']}/podtemplates/{name}"
            )
            if status >= 300:
                return [], f"pod template {name} not found"
            pod = {"metadata": {}, "spec": (template.get("template") or {}).get("spec") or {}}
            planned = nap_pool(pod, self.config, queued=True, max_run_seconds=max_run)
            if isinstance(planned, str):
                return [], planned
            count = int(pod_set.get("count") or 0)
            if planned.multi_host:
                if count % planned.vms:
                    return [], f"{count} pods do not fill whole {planned.topology} slices"
                plans += [
                    replace(planned, name=nap_name(planned)) for _ in range(count // planned.vms)
                ]
            else:
                pool = replace(planned, vms=count)
                plans.append(replace(pool, name=nap_name(pool)))
        return plans, ""

    async def _conditions(
        self, request: dict[str, Any], updates: list[tuple[str, str, str, str]]
    ) -> None:
        meta = request["metadata"]
        conditions = {c["type"]: c for c in (request.get("status") or {}).get("conditions") or []}
        stamp = now()
        for kind, status, reason, message in updates:
            conditions[kind] = {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp,
                "observedGeneration": meta.get("generation", 1),
            }
        path = (
            f"/apis/autoscaling.x-k8s.io/v1/namespaces/{meta['namespace']}"
            f"/provisioningrequests/{meta['name']}/status"
        )
        body = {"status": {"conditions": list(conditions.values())}}
        code, answer = await self.kube.request(
            "PATCH", path, body, content_type="application/merge-patch+json"
        )
        if code >= 300 and code != 404:
            log.warning("updating ProvisioningRequest %s: HTTP %s: %s", meta["name"], code, answer)

    # flex-start run durations
    async def _take_back(self, current: float) -> None:
        """Flex-start VMs at the end of their run duration: tainted
        ``impending-node-termination`` ``termination_notice`` seconds before, then
        deleted (graceful node shutdown first) with their pool."""
        for name, started in list(self.run_started.items()):
            pool = self.nodes.pools.get(name)
            if pool is None or not pool.max_run_seconds:
                self.run_started.pop(name, None)
                continue
            left = started + pool.max_run_seconds - current
            nodes = [n for n, node in self.nodes.nodes.items() if node.pool.name == name]
            if left <= 0:
                log.info("autoprovisioner: %s reached its run duration, taking it back", name)
                self.run_started.pop(name, None)
                self.created.discard(name)
                # In the background: a graceful shutdown waits for the pods' last status
                # writes, and the scans go on meanwhile.
                self._spawn(self._retire(name, nodes))
                continue
            if left <= self.config.termination_notice and (name, "notice") not in self.reported:
                self.reported.add((name, "notice"))
                taints = node_shape(pool)[1] + [
                    {
                        "key": IMPENDING_TERMINATION_TAINT,
                        "value": "true",
                        "effect": "NoSchedule",
                        "timeAdded": now(),
                    }
                ]
                for node in nodes:
                    await self.kube.request(
                        "PATCH",
                        f"/api/v1/nodes/{node}",
                        {"spec": {"taints": taints}},
                        content_type="application/merge-patch+json",
                    )

    async def _retire(self, name: str, nodes: list[str]) -> None:
        for node in nodes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pods.on_node_deleted(node, graceful=True), 30.0)
        with contextlib.suppress(KeyError):
            await self.nodes.remove_pool(name)
        log.info("autoprovisioner: %s taken back (%d VMs)", name, len(nodes))

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        if (meta["uid"], message) in self.reported:
            return
        self.reported.add((meta["uid"], message))
        stamp = now()
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Normal",
            "source": {"component": "cluster-autoscaler"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        status, body = await self.kube.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/events", event
        )
        if status >= 300 and status != 404:
            log.warning("posting event %s for %s: HTTP %s: %s", reason, meta["name"], status, body)
