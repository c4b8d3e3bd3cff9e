"""Kueue integration, pure part: the Workload of a TPUJob and the queue state it shows.

A TPUJob labelled ``kueue.x-k8s.io/queue-name`` is an external Kueue framework
(``integrations.externalFrameworks: [TPUJob.v1alpha1.tpu-operator.dev]``): the operator
creates one Workload per job (``kueue.x-k8s.io/v1beta2``), owned by it, and runs the job
only while Kueue admits it. This module builds that Workload and reads Kueue's verdict
from its status; the I/O is in ``reconcile/queueing.py``. docs/tasks/kueue.md has the contract.

The Workload has one podSet, ``workers``, for every worker of every slice: ``count`` =
slices x hosts per slice, the worker's chips (``google.com/tpu``) as requests, the node
selector of the slice shape, and (multi-host slices, ``topology=True``) a topology
request that keeps each slice of ``hosts`` pods inside one node pool
(``podSetSliceRequiredTopology: cloud.google.com/gke-nodepool``). An Ironwood dynamic
slice's pod set is what GKE's Kueue slice controller makes of a JobSet's: the annotation
``cloud.google.com/gke-tpu-slice-topology``, the partitions' health as required node
affinity, no topology node selector, and a topology request for one ``gce-topology-block``
with each partition's VMs in one partition (``dynamic_topology_request``); the operator
serves that admission check for its own Workloads (``policies/slice_check.py``).

On admission the pods get what Kueue's contract for a job gives them
(``admission_assignment``): the node labels and tolerations of every assigned
ResourceFlavor and the admission checks' ``podSetUpdates``, merged as Kueue's
``podset.Merge`` does (a node selector key set to two values is a conflict, not an
override). While the job runs, whole slices whose workers all succeeded are reported as
``status.reclaimablePods`` (``reclaimable_pods``) so that Kueue frees their quota.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpu_operator import catalog, contract
from tpu_operator.catalog import SliceShape
from tpu_operator.placement import dynamic
from tpu_operator.placement.capacity import KUEUE_MAX_RUN_DURATION, QUEUED, CapacityMode

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
PRIORITY_CLASS_PLURAL = "workloadpriorityclasses"
RESOURCE_FLAVOR_PLURAL = "resourceflavors"
LOCAL_QUEUE_PLURAL = "localqueues"
CLUSTER_QUEUE_PLURAL = "clusterqueues"
POD_SET = "workers"
"""The one podSet of a TPUJob's Workload."""
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
"""Kueue's label naming the WorkloadPriorityClass of a job."""
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
EXTERNAL_FRAMEWORK = f"{contract.JOB_KIND}.{contract.VERSION}.{contract.GROUP}"
"""How Kueue's configuration names the TPUJob kind (``Kind.version.group``)."""
TOPOLOGY_LEVEL = contract.NODE_LABEL_NODEPOOL

# Workload condition types and reasons (Kueue's vocabulary, kueue.x-k8s.io/v1beta2).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
PODS_READY = "PodsReady"
FINISHED = "Finished"
REQUEUED = "Requeued"
REQUEUE_REASONS = frozenset({"Preempted", "NodeFailures"})
"""Evictions after which Kueue expects the job back in the queue at once (Requeued True)."""


def workload_name(job_name: str, uid: str) -> str:
    """``tpujob-<name>-<hash>``, at most 63 characters (a label value when referenced)."""
    digest = hashlib.sha256(f"{job_name}/{uid}".encode()).hexdigest()[:5]
    base = f"tpujob-{job_name}"[: 63 - 6].rstrip("-")
    return f"{base}-{digest}"


def queue_name(metadata: dict[str, Any]) -> str | None:
    """The LocalQueue a job asks for, if it is Kueue-managed."""
    value = (metadata.get("labels") or {}).get(contract.LABEL_KUEUE_QUEUE)
    return str(value) if value else None


@dataclass(frozen=True)
class Priority:
    """A WorkloadPriorityClass and its value (Kueue requires both once a class is named)."""

    class_name: str
    value: int


def worker_template(template: dict[str, Any], shape: SliceShape) -> dict[str, Any]:
    """The pod template Kueue counts: the job's template with the worker's chips and the
    shape's node selector (what every worker pod asks of its node)."""
    result = copy.deepcopy(template)
    spec = result.setdefault("spec", {})
    chips = str(shape.chips_per_host)
    containers = []
    for container in spec.get("containers") or []:
        container = dict(container)
        if container.get("name") == contract.WORKER_CONTAINER:
            resources = dict(container.get("resources") or {})
            for part in ("requests", "limits"):
                resources[part] = {**(resources.get(part) or {}), contract.TPU_RESOURCE: chips}
            container["resources"] = resources
        containers.append(container)
    spec["containers"] = containers
    selector = dict(spec.get("nodeSelector") or {})
    selector[contract.NODE_LABEL_ACCELERATOR] = shape.accelerator
    if shape.dynamic is None:
        selector[contract.NODE_LABEL_TOPOLOGY] = shape.topology
    else:
        # A cube's nodes carry the topology label only once a Slice is formed of them
        # (after admission, by the slice admission check); the pods ask for the slice's
        # topology by annotation, and for partitions whose health lets a slice form.
        result.setdefault("metadata", {}).setdefault("annotations", {})[
            contract.ANNOTATION_SLICE_TOPOLOGY
        ] = shape.topology
        spec["affinity"] = _with_health(spec.get("affinity"), shape)
    spec["nodeSelector"] = selector
    tolerations = list(spec.get("tolerations") or [])
    if not any(t.get("key") == contract.TPU_TAINT_KEY for t in tolerations):
        # The TPU nodes' taint, tolerated by every worker pod (builders/pods.py): Kueue's
        # topology-aware scheduling leaves out nodes whose taints the template does not
        # tolerate.
        tolerations.append(
            {
                "key": contract.TPU_TAINT_KEY,
                "operator": "Equal",
                "value": contract.TPU_TAINT_VALUE,
                "effect": contract.TPU_TAINT_EFFECT,
            }
        )
    spec["tolerations"] = tolerations
    metadata = result.get("metadata") or {}
    result["metadata"] = {k: v for k, v in metadata.items() if k in ("labels", "annotations")}
    return result


def _with_health(affinity: Mapping[str, Any] | None, shape: SliceShape) -> dict[str, Any]:
    """``affinity`` with the required node affinity GKE's Kueue slice controller gives a
    dynamic slice's pods: its partitions' state HEALTHY or DEGRADED (every term)."""
    result = copy.deepcopy(dict(affinity or {}))
    node = result.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    health = {
        "key": contract.partition_state_label(dynamic.level(shape)),
        "operator": "In",
        "values": list(contract.PARTITION_USABLE_STATES),
    }
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), health]}
        for term in terms
    ]
    return result


def dynamic_topology_request(shape: SliceShape) -> dict[str, Any]:
    """The topology request of a dynamic slice's pod set, as GKE's Kueue slice controller
    sets it for JobSets: every pod in one ``gce-topology-block``, each run of
    ``podSetSliceSize`` pods (one partition's VMs) in one partition of the slice's level."""
    per_partition = (
        catalog.CUBE_CHIPS // shape.chips_per_host if shape.dynamic == "SuperSlice" else shape.hosts
    )
    return {
        "required": contract.NODE_LABEL_TOPOLOGY_BLOCK,
        "podSetSliceRequiredTopology": contract.partition_id_label(dynamic.level(shape)),
        "podSetSliceSize": per_partition,
    }


def build_workload(
    job: dict[str, Any],
    template: dict[str, Any],
    shape: SliceShape,
    num_slices: int,
    *,
    priority: Priority | None = None,
    topology: bool = True,
    placement: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Workload of a TPUJob (``job``: its metadata; ``template``: spec.template;
    ``placement``: spec.placement, whose capacity mode the pod set's template carries, so
    that the ProvisioningRequest Kueue's admission check makes for it asks for those
    nodes, with the maximum run duration as the request's parameter)."""
    meta = job["metadata"]
    queue = queue_name(meta) or ""
    mode = CapacityMode(
        (placement or {}).get("capacity"), (placement or {}).get("maxRunDurationSeconds")
    )
    pod_template = worker_template(template, shape)
    pod_spec = pod_template["spec"]
    pod_spec["nodeSelector"] = {**pod_spec["nodeSelector"], **mode.node_selector()}
    pod_spec["tolerations"] = [
        *pod_spec["tolerations"],
        *(t for t in mode.tolerations() if t not in pod_spec["tolerations"]),
    ]
    pod_set: dict[str, Any] = {
        "name": POD_SET,
        "count": num_slices * shape.hosts,
        "template": pod_template,
    }
    if shape.dynamic is not None:
        pod_set["topologyRequest"] = dynamic_topology_request(shape)
    elif topology and shape.multi_host:
        pod_set["topologyRequest"] = {
            "podSetSliceRequiredTopology": TOPOLOGY_LEVEL,
            "podSetSliceSize": shape.hosts,
        }
    spec: dict[str, Any] = {"queueName": queue, "podSets": [pod_set], "active": True}
    if priority is not None:
        spec["priorityClassRef"] = {
            "group": KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority.class_name,
        }
        spec["priority"] = priority.value
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": {contract.LABEL_KUEUE_QUEUE: queue, LABEL_JOB_UID: meta["uid"]},
            **(
                {"annotations": {KUEUE_MAX_RUN_DURATION: str(mode.max_run_duration_seconds)}}
                if mode.capacity == QUEUED and mode.max_run_duration_seconds
                else {}
            ),
            "ownerReferences": [
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": contract.JOB_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def workload_outdated(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether an existing Workload no longer describes the job (podSets and priority
    are immutable in Kueue: a changed job gets a new Workload while it is queued)."""
    have, want = current.get("spec") or {}, desired["spec"]
    if have.get("queueName") != want.get("queueName"):
        return True
    if have.get("priority") != want.get("priority"):
        return True
    sets = have.get("podSets") or []
    if len(sets) != 1:
        return True
    mine, wanted = sets[0], want["podSets"][0]
    if mine.get("count") != wanted["count"]:
        return True
    have_request, want_request = (
        mine.get("topologyRequest") or {},
        wanted.get("topologyRequest") or {},
    )
    if any(
        have_request.get(key) != want_request.get(key)
        for key in ("podSetSliceSize", "podSetSliceRequiredTopology", "required")
    ):
        return True
    return _essence(mine.get("template") or {}) != _essence(wanted["template"])


def _essence(template: dict[str, Any]) -> Any:
    """What of a pod template Kueue counts: each container's name and resources, and the
    node selector (the apiserver's defaults elsewhere do not make a Workload outdated)."""
    spec = template.get("spec") or {}
    return (
        [(c.get("name"), c.get("resources") or {}) for c in spec.get("containers") or []],
        spec.get("nodeSelector") or {},
    )


# Reading Kueue's verdict.
def condition_of(workload: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    """A condition of a Workload (or of any object with ``status.conditions``)."""
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def condition_true(workload: Mapping[str, Any], type_: str) -> bool:
    cond = condition_of(workload, type_)
    return cond is not None and cond.get("status") == "True"


@dataclass(frozen=True)
class Assignment:
    """What admission tells the pods: flavors, node pools, admission checks' updates."""

    cluster_queue: str = ""
    flavors: dict[str, str] = field(default_factory=dict)
    node_pools: list[str] = field(default_factory=list)
    """One node pool per slice, from the topology assignment (empty without one)."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    """The assigned flavors' node labels and the admission checks' node selectors."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """The assigned flavors' tolerations and the admission checks' ones."""


@dataclass(frozen=True)
class QueueState:
    """Kueue's verdict on a job, read from its Workload."""

    state: str
    """Missing (no Workload yet), Queued, Reserved (quota reserved, admission checks
    pending), Admitted, Evicted, Finished."""
    reason: str = ""
    message: str = ""
    assignment: Assignment | None = None
    admission_held: bool = False
    """The Workload still records an admission (quota): cleared by the operator once the
    pods of an evicted job are gone."""
    conflict: str = ""
    """Admitted, but the admission cannot be applied to the pods (``admission_assignment``
    said why); ``assignment`` then has only the ClusterQueue, flavors and node pools."""

    @property
    def admitted(self) -> bool:
        return self.state == "Admitted"


MISSING = QueueState("Missing", "WorkloadMissing", "creating the job's Workload")


HOSTNAME_LEVEL = contract.NODE_LABEL_HOSTNAME


def node_pools_of(
    assignment: dict[str, Any],
    hosts: int,
    slices: int,
    pool_of: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Node pool per slice from a podSet's topology assignment: on the node-pool level
    (``levels: [cloud.google.com/gke-nodepool, ...]``) directly, on the hostname level
    (Kueue reports only that level when the Topology has it) through ``pool_of`` (node ->
    its pool). Pods per pool in the order Kueue lists them, ``hosts`` pods a slice. Empty
    when there is no such assignment or it does not split into whole slices."""
    topo = assignment.get("topologyAssignment") or {}
    levels = topo.get("levels") or []
    if TOPOLOGY_LEVEL in levels:
        level, lookup = levels.index(TOPOLOGY_LEVEL), None
    elif HOSTNAME_LEVEL in levels and pool_of is not None:
        level, lookup = levels.index(HOSTNAME_LEVEL), pool_of
    else:
        return []
    pods_in: dict[str, int] = {}
    for name, pods in _domains(topo, level):
        pool = lookup.get(name) if lookup is not None else name
        if not pool:
            return []
        pods_in[pool] = pods_in.get(pool, 0) + pods
    pools: list[str] = []
    for pool, pods in pods_in.items():
        if pods % hosts:
            return []
        pools.extend([pool] * (pods // hosts))
    return pools if len(pools) == slices else []


def _domains(topo: dict[str, Any], level: int) -> list[tuple[str, int]]:
    """(value at ``level``, pod count) of every domain of a topology assignment."""
    found: list[tuple[str, int]] = []
    for part in topo.get("slices") or []:
        count = int(part.get("domainCount") or 0)
        per_level = part.get("valuesPerLevel") or []
        values = per_level[level] if level < len(per_level) else {}
        names = _expand(values, count)
        counts = _expand_counts(part.get("podCounts") or {}, count)
        found.extend(zip(names, counts, strict=False))
    for domain in topo.get("domains") or []:  # the older form: values and count
        found.append(((domain.get("values") or [""])[level], int(domain.get("count") or 0)))
    return found


def _expand(values: dict[str, Any], count: int) -> list[str]:
    if "universal" in values:
        return [str(values["universal"])] * count
    individual = values.get("individual") or {}
    prefix, suffix = individual.get("prefix", ""), individual.get("suffix", "")
    return [f"{prefix}{root}{suffix}" for root in individual.get("roots") or []]


def _expand_counts(counts: dict[str, Any], count: int) -> list[int]:
    if "universal" in counts:
        return [int(counts["universal"])] * count
    return [int(n) for n in counts.get("individual") or []]


def queue_flavors(cluster_queue: Mapping[str, Any]) -> list[str]:
    """The ResourceFlavor names a ClusterQueue's resource groups list, in order."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    return [str(f["name"]) for group in groups for f in group.get("flavors") or [] if f.get("name")]


def flavor_names(workload: dict[str, Any] | None) -> list[str]:
    """The ResourceFlavors assigned to the job's podSet, each once, in Kueue's order."""
    pod_set = _pod_set_assignment(workload or {})
    return list(dict.fromkeys(str(v) for v in (pod_set.get("flavors") or {}).values()))


def _pod_set_assignment(workload: dict[str, Any]) -> dict[str, Any]:
    admission = (workload.get("status") or {}).get("admission") or {}
    return next(
        (p for p in admission.get("podSetAssignments") or [] if p.get("name") == POD_SET), {}
    )


def _placement(
    workload: dict[str, Any], hosts: int, slices: int, pool_of: Mapping[str, str | None] | None
) -> Assignment:
    """The admission without what it adds to the pods: ClusterQueue, flavors, pools."""
    admission = (workload.get("status") or {}).get("admission") or {}
    pod_set = _pod_set_assignment(workload)
    return Assignment(
        cluster_queue=str(admission.get("clusterQueue") or ""),
        flavors={str(k): str(v) for k, v in (pod_set.get("flavors") or {}).items()},
        node_pools=node_pools_of(pod_set, hosts, slices, pool_of),
    )


def slice_node_selector(
    template: dict[str, Any], shape: SliceShape, placement: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The node labels every worker pod of the job selects whatever its pool: the
    template's node selector, then ``spec.placement`` (nodeSelector, spot, reservation)
    and the slice shape, which builders/pods.py lays over it in that order. What an
    admission's node selector must agree with."""
    placement = placement or {}
    selector = {
        str(k): str(v) for k, v in ((template.get("spec") or {}).get("nodeSelector") or {}).items()
    }
    selector.update({str(k): str(v) for k, v in (placement.get("nodeSelector") or {}).items()})
    selector[contract.NODE_LABEL_ACCELERATOR] = shape.accelerator
    selector[contract.NODE_LABEL_TOPOLOGY] = shape.topology
    if placement.get("spot") is True:
        selector[contract.NODE_LABEL_SPOT] = "true"
    if placement.get("reservation"):
        selector[contract.NODE_LABEL_RESERVATION] = str(placement["reservation"])
    return selector


def _merge_into(
    target: dict[str, str],
    origin: dict[str, str],
    values: Mapping[str, Any],
    source: str,
    what: str,
) -> str:
    """Add ``values`` (from ``source``) to ``target``; a key already set to another
    value is a conflict (Kueue's ``utilmaps.HaveConflict``): its description, else ""."""
    for key, value in values.items():
        value = str(value)
        if key in target and target[key] != value:
            return f"{what} {key}: {origin[key]} sets {target[key]!r}, {source} sets {value!r}"
        if key not in target:
            target[key], origin[key] = value, source
    return ""


def _add_tolerations(tolerations: list[dict[str, Any]], more: Iterable[Any]) -> None:
    for toleration in more:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))


def admission_assignment(
    workload: dict[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    *,
    own_selector: Mapping[str, str] | None = None,
    hosts: int = 1,
    slices: int = 1,
    pool_of: Mapping[str, str | None] | None = None,
) -> Assignment | str:
    """What an admitted Workload gives the job's pods, or why it cannot (a conflict,
    naming the key and both values).

    Kueue's contract for a job (jobframework ``getPodSetsInfoFromStatus``, ``podset.Merge``):
    every assigned flavor's ``spec.nodeLabels`` as node selector (a later flavor's label
    wins over an earlier one's, as Kueue copies them) and ``spec.tolerations``; then each
    admission check's ``podSetUpdates`` for the podSet, whose labels, annotations and node
    selector must not set a key already set to another value; then the whole must agree
    with the node selector the job's pods have anyway (``own_selector``:
    ``slice_node_selector``; the pod builder would otherwise override the flavor
    silently). Tolerations are added unless already there.

    ``flavors``: ResourceFlavor name -> its ``spec``; a flavor missing from it adds nothing.
    """
    base = _placement(workload, hosts, slices, pool_of)
    selector: dict[str, str] = {}
    origin: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for name in flavor_names(workload):
        spec = flavors.get(name) or {}
        for key, value in (spec.get("nodeLabels") or {}).items():
            selector[str(key)], origin[str(key)] = str(value), f"ResourceFlavor {name}"
        _add_tolerations(tolerations, spec.get("tolerations") or [])
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    label_origin: dict[str, str] = {}
    annotation_origin: dict[str, str] = {}
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        update = next(
            (u for u in check.get("podSetUpdates") or [] if u.get("name") == POD_SET), None
        )
        if update is None:
            continue
        source = f"admission check {check.get('name', '')}"
        for what, target, origins, values in (
            ("label", labels, label_origin, update.get("labels")),
            ("annotation", annotations, annotation_origin, update.get("annotations")),
            ("node selector", selector, origin, update.get("nodeSelector")),
        ):
            conflict = _merge_into(target, origins, values or {}, source, what)
            if conflict:
                return conflict
        _add_tolerations(tolerations, update.get("tolerations") or [])
    own = dict(own_selector or {})
    for key, value in selector.items():
        if key in own and own[key] != value:
            return (
                f"node selector {key}: {origin[key]} sets {value!r}, "
                f"the job's pods select {own[key]!r}"
            )
    return dataclasses.replace(
        base,
        labels=labels,
        annotations=annotations,
        node_selector=selector,
        tolerations=tolerations,
    )


def _admitted(
    state: str,
    reason: str,
    message: str,
    workload: dict[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    own_selector: Mapping[str, str] | None,
    hosts: int,
    slices: int,
    pool_of: Mapping[str, str | None] | None,
) -> QueueState:
    found = admission_assignment(
        workload, flavors, own_selector=own_selector, hosts=hosts, slices=slices, pool_of=pool_of
    )
    if isinstance(found, str):
        return QueueState(
            state,
            reason,
            message,
            assignment=_placement(workload, hosts, slices, pool_of),
            admission_held=True,
            conflict=found,
        )
    return QueueState(state, reason, message, assignment=found, admission_held=True)


def checks_waited_for(workload: dict[str, Any]) -> str:
    """The admission checks a Workload with quota reserved waits for, in words: each not
    Ready, with its state and message (``admission check ss (Pending)``; ``admission
    checks`` when the Workload does not list them yet)."""
    waiting = []
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        state = str(check.get("state") or "Pending")
        if state == "Ready":
            continue
        said = f"admission check {check.get('name', '')} ({state}"
        message = str(check.get("message") or "").strip()
        waiting.append(said + (f": {message})" if message else ")"))
    return "; ".join(waiting) if waiting else "admission checks"


def queue_state(
    workload: dict[str, Any] | None,
    hosts: int = 1,
    slices: int = 1,
    pool_of: Mapping[str, str | None] | None = None,
    flavors: Mapping[str, Mapping[str, Any]] | None = None,
    own_selector: Mapping[str, str] | None = None,
) -> QueueState:
    """Kueue's verdict on the job of ``workload`` (pure: from the Workload and, for a
    hostname-level topology assignment, ``pool_of``: node name -> node pool; for what
    admission adds to the pods, ``flavors`` and ``own_selector`` as
    ``admission_assignment`` takes them)."""
    if workload is None:
        return MISSING
    held = bool((workload.get("status") or {}).get("admission"))
    if condition_true(workload, FINISHED):
        cond = condition_of(workload, FINISHED) or {}
        return QueueState("Finished", cond.get("reason", ""), cond.get("message", ""))
    evicted = condition_of(workload, EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        return QueueState(
            "Evicted",
            str(evicted.get("reason") or "Evicted"),
            str(evicted.get("message") or ""),
            admission_held=held,
        )
    found = flavors or {}
    if condition_true(workload, ADMITTED) and held:
        cond = condition_of(workload, ADMITTED) or {}
        return _admitted(
            "Admitted",
            str(cond.get("reason") or "Admitted"),
            str(cond.get("message") or ""),
            workload,
            found,
            own_selector,
            hosts,
            slices,
            pool_of,
        )
    reserved = condition_of(workload, QUOTA_RESERVED)
    if reserved is not None and reserved.get("status") == "True" and held:
        return _admitted(
            "Reserved",
            str(reserved.get("reason") or "QuotaReserved"),
            f"quota reserved; waiting for {checks_waited_for(workload)}",
            workload,
            found,
            own_selector,
            hosts,
            slices,
            pool_of,
        )
    if workload.get("spec", {}).get("active") is False:
        return QueueState("Queued", "Deactivated", "the Workload is deactivated (spec.active)")
    reason = str((reserved or {}).get("reason") or "Pending")
    message = str((reserved or {}).get("message") or "waiting for Kueue to admit the job")
    return QueueState("Queued", reason, message)


def apply_assignment(template: dict[str, Any], assignment: Assignment) -> dict[str, Any]:
    """The job's pod template with what admission adds (the flavors' node labels and
    tolerations, the admission checks' podSetUpdates: labels, annotations, node selector,
    tolerations); ``template`` itself is unchanged."""
    if not (
        assignment.labels
        or assignment.annotations
        or assignment.node_selector
        or assignment.tolerations
    ):
        return template
    result = copy.deepcopy(template)
    metadata = result.setdefault("metadata", {}) or {}
    result["metadata"] = metadata
    if assignment.labels:
        metadata["labels"] = {**(metadata.get("labels") or {}), **assignment.labels}
    if assignment.annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **assignment.annotations}
    spec = result.setdefault("spec", {})
    if assignment.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **assignment.node_selector}
    if assignment.tolerations:
        existing = list(spec.get("tolerations") or [])
        spec["tolerations"] = existing + [t for t in assignment.tolerations if t not in existing]
    return result


def clear_admission(workload: dict[str, Any], now: str) -> dict[str, Any]:
    """The Workload status that gives an evicted job's quota back (Kueue's contract once
    the job is no longer active: admission cleared, QuotaReserved and Admitted False,
    Requeued as Kueue wants it)."""
    evicted = condition_of(workload, EVICTED) or {}
    reason = str(evicted.get("reason") or "")
    message = str(evicted.get("message") or "evicted")
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    conditions = _set(
        conditions, REQUEUED, reason in REQUEUE_REASONS, reason or "Evicted", message, now, workload
    )
    conditions = _set(conditions, QUOTA_RESERVED, False, "Pending", message, now, workload)
    conditions = _set(
        conditions,
        ADMITTED,
        False,
        "NoReservation",
        "The workload has no reservation",
        now,
        workload,
    )
    status: dict[str, Any] = {"admission": None, "conditions": conditions}
    if (workload.get("status") or {}).get("reclaimablePods"):
        # Counts of this admission: the next one starts from none. Kueue forbids lowering
        # them only while the quota is reserved, which this same write ends.
        status["reclaimablePods"] = None
    return status


class WorkerPod(Protocol):
    """What ``reclaimable_pods`` reads of a worker pod (``state.views.PodView``)."""

    @property
    def slice_index(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def phase(self) -> str: ...


def reclaimable_pods(pods: Iterable[WorkerPod], attempt: int, hosts: int, slices: int) -> int:
    """Workers of the current ``attempt`` whose quota Kueue may release while the others
    run (``status.reclaimablePods`` of the podSet): every worker of each slice whose
    ``hosts`` workers have all Succeeded. Only whole slices count: a slice's chips are one
    unit (its VMs form one ICI domain that no other job can use a part of), and a
    Succeeded pod (its phase, not just its worker's exit: a sidecar may still hold the
    node) no longer holds its node's chips."""
    succeeded: dict[int, int] = {}
    for pod in pods:
        if pod.attempt == attempt and pod.phase == "Succeeded" and 0 <= pod.slice_index < slices:
            succeeded[pod.slice_index] = succeeded.get(pod.slice_index, 0) + 1
    return hosts * sum(1 for count in succeeded.values() if count >= hosts)


def reported_reclaimable(workload: dict[str, Any]) -> int:
    """The reclaimable count the Workload records for the podSet."""
    for entry in (workload.get("status") or {}).get("reclaimablePods") or []:
        if entry.get("name") == POD_SET:
            return int(entry.get("count") or 0)
    return 0


def reclaimable_status(workload: dict[str, Any], count: int) -> dict[str, Any] | None:
    """The Workload status change reporting ``count`` reclaimable pods; None when the
    Workload has it or a higher count. Kueue's webhook refuses to lower a count while the
    quota is reserved, so a count only grows within one admission (a restart that
    recreates a finished slice runs it on quota Kueue already released, as for a
    JobSet; the count starts again from zero at the next admission)."""
    if count <= reported_reclaimable(workload):
        return None
    return {"reclaimablePods": [{"name": POD_SET, "count": count}]}


def with_condition(
    workload: dict[str, Any], type_: str, value: bool, reason: str, message: str, now: str
) -> list[dict[str, Any]] | None:
    """The Workload's conditions with ``type_`` set; None if nothing would change."""
    cond = condition_of(workload, type_)
    wanted = "True" if value else "False"
    if cond is not None and cond.get("status") == wanted and cond.get("reason") == reason:
        return None
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    return _set(conditions, type_, value, reason, message, now, workload)


def _set(
    conditions: list[dict[str, Any]],
    type_: str,
    value: bool,
    reason: str,
    message: str,
    now: str,
    workload: dict[str, Any],
) -> list[dict[str, Any]]:
    wanted = "True" if value else "False"
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") == type_:
            found = True
            changed = cond.get("status") != wanted
            cond = {
                **cond,
                "status": wanted,
                "reason": reason,
                "message": message[:32768],
                "observedGeneration": (workload.get("metadata") or {}).get("generation", 0),
            }
            if changed:
                cond["lastTransitionTime"] = now
        out.append(cond)
    if not found:
        out.append(
            {
                "type": type_,
                "status": wanted,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": now,
                "observedGeneration": (workload.get("metadata") or {}).get("generation", 0),
            }
        )
    return out
