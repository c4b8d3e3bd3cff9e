"""Build the TPUSlices of a TPUJob (pure)."""

from __future__ import annotations

from typing import Any

from tpu_operator import contract
from tpu_operator.builders.pods import Owner


def job_slice(
    *,
    job_name: str,
    namespace: str,
    job_spec: dict[str, Any],
    index: int,
    attempt: int,
    owner: Owner,
    node_pool: str | None,
    not_before: str | None,
    suspend: bool,
    extra_labels: dict[str, str] | None = None,
    in_place_from: int | None = None,
    await_start: bool = False,
    control_key_secret: str | None = None,
    control_key_id: str | None = None,
    world: list[int] | None = None,
    gke_slice: str | None = None,
) -> dict[str, Any]:
    """TPUSlice ``index`` of a job, as the job wants it for ``attempt``.

    ``job_spec`` is the job's spec as stored (camelCase); the shape, template, placement
    and ports are copied verbatim so the slice builds its pods from the same source.
    ``world``: the slices the attempt runs on, when an elastic job runs on fewer than
    all of them (``worldSlices``). ``gke_slice``: the GKE Slice an admission formed for
    the slice (``gkeSlice``).
    """
    name = contract.slice_name(job_name, index)
    spec: dict[str, Any] = {
        **{k: v for k, v in job_spec["slice"].items() if v is not None},
        "template": job_spec["template"],
        "jobName": job_name,
        "service": job_name,
        "sliceIndex": index,
        "numSlices": job_spec.get("numSlices", 1),
        "attempt": attempt,
        "suspend": suspend,
    }
    for key in ("placement", "ports"):
        if job_spec.get(key) is not None:
            spec[key] = job_spec[key]
    failure_policy = job_spec.get("failurePolicy") or {}
    if "nodeNotReadyTimeoutSeconds" in failure_policy:
        # Only the pods' toleration timeout matters to a job-owned slice; restarts are the
        # job's decision.
        spec["failurePolicy"] = {
            "nodeNotReadyTimeoutSeconds": failure_policy["nodeNotReadyTimeoutSeconds"]
        }
    if node_pool:
        spec["nodePool"] = node_pool
    if not_before:
        spec["notBefore"] = not_before
    if in_place_from is not None:
        spec["inPlaceFrom"] = in_place_from
    if await_start:
        spec["awaitStart"] = True
    if control_key_secret:
        spec["controlKeySecret"] = control_key_secret
    if control_key_id:
        spec["controlKeyId"] = control_key_id
    if world is not None:
        spec["worldSlices"] = list(world)
    if gke_slice:
        spec["gkeSlice"] = gke_slice
    labels = dict(extra_labels or {})
    labels.update(
        {
            contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            contract.LABEL_JOB_NAME: job_name,
            contract.LABEL_SLICE_INDEX: str(index),
        }
    )
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.SLICE_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    }


def slice_patch(
    desired: dict[str, Any], current: dict[str, Any], *, placement: bool = False
) -> dict[str, Any] | None:
    """Merge patch bringing an existing slice's job-managed fields to ``desired`` (a field
    ``desired`` leaves out is removed: null in a merge patch).

    Only the fields the job manages at run time (attempt, backoff, suspension, node pool,
    in-place restart; the placement too when ``placement``: a job that fell back to
    another capacity step) are compared; the shape and template of a running slice are not
    rewritten.
    """
    fields: tuple[str, ...] = (
        "attempt",
        "notBefore",
        "suspend",
        "nodePool",
        "inPlaceFrom",
        "awaitStart",
        "controlKeySecret",
        "controlKeyId",
        "worldSlices",
        "gkeSlice",
    )
    want = desired["spec"]
    have = current.get("spec") or {}
    if placement:
        fields += ("placement",)
    changes = {k: want.get(k) for k in fields if want.get(k) != have.get(k)}
    if "placement" in changes and changes["placement"] is not None:
        # a merge patch: the keys the step drops are set to null
        dropped = {k: None for k in have.get("placement") or {} if k not in changes["placement"]}
        changes["placement"] = {**dropped, **changes["placement"]}
    if not want.get("awaitStart") and not have.get("awaitStart"):
        changes.pop("awaitStart", None)  # left out, or false by the schema's default
    return {"spec": changes} if changes else None
