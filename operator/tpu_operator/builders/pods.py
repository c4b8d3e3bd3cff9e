"""Build one worker pod from a slice's template and its wiring (pure: dicts in, dict out).

Merge rules between the user's pod template and what the operator sets:

- Identity and wiring are the operator's: name, ``hostname`` (= pod name), ``subdomain``
  (the headless Service), ``restartPolicy: Never``, owner reference, and the labels
  ``tpu-operator.dev/*`` (the template's labels and annotations are kept beside them, but
  for any of the operator's own prefix).
- Node selectors merge: the operator's keys (accelerator, topology, node pool or, for a
  pool GKE is to create for the slice, ``tpu-operator.dev/slice-pool``, or the GKE Slice
  of an Ironwood dynamic slice, spot, reservation, a capacity mode's:
  ``placement/capacity.py``) win, other template keys stay. ``placement.spot: false``
  becomes a required node affinity (``cloud.google.com/gke-spot NotIn [true]``: on-demand
  nodes have no spot label), ANDed into every node selector term of the template's own
  affinity.
- Tolerations: the template's are kept; the TPU taint toleration is added (and that of
  the slice's own pool's ``tpu-operator.dev/slice-pool`` taint), and NoExecute
  tolerations for ``node.kubernetes.io/not-ready`` and ``unreachable`` with the failure
  policy's ``nodeNotReadyTimeoutSeconds`` are added unless the template tolerates those.
  A flex-start or queued-provisioning slice also tolerates its nodes' taint and, when it
  consumes a ProvisioningRequest the operator made, carries its two annotations.
- The container named ``worker`` gets ``google.com/tpu`` requests = limits = chips per VM
  (overriding the template), the contract env first, then the template's env (a template
  entry with a contract name replaces the operator's value, except the per-pod identity
  names, which the CRD forbids in templates; a numeric ``TPU_PROCESS_PORT`` also moves
  ``TPU_PROCESS_ADDRESSES`` to that port), and the named ports ``coordinator`` and
  ``metrics`` unless the template already declares those names or port numbers.
- A supervised worker (in-place restarts, ``builders/supervision.py``) also gets the
  ``control`` port and ``TPU_OPERATOR_CONTROL_PORT``, a readiness probe on the
  supervisor's ``/readyz`` (replacing the template's), the job's control key mounted from
  its Secret, and the ``tpu-operator.dev/supervised`` annotation.
- With ``hostNetwork: true`` the DNS policy defaults to ``ClusterFirstWithHostNet``.
- Everything else in the template (other containers, volumes, service account, affinity,
  priority, scheduler name, grace period ...) passes through unchanged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tpu_operator import contract
from tpu_operator.builders.supervision import Supervision, key_volume, supervise_container
from tpu_operator.builders.wiring import PodWiring, contract_env, with_template_env
from tpu_operator.placement.capacity import CapacityMode
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL

NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(frozen=True)
class Owner:
    """The object that owns (and garbage-collects) a child."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class NodePlacement:
    """Node constraints of a slice's pods."""

    node_pool: str | None = None
    spot: bool | None = None
    reservation: str | None = None
    extra_selector: dict[str, str] = field(default_factory=dict)
    not_ready_timeout_seconds: int = 60
    slice_pool: str | None = None
    """The slice-pool label value of a pool GKE creates (or created) for this slice alone
    (placement/provisioning.py). Without ``node_pool`` the pods select it, so that GKE
    creates the pool; either way they tolerate its ``NoSchedule`` taint."""
    dynamic_slice: str | None = None
    """Ironwood dynamic slicing: the GKE Slice formed for the pods' attempt
    (``placement/dynamic.py``). The pods select its nodes (``cloud.google.com/gke-tpu-slice``)
    and carry ``cloud.google.com/gke-tpu-slice-topology``."""
    capacity: CapacityMode = field(default_factory=CapacityMode)
    """Flex-start or queued provisioning (``placement/capacity.py``): its node selector,
    tolerations and, for a ProvisioningRequest the pods consume, annotations."""

    def node_selector(self, wiring: PodWiring) -> dict[str, str]:
        selector = dict(self.extra_selector)
        selector[contract.NODE_LABEL_ACCELERATOR] = wiring.shape.accelerator
        selector[contract.NODE_LABEL_TOPOLOGY] = wiring.shape.topology
        if self.dynamic_slice:
            selector[contract.NODE_LABEL_TPU_SLICE] = self.dynamic_slice
        if self.node_pool:
            selector[contract.NODE_LABEL_NODEPOOL] = self.node_pool
        elif self.slice_pool:
            selector[SLICE_POOL_LABEL] = self.slice_pool
        if self.spot:
            selector[contract.NODE_LABEL_SPOT] = "true"
        if self.reservation:
            selector[contract.NODE_LABEL_RESERVATION] = self.reservation
        selector.update(self.capacity.node_selector())
        return selector

    def tolerations(self) -> list[dict[str, Any]]:
        """Tolerations of the slice's own pool (GKE workload separation's taint) and of
        its capacity mode's nodes."""
        own = self.capacity.tolerations()
        if not self.slice_pool:
            return own
        return [
            {
                "key": SLICE_POOL_LABEL,
                "operator": "Equal",
                "value": self.slice_pool,
                "effect": "NoSchedule",
            },
            *own,
        ]


def _require(affinity: dict[str, Any], expression: dict[str, Any]) -> dict[str, Any]:
    """``affinity`` with ``expression`` ANDed into every required node selector term."""
    merged = copy.deepcopy(affinity)
    node = merged["nodeAffinity"] = dict(merged.get("nodeAffinity") or {})
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node[key] = dict(node.get(key) or {})
    terms = [dict(term or {}) for term in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), expression]
    required["nodeSelectorTerms"] = terms
    return merged


def pod_labels(wiring: PodWiring, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Labels of a worker pod: job, slice, indices, attempt (plus passed-through labels)."""
    labels = dict(extra or {})
    labels.update(
        {
            contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            contract.LABEL_JOB_NAME: wiring.job_name,
            contract.LABEL_SLICE_NAME: wiring.slice_name,
            contract.LABEL_SLICE_INDEX: str(wiring.slice_index),
            contract.LABEL_WORKER_INDEX: str(wiring.worker_index),
            contract.LABEL_RESTART_ATTEMPT: str(wiring.attempt),
        }
    )
    return labels


def _tolerations(existing: list[dict[str, Any]], timeout: int) -> list[dict[str, Any]]:
    tolerations = list(existing)
    tolerates_tpu = any(
        t.get("key") == contract.TPU_TAINT_KEY
        and t.get("effect") in (None, "", contract.TPU_TAINT_EFFECT)
        for t in tolerations
    ) or any(t.get("operator") == "Exists" and not t.get("key") for t in tolerations)
    if not tolerates_tpu:
        tolerations.append(
            {
                "key": contract.TPU_TAINT_KEY,
                "operator": "Equal",
                "value": contract.TPU_TAINT_VALUE,
                "effect": contract.TPU_TAINT_EFFECT,
            }
        )
    for key in NOT_READY_TAINTS:
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": timeout,
                }
            )
    return tolerations


def _merge_env(
    operator_env: list[dict[str, Any]], template_env: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    overridden = {e.get("name") for e in template_env}
    return [e for e in operator_env if e["name"] not in overridden] + list(template_env)


def _merge_ports(container: dict[str, Any], wiring: PodWiring) -> list[dict[str, Any]]:
    ports = list(container.get("ports") or [])
    names = {p.get("name") for p in ports}
    numbers = {p.get("containerPort") for p in ports}
    wanted = (
        (contract.PORT_NAME_COORDINATOR, wiring.ports.coordinator),
        (contract.PORT_NAME_METRICS, wiring.ports.metrics),
    )
    for name, number in wanted:
        if name not in names and number not in numbers:
            ports.append({"name": name, "containerPort": number, "protocol": "TCP"})
    return ports


def _worker_container(container: dict[str, Any], wiring: PodWiring) -> dict[str, Any]:
    worker = copy.deepcopy(container)
    chips = str(wiring.shape.chips_per_host)
    # The CRD types these parts (objects, maps), so only null needs care here.
    resources = dict(worker.get("resources") or {})
    for part in ("requests", "limits"):
        resources[part] = {**(resources.get(part) or {}), contract.TPU_RESOURCE: chips}
    worker["resources"] = resources
    template_env = list(worker.get("env") or [])
    worker["env"] = _merge_env(contract_env(with_template_env(wiring, template_env)), template_env)
    worker["ports"] = _merge_ports(worker, wiring)
    return worker


def _users(values: dict[str, str] | None) -> dict[str, str]:
    """A template's labels or annotations, less the operator's own (``tpu-operator.dev/``):
    only the operator says what those are (a template's ``supervised`` annotation would
    otherwise pass for the operator's)."""
    return {k: v for k, v in (values or {}).items() if not k.startswith(contract.PREFIX)}


def worker_pod(
    *,
    namespace: str,
    wiring: PodWiring,
    template: dict[str, Any],
    owner: Owner,
    placement: NodePlacement,
    extra_labels: dict[str, str] | None = None,
    supervision: Supervision | None = None,
) -> dict[str, Any]:
    """The full Pod object for one worker of one attempt (``supervision``: its worker
    container runs the supervisor, builders/supervision.py)."""
    template_meta = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    labels = _users(template_meta.get("labels"))
    labels.update(pod_labels(wiring, extra_labels))
    metadata: dict[str, Any] = {
        "name": wiring.pod_name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner.reference()],
    }
    annotations = _users(template_meta.get("annotations"))
    if placement.dynamic_slice:
        annotations[contract.ANNOTATION_SLICE_TOPOLOGY] = wiring.shape.topology
    annotations.update(placement.capacity.annotations())
    if annotations:
        metadata["annotations"] = annotations

    spec["hostname"] = wiring.pod_name
    spec["subdomain"] = wiring.service
    spec["restartPolicy"] = "Never"
    selector = dict(spec.get("nodeSelector") or {})
    selector.update(placement.node_selector(wiring))
    spec["nodeSelector"] = selector
    if placement.spot is False:
        # On-demand nodes carry no spot label at all (GKE sets it on Spot VMs only).
        spec["affinity"] = _require(
            spec.get("affinity") or {},
            {"key": contract.NODE_LABEL_SPOT, "operator": "NotIn", "values": ["true"]},
        )
    spec["tolerations"] = _tolerations(
        list(spec.get("tolerations") or []), placement.not_ready_timeout_seconds
    )
    spec["tolerations"] += [t for t in placement.tolerations() if t not in spec["tolerations"]]
    spec["containers"] = [
        _worker_container(c, wiring) if c.get("name") == contract.WORKER_CONTAINER else c
        for c in spec.get("containers") or []
    ]
    if supervision is not None:
        spec["containers"] = [
            supervise_container(c, supervision) if c.get("name") == contract.WORKER_CONTAINER else c
            for c in spec["containers"]
        ]
        volumes = [v for v in spec.get("volumes") or [] if v.get("name") != contract.CONTROL_VOLUME]
        spec["volumes"] = [*volumes, key_volume(supervision)]
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            contract.ANNOTATION_SUPERVISED: "true",
        }
    if spec.get("hostNetwork"):
        spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
