"""A stand-in for GKE's slice controller (Ironwood dynamic slicing, ``--enable-slice-controller``).

On GKE the controller serves ``Slice`` objects (``accelerator.gke.io/v1beta1``,
cluster-scoped): ``spec.type`` tpu7x, ``spec.topology`` and ``spec.partitionIds`` (4x4x4
cube ids for a super-slice, one partition id of the sub-slice's shape for a sub-slice).
It forms the slice (OCS and ICI links), sets the ``Ready`` condition (reasons
``SliceNotCreated``, ``ACTIVATING``, ``ACTIVE``, ``ACTIVE_DEGRADED``, ``FAILED``,
``SliceCreationFailed``, ``DEACTIVATING``), labels the slice's nodes
``cloud.google.com/gke-tpu-slice=<name>`` and ``cloud.google.com/gke-tpu-topology=<topology>``,
and holds the finalizer ``accelerator.gke.io/slice-finalizer`` until it has dismantled it.

This stand-in does the same over the nodes of ``dynamic_slicing`` pools
(``localcluster/pools.py``), which carry the partition id and state labels. It installs
the Slice CRD when the first such pool appears and then polls (the Slices are few). How it
differs from GKE: docs/contributing/localcluster.md ("Ironwood dynamic slicing").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localcluster.agent.kube import Kube
from localcluster.pools import PARTITION_PREFIX, SUB_SLICE_SHAPES, TOPOLOGY_LABEL

log = logging.getLogger("localcluster.slices")

GROUP = "accelerator.gke.io"
VERSION = "v1beta1"
PATH = f"/apis/{GROUP}/{VERSION}/slices"
FINALIZER = "accelerator.gke.io/slice-finalizer"
SLICE_LABEL = "cloud.google.com/gke-tpu-slice"
MODE_SELECTOR = "cloud.google.com/gke-accelerator-topology-mode=PROVISION_ONLY"
USABLE = ("HEALTHY", "DEGRADED")
CUBE = "4x4x4"
CUBE_CHIPS = 64
MAX_CHIPS = 9216

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"slices.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Cluster",
        "names": {
            "plural": "slices",
            "singular": "slice",
            "kind": "Slice",
            "listKind": "SliceList",
        },
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Topology", "type": "string", "jsonPath": ".spec.topology"},
                    {
                        "name": "State",
                        "type": "string",
                        "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
                    },
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        # GKE's validating webhook: a name of at most 49 characters (the
                        # controller appends a hash for Compute Engine names).
                        "x-kubernetes-validations": [
                            {
                                "rule": "size(self.metadata.name) <= 49",
                                "message": "metadata.name: at most 49 characters",
                            }
                        ],
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["type", "topology"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["tpu7x"]},
                                    "topology": {
                                        "type": "string",
                                        "pattern": "^[0-9]+x[0-9]+x[0-9]+$",
                                    },
                                    "partitionIds": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def _dims(topology: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in topology.split("x"))
    except ValueError:
        return ()


def topology_problem(topology: str, partitions: int) -> tuple[str, int] | None:
    """(the partition shape, how many) a Slice of ``topology`` is made of, or None if GKE
    refuses the topology or the count of ``partitions``."""
    dims = _dims(topology)
    if len(dims) != 3:
        return None
    if topology in SUB_SLICE_SHAPES:
        shape, need = topology, 1
    elif all(d % 4 == 0 and d > 0 for d in dims) and dims[0] <= dims[1] <= dims[2]:
        chips = dims[0] * dims[1] * dims[2]
        if chips > MAX_CHIPS:
            return None
        shape, need = CUBE, chips // CUBE_CHIPS
    else:
        return None
    return (shape, need) if partitions == need else None


@dataclass(frozen=True)
class Verdict:
    """What the controller makes of a Slice now."""

    ready: bool
    reason: str
    message: str
    nodes: tuple[str, ...] = ()


def assess(
    spec: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, str]],
    held: Mapping[str, str],
) -> Verdict:
    """A Slice's state from its spec, the labels of the cube nodes (by name) and the
    partitions other formed Slices hold (id -> Slice name)."""
    topology = str(spec.get("topology") or "")
    ids = [str(p) for p in spec.get("partitionIds") or ()]
    found = topology_problem(topology, len(ids))
    if found is None:
        return Verdict(
            False,
            "SliceCreationFailed",
            f"Prerequisites validation failed: partition count does not match topology "
            f"{topology} ({len(ids)} partitionIds)",
        )
    shape, _ = found
    id_label, state_label = f"{PARTITION_PREFIX}{shape}-id", f"{PARTITION_PREFIX}{shape}-state"
    members: list[str] = []
    for pid in ids:
        names = sorted(n for n, labels in nodes.items() if labels.get(id_label) == pid)
        if not names:
            return Verdict(False, "SliceCreationFailed", f"no node of partition {pid}")
        for name in names:  # a node is in one slice at a time, whatever its level
            holder = next(
                (
                    held[v]
                    for k, v in nodes[name].items()
                    if k.startswith(PARTITION_PREFIX) and k.endswith("-id") and v in held
                ),
                None,
            )
            if holder is not None:
                return Verdict(
                    False,
                    "SliceCreationFailed",
                    f"partition {pid}: node {name} is used by Slice {holder}",
                )
        states = {nodes[n].get(state_label, "UNSET") for n in names}
        cube_states = {nodes[n].get(f"{PARTITION_PREFIX}{CUBE}-state", "UNSET") for n in names}
        bad = sorted((states | cube_states) - set(USABLE))
        if bad:
            return Verdict(False, "FAILED", f"partition {pid} is {'/'.join(bad)}")
        members += names
    degraded = any(
        nodes[n].get(state_label) == "DEGRADED"
        or nodes[n].get(f"{PARTITION_PREFIX}{CUBE}-state") == "DEGRADED"
        for n in members
    )
    return Verdict(True, "ACTIVE_DEGRADED" if degraded else "ACTIVE", "", tuple(members))


def _ready(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (body.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition  # type: ignore[no-any-return]
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SliceController:
    """Forms Slices of the cube nodes; started by the agent, active once a cube exists."""

    def __init__(self, kube: Kube, has_cubes: Callable[[], bool], interval: float = 0.5):
        self.kube = kube
        self.has_cubes = has_cubes
        self.interval = interval
        self.installed = False

    async def run(self) -> None:
        while True:
            try:
                if self.has_cubes():
                    if not self.installed:
                        await self._install()
                    await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad pass must not end the stand-in
                log.exception("slice controller pass failed")
            await asyncio.sleep(self.interval)

    async def _install(self) -> None:
        status, body = await self.kube.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD
        )
        if status not in (201, 409):
            raise RuntimeError(f"cannot install the Slice CRD: {status} {body}")
        for _ in range(100):  # established: the collection answers
            status, _ = await self.kube.request("GET", PATH)
            if status == 200:
                self.installed = True
                log.info("slice controller stand-in: Slice CRD installed")
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the Slice CRD was not established")

    async def step(self) -> None:
        status, listed = await self.kube.request("GET", PATH)
        if status != 200:
            return
        status, node_list = await self.kube.request(
            "GET", "/api/v1/nodes", params={"labelSelector": MODE_SELECTOR}
        )
        if status != 200:
            return
        nodes = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {}
            for n in node_list.get("items", [])
        }
        items = sorted(
            listed.get("items", []),
            key=lambda s: (s["metadata"].get("creationTimestamp", ""), s["metadata"]["name"]),
        )
        held: dict[str, str] = {}
        for body in items:  # formed (or forming) slices hold their partitions first
            condition = _ready(body)
            if condition is not None and condition.get("reason") in (
                "ACTIVATING",
                "ACTIVE",
                "ACTIVE_DEGRADED",
            ):
                for pid in (body.get("spec") or {}).get("partitionIds") or ():
                    held[str(pid)] = body["metadata"]["name"]
        for body in items:
            await self._reconcile(body, nodes, held)

    async def _reconcile(
        self,
        body: dict[str, Any],
        nodes: Mapping[str, Mapping[str, str]],
        held: dict[str, str],
    ) -> None:
        meta = body["metadata"]
        name = meta["name"]
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            await self._unlabel(name, nodes)
            if FINALIZER in finalizers:
                rest = [f for f in finalizers if f != FINALIZER]
                await self._patch(f"{PATH}/{name}", {"metadata": {"finalizers": rest or None}})
            return
        if FINALIZER not in finalizers:
            await self._patch(
                f"{PATH}/{name}", {"metadata": {"finalizers": [*finalizers, FINALIZER]}}
            )
        condition = _ready(body)
        reason = condition.get("reason") if condition else None
        if reason in ("FAILED", "SliceCreationFailed"):
            return  # terminal (GKE retries only with slice.gke.io/retry-on-failure)
        others = {pid: s for pid, s in held.items() if s != name}
        verdict = assess(body.get("spec") or {}, nodes, others)
        if reason is None:
            if verdict.ready:  # validated: forming takes a pass
                await self._status(name, False, "ACTIVATING", "forming the slice")
                for pid in (body.get("spec") or {}).get("partitionIds") or ():
                    held[str(pid)] = name
            else:
                await self._status(name, False, verdict.reason, verdict.message)
            return
        if not verdict.ready:
            log.info("slice %s: %s (%s)", name, verdict.reason, verdict.message)
            await self._unlabel(name, nodes)
            await self._status(name, False, "FAILED", verdict.message)
            return
        if reason == "ACTIVATING" or reason != verdict.reason:
            topology = str((body.get("spec") or {}).get("topology"))
            await self._label(verdict.nodes, {SLICE_LABEL: name, TOPOLOGY_LABEL: topology})
            await self._status(name, True, verdict.reason, "")

    async def _label(self, names: Iterable[str], labels: Mapping[str, str | None]) -> None:
        for node in names:
            await self._patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": dict(labels)}})

    async def _unlabel(self, name: str, nodes: Mapping[str, Mapping[str, str]]) -> None:
        mine = [n for n, labels in nodes.items() if labels.get(SLICE_LABEL) == name]
        await self._label(mine, {SLICE_LABEL: None, TOPOLOGY_LABEL: None})

    async def _status(self, name: str, ready: bool, reason: str, message: str) -> None:
        condition = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": _now(),
        }
        await self._patch(f"{PATH}/{name}/status", {"status": {"conditions": [condition]}})

    async def _patch(self, path: str, body: Mapping[str, Any]) -> None:
        status, answer = await self.kube.request(
            "PATCH", path, body, content_type="application/merge-patch+json"
        )
        if status >= 400 and status != 404:
            log.warning("PATCH %s: %s %s", path, status, answer)
