"""Ironwood dynamic slicing: which cubes a slice is formed of, and its Slice object (pure).

On GKE with the slice controller (``--enable-slice-controller``), TPU7x capacity is node
pools of one 4x4x4 cube each (a reservation sub-block: 16 VMs of 4 chips) whose ICI links
are not formed. Every node carries the id of each partition it belongs to and that
partition's health (``cloud.google.com/gke-tpu-partition-<shape>-id`` and ``-state``, shape
4x4x4 for the cube and each sub-slice shape). A ``Slice`` (``accelerator.gke.io/v1beta1``,
cluster-scoped) names the partitions to join (``spec.partitionIds``, one per 64 chips for a
super-slice, the one partition of a sub-slice); the controller forms it, turns its
``Ready`` condition True (reason ``ACTIVE`` or ``ACTIVE_DEGRADED``) and labels its nodes
``cloud.google.com/gke-tpu-slice=<Slice name>``. Pods then select that label and carry the
annotation ``cloud.google.com/gke-tpu-slice-topology``.

The operator does what GKE's "custom scheduler" path documents, per attempt of a slice:
choose free partitions whose every node is Ready and whose state is HEALTHY or DEGRADED,
create the Slice, wait until it is Ready, then create the pods. A cube whose state turns
to anything else under a running slice makes its nodes lost (``cube_lost``): the gang
restarts as after a lost node, and the next attempt forms a new Slice of healthy cubes.
Sources: docs/tasks/dynamic-slicing.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpu_operator import catalog, contract
from tpu_operator.catalog import SliceShape
from tpu_operator.state.views import NodeView

MAX_SLICE_NAME = 49
"""GKE's Slice name limit (the controller appends a hyphen and an 8-character hash to
name Compute Engine resources, which allow 63)."""
FAILED_REASONS = frozenset({"FAILED", "SliceCreationFailed"})


def level(shape: SliceShape) -> str:
    """The partition shape a slice is made of: the cube, or the sub-slice's own shape."""
    return catalog.CUBE_TOPOLOGY if shape.dynamic == "SuperSlice" else shape.topology


def partitions_needed(shape: SliceShape) -> int:
    return shape.chips // catalog.CUBE_CHIPS if shape.dynamic == "SuperSlice" else 1


@dataclass(frozen=True)
class Partition:
    id: str
    nodes: tuple[str, ...]
    states: frozenset[str]
    """The partition's state as its nodes' labels give it (one value when consistent),
    with its cube's for a sub-slice partition."""
    ready: bool
    """Every node Ready and schedulable."""

    def unusable(self, hosts: int) -> str | None:
        """Why no slice may be formed of it now (None: it may)."""
        bad = sorted(self.states - set(contract.PARTITION_USABLE_STATES))
        if bad or not self.states:
            return f"state {'/'.join(bad) or 'unset'}"
        if len(self.nodes) < hosts:
            return f"{len(self.nodes)} of its {hosts} VMs"
        if not self.ready:
            return "a VM not ready or cordoned"
        return None


def partitions(nodes: Iterable[NodeView], shape: str) -> dict[str, Partition]:
    """The partitions of ``shape`` (e.g. 4x4x4) the nodes' labels describe, by id."""
    found: dict[str, tuple[list[str], set[str], list[bool]]] = {}
    for node in nodes:
        entry = node.partitions.get(shape)
        if entry is None:
            continue
        pid, state = entry
        names, states, ready = found.setdefault(pid, ([], set(), []))
        names.append(node.name)
        states.add(state or "UNSET")
        cube = node.partitions.get(catalog.CUBE_TOPOLOGY)
        if cube is not None and shape != catalog.CUBE_TOPOLOGY:
            states.add(cube[1] or "UNSET")  # a sub-slice is no healthier than its cube
        ready.append(node.ready and not node.unschedulable)
    return {
        pid: Partition(pid, tuple(sorted(names)), frozenset(states), all(ready))
        for pid, (names, states, ready) in found.items()
    }


def cube_lost(node: NodeView) -> bool:
    """The node is in a cube whose state forbids slices: lost to any slice running on it."""
    entry = node.partitions.get(catalog.CUBE_TOPOLOGY)
    return entry is not None and entry[1] not in contract.PARTITION_USABLE_STATES


def cube_lost_why(node: NodeView) -> str:
    """What a node lost to its cube's state tells the pods on it."""
    entry = node.partitions.get(catalog.CUBE_TOPOLOGY)
    state = (entry[1] if entry else "") or "UNSET"
    return f"its Ironwood cube is {state} ({contract.partition_state_label(catalog.CUBE_TOPOLOGY)})"


@dataclass(frozen=True)
class Choice:
    ids: tuple[str, ...] | None
    """The partitions to form the slice of, or None (then ``message`` says why)."""
    message: str = ""


def busy_nodes(nodes: Iterable[NodeView], taken: Mapping[str, str]) -> dict[str, str]:
    """Node -> the Slice that holds it: every node of a partition some Slice names, at any
    level (a sub-slice makes its cube busy for super-slices, and a super-slice its cubes'
    sub-slice partitions)."""
    busy: dict[str, str] = {}
    for node in nodes:
        for pid, _ in node.partitions.values():
            if pid in taken:
                busy[node.name] = taken[pid]
                break
    return busy


def choose(shape: SliceShape, found: Mapping[str, Partition], busy: Mapping[str, str]) -> Choice:
    """The partitions a dynamic slice of ``shape`` takes: usable ones none of whose nodes
    another Slice holds (``busy``: node -> Slice name, ``busy_nodes``), in id order."""
    shape_level = level(shape)
    hosts = catalog.shape(shape.accelerator, shape_level).chips // shape.chips_per_host
    need = partitions_needed(shape)
    free: list[str] = []
    unusable: list[str] = []
    held: list[str] = []
    for pid in sorted(found):
        why = found[pid].unusable(hosts)
        if why is not None:
            unusable.append(f"{pid} ({why})")
        elif holder := next((busy[n] for n in found[pid].nodes if n in busy), None):
            held.append(f"{pid} (Slice {holder})")
        else:
            free.append(pid)
    if len(free) >= need:
        return Choice(tuple(free[:need]))
    what = "4x4x4 cubes" if shape.dynamic == "SuperSlice" else f"{shape_level} partitions"
    label = contract.partition_id_label(shape_level)
    parts = [f"needs {need} free healthy {what} (nodes labelled {label}), {len(free)} free"]
    if unusable:
        parts.append("unusable: " + ", ".join(unusable[:5]) + _more(unusable))
    if held:
        parts.append("in other Slices: " + ", ".join(held[:5]) + _more(held))
    if not found:
        parts.append("no node has the label: is the slice controller enabled?")
    return Choice(None, "; ".join(parts))


def _more(items: list[str]) -> str:
    return f" and {len(items) - 5} more" if len(items) > 5 else ""


def slice_name(namespace: str, tpuslice: str, attempt: int) -> str:
    """The GKE Slice of a TPUSlice's attempt: unique across namespaces, at most 49
    characters, a DNS label."""
    digest = hashlib.sha256(f"{namespace}/{tpuslice}".encode()).hexdigest()[:6]
    suffix = f"-{digest}-a{attempt}"
    return tpuslice[: MAX_SLICE_NAME - len(suffix)].rstrip("-") + suffix


def owner_label(namespace: str, tpuslice: str) -> str:
    """Label value naming the TPUSlice a Slice belongs to (a digest: 63 characters)."""
    return hashlib.sha256(f"{namespace}/{tpuslice}".encode()).hexdigest()[:40]


def owner_selector(namespace: str, tpuslice: str) -> str:
    return f"{contract.LABEL_SLICE_OWNER}={owner_label(namespace, tpuslice)}"


def slice_body(
    name: str, shape: SliceShape, ids: Iterable[str], namespace: str, tpuslice: str
) -> dict[str, Any]:
    """The Slice object that asks GKE's slice controller to form the slice."""
    return {
        "apiVersion": contract.SLICE_API_VERSION,
        "kind": "Slice",
        "metadata": {
            "name": name,
            "labels": {
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
                contract.LABEL_SLICE_OWNER: owner_label(namespace, tpuslice),
            },
            "annotations": {contract.ANNOTATION_SLICE_OWNER: f"{namespace}/{tpuslice}"},
        },
        "spec": {
            "type": shape.accelerator,
            "topology": shape.topology,
            "partitionIds": list(ids),
        },
    }


@dataclass(frozen=True)
class SliceState:
    ready: bool
    failed: bool
    reason: str
    message: str


def slice_state(body: Mapping[str, Any]) -> SliceState:
    """Where GKE's slice controller is with a Slice (its ``Ready`` condition)."""
    for condition in (body.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            reason = str(condition.get("reason") or "")
            return SliceState(
                ready=condition.get("status") == "True",
                failed=reason in FAILED_REASONS,
                reason=reason,
                message=str(condition.get("message") or ""),
            )
    return SliceState(False, False, "SliceNotCreated", "")


def taken_partitions(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Partition id -> name of the Slice that holds it (every Slice, anyone's)."""
    taken: dict[str, str] = {}
    for body in slices:
        name = (body.get("metadata") or {}).get("name", "")
        for pid in (body.get("spec") or {}).get("partitionIds") or ():
            taken[str(pid)] = name
    return taken
