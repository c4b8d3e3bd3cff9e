"""GKE's capacity modes for a slice's pods: flex-start and queued provisioning (pure).

``placement.capacity`` picks how GKE obtains the slice's VMs (docs/tasks/capacity.md has
the sources):

- **FlexStart** (Dynamic Workload Scheduler's flex-start VMs, run for at most 7 days):
  the pods select ``cloud.google.com/gke-flex-start: "true"`` (the label GKE puts on
  flex-start nodes, and the selector its flex-start samples use) and, with
  ``placement.maxRunDurationSeconds``, ``cloud.google.com/gke-max-run-duration-seconds``
  (the label key GKE's cluster autoscaler reads for the VMs' maximum run duration). They
  tolerate the optional ``cloud.google.com/gke-flex-start`` taint.
- **QueuedProvisioning** (flex-start with queued provisioning, ProvisioningRequest class
  ``queued-provisioning.gke.io``): GKE creates every VM the request asks for at once, or
  none. The pods select ``cloud.google.com/gke-queued: "true"`` (as xpk does) and
  tolerate the ``cloud.google.com/gke-queued`` taint of such node pools (GKE's TPU
  sample). They consume a ProvisioningRequest by the annotations
  ``autoscaling.x-k8s.io/consume-provisioning-request`` and
  ``autoscaling.x-k8s.io/provisioning-class-name``: under Kueue its ProvisioningRequest
  admission check creates the request for the whole job and adds those annotations to
  the pods (its podSetUpdates); without Kueue the operator creates one request per
  slice (``provisioning_request``), named for the slice, the attempt and the try, so a
  restarted operator finds the one it made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from tpu_operator import contract

Capacity = Literal["FlexStart", "QueuedProvisioning"]
FLEX_START: Final = "FlexStart"
QUEUED: Final = "QueuedProvisioning"
MAX_RUN_DURATION_SECONDS: Final = 7 * 24 * 3600
"""Flex-start VMs run for at most seven days; GKE's default when none is given."""
PROVISIONING_REQUEST_API: Final = "autoscaling.x-k8s.io/v1"
PROVISIONING_REQUEST_PLURAL: Final = "provisioningrequests"
KUEUE_MAX_RUN_DURATION: Final = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
"""Workload annotation Kueue passes to the ProvisioningRequest it creates as the
``maxRunDurationSeconds`` parameter (Kueue's ``ProvReqAnnotationPrefix``)."""

# ProvisioningRequest condition types (k8s.io/autoscaler/cluster-autoscaler/apis,
# provisioningrequest/autoscaling.x-k8s.io/v1/types.go).
ACCEPTED: Final = "Accepted"
PROVISIONED: Final = "Provisioned"
FAILED: Final = "Failed"
BOOKING_EXPIRED: Final = "BookingExpired"
CAPACITY_REVOKED: Final = "CapacityRevoked"


@dataclass(frozen=True)
class CapacityMode:
    """How GKE obtains a slice's VMs, and what the pods must carry for it."""

    capacity: Capacity | None = None
    max_run_duration_seconds: int | None = None
    provisioning_request: str | None = None
    """The ProvisioningRequest the pods consume (queued provisioning without Kueue)."""

    def node_selector(self) -> dict[str, str]:
        if self.capacity == FLEX_START:
            selector = {contract.NODE_LABEL_FLEX_START: "true"}
            if self.max_run_duration_seconds:
                selector[contract.NODE_LABEL_MAX_RUN_DURATION] = str(self.max_run_duration_seconds)
            return selector
        if self.capacity == QUEUED:
            return {contract.NODE_LABEL_QUEUED: "true"}
        return {}

    def tolerations(self) -> list[dict[str, Any]]:
        key = {FLEX_START: contract.NODE_LABEL_FLEX_START, QUEUED: contract.NODE_LABEL_QUEUED}
        if self.capacity not in key:
            return []
        return [{"key": key[self.capacity], "operator": "Exists", "effect": "NoSchedule"}]

    def annotations(self) -> dict[str, str]:
        if self.capacity != QUEUED or not self.provisioning_request:
            return {}
        return {
            contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST: self.provisioning_request,
            contract.ANNOTATION_PROVISIONING_CLASS: contract.PROVISIONING_CLASS_QUEUED,
        }


def request_name(slice_name: str, attempt: int, tries: int) -> str:
    """The ProvisioningRequest of a slice's attempt, try ``tries`` (0 first): one name per
    try, the same after an operator restart. Its PodTemplate has the same name."""
    return f"{slice_name}-a{attempt}-r{tries}"


def request_objects(
    *,
    name: str,
    namespace: str,
    pod: dict[str, Any],
    count: int,
    max_run_duration_seconds: int | None,
    owner: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodTemplate and the ProvisioningRequest for ``count`` pods like ``pod`` (one
    slice's workers), as GKE's queued provisioning without Kueue takes them."""
    spec = pod.get("spec") or {}
    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict((pod.get("metadata") or {}).get("labels") or {}),
            "ownerReferences": [owner],
        },
        "template": {
            "metadata": {"labels": dict((pod.get("metadata") or {}).get("labels") or {})},
            "spec": {
                k: v
                for k, v in spec.items()
                if k
                in (
                    "containers",
                    "nodeSelector",
                    "affinity",
                    "tolerations",
                    "priorityClassName",
                    "restartPolicy",
                    "hostNetwork",
                )
            },
        },
    }
    request: dict[str, Any] = {
        "apiVersion": PROVISIONING_REQUEST_API,
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict((pod.get("metadata") or {}).get("labels") or {}),
            "ownerReferences": [owner],
        },
        "spec": {
            "provisioningClassName": contract.PROVISIONING_CLASS_QUEUED,
            "podSets": [{"count": count, "podTemplateRef": {"name": name}}],
        },
    }
    if max_run_duration_seconds:
        request["spec"]["parameters"] = {"maxRunDurationSeconds": str(max_run_duration_seconds)}
    return template, request


RequestState = Literal["Pending", "Accepted", "Provisioned", "Failed", "BookingExpired", "Revoked"]


def request_state(request: dict[str, Any] | None) -> tuple[RequestState, str]:
    """Where a ProvisioningRequest stands, and the autoscaler's message for it. Failed,
    BookingExpired (capacity came but no pod took it in time) and Revoked end it."""
    if not request:
        return "Pending", ""
    conditions = {c.get("type"): c for c in (request.get("status") or {}).get("conditions") or []}

    def true(kind: str) -> dict[str, Any] | None:
        cond = conditions.get(kind)
        return cond if cond is not None and cond.get("status") == "True" else None

    for kind, state in (
        (FAILED, "Failed"),
        (CAPACITY_REVOKED, "Revoked"),
        (BOOKING_EXPIRED, "BookingExpired"),
        (PROVISIONED, "Provisioned"),
        (ACCEPTED, "Accepted"),
    ):
        cond = true(kind)
        if cond is not None:
            return state, str(cond.get("message") or cond.get("reason") or "")  # type: ignore[return-value]
    return "Pending", ""
