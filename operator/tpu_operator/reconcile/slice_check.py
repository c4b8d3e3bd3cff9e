"""Kueue's Ironwood slice admission check (``accelerator.gke.io/slice``), served for the
operator's own Workloads: I/O part.

GKE's Kueue slice controller serves that check only for Workloads a JobSet, a Job or a
LeaderWorkerSet owns; it skips a TPUJob's without ever setting the check. The operator
serves it for the Workloads its TPUJobs own, as GKE's controller does for a JobSet's
(``policies/slice_check.py`` decides, after GKE's source): once Kueue reserved quota on
hosts, it forms one GKE Slice per slice of the partitions those hosts are in, and sets the
check Ready (with the pods' ``cloud.google.com/gke-tpu-topology`` selector) when every
Slice is; Retry when one fails, is deleted, or a partition under it turns unhealthy (Kueue
evicts and places the job again); the Slices are deleted once the job is evicted or done
and its pods are gone, or when the job is deleted (``release``). Both controllers can serve
one ClusterQueue: each acts on the Workloads of its own owners only.

It runs inside the TPUJob's reconcile (``reconcile/queueing.KueueAdmission``): ``observe``
reads (the AdmissionChecks' controllers once each, and the Slices), ``act`` runs after the
job's status is written. AdmissionChecks of this controller are marked Active when a queue
naming them is read (``activate``): Kueue holds a ClusterQueue whose checks are not active.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from tpu_operator import contract
from tpu_operator.api.conditions import stamp
from tpu_operator.builders.workload import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    POD_SET,
    QUOTA_RESERVED,
    condition_of,
    condition_true,
    with_condition,
)
from tpu_operator.catalog import SliceShape
from tpu_operator.placement import dynamic
from tpu_operator.policies import slice_check
from tpu_operator.reconcile.context import Context, job_ref, workload_path
from tpu_operator.reconcile.slice_capacity import SLICES_PATH, node_partitions
from tpu_operator.runtime.kube import ApiError

log = logging.getLogger(__name__)

ADMISSION_CHECK_PLURAL = "admissionchecks"
SETTLED_SECONDS = 30.0
"""How often a Ready check of a job that keeps its admission lists the Slices again (for a
Slice GKE failed or someone deleted); a pod or node event in between reads none."""


def _checks_path(name: str, subresource: str | None = None) -> str:
    path = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/{ADMISSION_CHECK_PLURAL}/{name}"
    return f"{path}/{subresource}" if subresource else path


async def controller_of(ctx: Context, name: str) -> str:
    """An AdmissionCheck's ``controllerName``, read once ("" when it does not exist or
    cannot be read: such a check is not the operator's to serve)."""
    known = ctx.admission_checks.get(name)
    if known is not None:
        return known
    found = await _read_check(ctx, name)
    return str(((found or {}).get("spec") or {}).get("controllerName") or "")


async def _read_check(ctx: Context, name: str) -> dict[str, Any] | None:
    """An AdmissionCheck, its controller remembered (None when it does not exist or cannot
    be read)."""
    try:
        found = await ctx.kube.get(_checks_path(name))
    except ApiError as exc:
        if exc.apiserver_trouble:
            raise
        log.warning(
            "cannot read AdmissionCheck %s (%s): grant the operator get on admissionchecks "
            "(the chart does with kueue.enabled)",
            name,
            exc.message,
        )
        return None
    if found is not None:
        ctx.admission_checks[name] = str((found.get("spec") or {}).get("controllerName") or "")
    return found


async def activate(ctx: Context, names: list[str]) -> None:
    """Mark the slice controller's AdmissionChecks among ``names`` Active, as GKE's
    controller does for its own (Kueue keeps a ClusterQueue whose checks are not active
    from admitting anything). Each is read once per operator (a known other controller's
    not at all)."""
    for name in names:
        if name in ctx.active_checks or ctx.admission_checks.get(name, "") not in (
            "",
            slice_check.CONTROLLER_NAME,
        ):
            continue
        found = await _read_check(ctx, name)
        if found is None or ctx.admission_checks[name] != slice_check.CONTROLLER_NAME:
            continue
        if not condition_true(found, "Active"):
            conditions = with_condition(
                found, "Active", True, "Active", "The admission check is active", stamp(ctx.clock())
            )
            try:
                await ctx.kube.merge_patch(
                    _checks_path(name, "status"),
                    {
                        "metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
                        "status": {"conditions": conditions},
                    },
                )
            except ApiError as exc:
                if exc.apiserver_trouble:
                    raise
                log.warning(
                    "cannot mark AdmissionCheck %s Active (%s): Kueue admits nothing through "
                    "a ClusterQueue that lists it until then; grant the operator patch on "
                    "admissionchecks/status (the chart does with kueue.enabled)",
                    name,
                    exc.message,
                )
                continue
            log.info("AdmissionCheck %s (%s) marked Active", name, slice_check.CONTROLLER_NAME)
        ctx.active_checks.add(name)


def _owner_label(namespace: str, job: str) -> str:
    return dynamic.owner_label(namespace, f"tpujob/{job}")


async def release(ctx: Context, namespace: str, job: str) -> None:
    """Delete the GKE Slices the check formed for a TPUJob that is gone (cluster-scoped:
    no owner reference collects them)."""
    ctx.slices_read.pop((namespace, job), None)
    if not ctx.caches.dynamic_slicing_seen:
        return
    selector = f"{contract.LABEL_WORKLOAD_OWNER}={_owner_label(namespace, job)}"
    try:
        listed = await ctx.kube.request("GET", SLICES_PATH, query={"labelSelector": selector})
        for item in (listed or {}).get("items", []):
            await ctx.kube.delete(f"{SLICES_PATH}/{item['metadata']['name']}")
    except ApiError as exc:
        if not exc.not_found:
            log.warning("cannot delete the GKE Slices of TPUJob %s/%s: %s", namespace, job, exc)


@dataclass
class SliceCheck:
    """The slice admission check of one Kueue-managed TPUJob of a dynamic shape, in one
    reconcile: ``observe`` before deciding, ``act`` after the job's status is written."""

    ctx: Context
    job: dict[str, Any]
    workload: dict[str, Any]
    shape: SliceShape
    num_slices: int
    check: str
    """The Workload's admission check this controller serves."""
    facts: slice_check.CheckFacts | None = None
    settled: float | None = None
    """Ready and unchanged: no Slice was read, and none is until this many seconds."""

    @property
    def names(self) -> list[str]:
        """The GKE Slice of each slice (what its pods select once the check is Ready)."""
        meta = self.workload["metadata"]
        return [
            slice_check.gke_slice_name(meta["namespace"], meta["name"], POD_SET, index)
            for index in range(self.num_slices)
        ]

    @classmethod
    async def of(
        cls,
        ctx: Context,
        job: dict[str, Any],
        workload: dict[str, Any] | None,
        shape: SliceShape,
        num_slices: int,
    ) -> SliceCheck | None:
        """The check, when the job's Workload has one this controller serves."""
        if workload is None or shape.dynamic is None:
            return None
        for entry in (workload.get("status") or {}).get("admissionChecks") or []:
            name = str(entry.get("name") or "")
            if name and await controller_of(ctx, name) == slice_check.CONTROLLER_NAME:
                ctx.caches.dynamic_slicing_seen = True
                return cls(ctx, job, workload, shape, num_slices, name)
        return None

    def current(self) -> dict[str, Any]:
        for entry in (self.workload.get("status") or {}).get("admissionChecks") or []:
            if entry.get("name") == self.check:
                return dict(entry)
        return {}

    async def observe(self, release: bool) -> None:
        """Read what the check is decided from: the topology assignment of the admission,
        the nodes' partitions and, unless the check is settled (Ready, nothing unhealthy,
        Slices read less than ``SETTLED_SECONDS`` ago), every Slice (few: one per slice)."""
        meta = self.workload["metadata"]
        found = node_partitions(self.ctx, dynamic.level(self.shape))
        wanted = None
        admission = (self.workload.get("status") or {}).get("admission") or {}
        if condition_true(self.workload, QUOTA_RESERVED):
            partition_of = {node: pid for pid, part in found.items() for node in part.nodes}
            for assignment in admission.get("podSetAssignments") or []:
                if assignment.get("name") == POD_SET:
                    wanted = slice_check.partitions_from_assignment(
                        assignment.get("topologyAssignment") or {}, partition_of, self.num_slices
                    )
        unhealthy: dict[str, str] = {}
        if wanted:
            for pid in (pid for chunk in wanted for pid in chunk):
                partition = found.get(pid)
                states = partition.states if partition is not None else frozenset({"UNSET"})
                bad = sorted(states - set(contract.PARTITION_USABLE_STATES))
                if bad:
                    unhealthy[pid] = "/".join(bad)
        current = self.current()
        key = (meta["namespace"], self.job["metadata"]["name"])
        now = self.ctx.clock()
        last = self.ctx.slices_read.get(key)
        if (
            current.get("state") == slice_check.READY
            and not release
            and not unhealthy
            and last is not None
            and now.timestamp() - last < SETTLED_SECONDS
        ):
            self.settled = SETTLED_SECONDS - (now.timestamp() - last)
            return
        try:
            listed = await self.ctx.kube.request("GET", SLICES_PATH)
        except ApiError as exc:
            if exc.apiserver_trouble:
                raise
            # No Slice CRD (GKE's slice controller not enabled) or no RBAC: the check is
            # left as it is, and the job waits for it, saying so through Kueue's state.
            log.warning(
                "cannot read GKE Slices for admission check %s of Workload %s/%s (%s): is "
                "the slice controller enabled (--enable-slice-controller), and may the "
                "operator list slices.accelerator.gke.io (the chart grants it)?",
                self.check,
                meta["namespace"],
                meta["name"],
                exc.message,
            )
            return
        self.ctx.slices_read[key] = now.timestamp()
        items = (listed or {}).get("items", [])
        mine = {
            item["metadata"]["name"]: item
            for item in items
            if (item["metadata"].get("annotations") or {}).get(slice_check.OWNER_NAMESPACE)
            == meta["namespace"]
            and item["metadata"]["annotations"].get(slice_check.OWNER_NAME) == meta["name"]
        }
        self.facts = slice_check.CheckFacts(
            check=self.check,
            current=current,
            namespace=meta["namespace"],
            workload=meta["name"],
            pod_set=POD_SET,
            accelerator=self.shape.accelerator,
            topology=self.shape.topology,
            partitions_per_slice=dynamic.partitions_needed(self.shape),
            wanted=wanted,
            release=release,
            pods_gone=False,
            mine=mine,
            taken=dynamic.taken_partitions(items),
            unhealthy=unhealthy,
            now=now,
        )

    def retrying(self) -> str | None:
        """What sends the job back to Kueue, when the check is Retry or goes Retry now
        (a Slice failed or deleted, a partition under it unhealthy): the job then stops
        as if evicted, without counting a failure, while Kueue evicts and places it
        again."""
        if self.facts is None:
            return None
        current = self.facts.current
        if current.get("state") == slice_check.RETRY:
            return str(current.get("message") or "")
        preview = slice_check.decide(self.facts)
        return preview.message if preview.state == slice_check.RETRY else None

    async def act(self, pods_gone: bool) -> float | None:
        """Do what the check's decision says; returns when to look again."""
        if self.facts is None:  # settled, or the Slices could not be read
            return self.settled if self.settled is not None else slice_check.RETRY_SECONDS
        plan = slice_check.decide(replace(self.facts, pods_gone=pods_gone))
        kube, ref = self.ctx.kube, job_ref(self.job)
        meta = self.workload["metadata"]
        for name in plan.delete:
            try:
                await kube.delete(f"{SLICES_PATH}/{name}")
            except ApiError as exc:
                if not exc.not_found:
                    raise
        for name, ids in plan.create:
            body = slice_check.slice_body(name, ids, self.facts)
            body["metadata"]["labels"][contract.LABEL_WORKLOAD_OWNER] = _owner_label(
                meta["namespace"], self.job["metadata"]["name"]
            )
            try:
                await kube.create(SLICES_PATH, body)
            except ApiError as exc:
                if exc.status == 429 or exc.status >= 500:
                    raise
                plan = slice_check.create_failed(name, exc.message or str(exc))
                break
        if plan.event is not None:
            reason, message = plan.event
            failed = reason == slice_check.FAILED_CREATE_SLICE
            self.ctx.events.emit(ref, "Warning" if failed else "Normal", reason, message)
        if plan.state is not None and await self._write(plan) and plan.updated is not None:
            self.ctx.events.emit(
                ref, "Warning" if plan.state == slice_check.RETRY else "Normal", *plan.updated
            )
        return plan.recheck

    async def _write(self, plan: slice_check.CheckPlan) -> bool:
        """The check's new state (and GKE's ``TPUSliceFailure`` condition), guarded by the
        resourceVersion read: a 409 is Kueue's write meanwhile, whose event wakes the job
        again (False then)."""
        meta = self.workload["metadata"]
        status = self.workload.get("status") or {}
        now = stamp(self.ctx.clock())
        checks = []
        for entry in status.get("admissionChecks") or []:
            if entry.get("name") == self.check:
                entry = {
                    "name": self.check,
                    "state": plan.state,
                    "message": plan.message,
                    "lastTransitionTime": now
                    if entry.get("state") != plan.state
                    else entry.get("lastTransitionTime", now),
                }
                if plan.pod_set_updates:
                    entry["podSetUpdates"] = list(plan.pod_set_updates)
                if plan.requeue_after is not None:
                    entry["requeueAfterSeconds"] = plan.requeue_after
            checks.append(entry)
        body: dict[str, Any] = {"admissionChecks": checks}
        condition = slice_check.failure_condition(
            plan, condition_of(self.workload, slice_check.FAILURE_CONDITION)
        )
        if condition is not None:
            conditions = with_condition(
                self.workload,
                slice_check.FAILURE_CONDITION,
                condition["status"] == "True",
                condition["reason"],
                condition["message"],
                now,
            )
            if conditions is not None:
                body["conditions"] = conditions
        try:
            await self.ctx.kube.merge_patch(
                workload_path(meta["namespace"], meta["name"], "status"),
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": body},
            )
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                log.debug("slice check of %s lost a race: %s", meta["name"], exc)
                return False
            raise
        return True
