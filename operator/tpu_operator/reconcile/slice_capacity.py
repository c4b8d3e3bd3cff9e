"""The capacity a TPUSlice's pods consume, read and acted on for one reconcile: the
ProvisioningRequest of queued provisioning outside Kueue, and the GKE Slice of Ironwood
dynamic slicing.

``SliceCapacity`` reads what the slice's status must say of them while the slice
observes (``read_request``, ``read_dynamic_slice``: a GET or a list when there is
something to look at) and hands the facts to the pure policies
(``policies/provisioning_request.py``, ``policies/dynamic_slice.py``); what their plans
make, withdraw, move, form or delete is done only after the slice's status is written
(``act_on_request``, ``act_on_dynamic_slices``), so a write that loses to a concurrent
change makes nothing. What the apiserver refuses is said by the next status.
``reconcile/slices.py`` (``SliceRun``) owns one per reconcile and reads back what it
found (``provisioning``, ``withdrawn``, ``events``); the requeue it asks for goes through
the run's ``after``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tpu_operator import contract
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.slice import TPUSliceSpec, TPUSliceStatus
from tpu_operator.api.status import Reason
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.catalog import SliceShape
from tpu_operator.placement import dynamic
from tpu_operator.placement.capacity import (
    PROVISIONING_REQUEST_API,
    PROVISIONING_REQUEST_PLURAL,
    QUEUED,
    CapacityMode,
    request_objects,
    request_state,
)
from tpu_operator.placement.provisioning import is_claim
from tpu_operator.policies import dynamic_slice, provisioning_request
from tpu_operator.policies.plan import MIN_REQUEUE_SECONDS
from tpu_operator.reconcile.context import Context
from tpu_operator.reconcile.pools import claim_toleration_value
from tpu_operator.reconcile.slice_roles import SliceRole, ports_of
from tpu_operator.runtime.kube import ApiError, namespaced, send_all
from tpu_operator.state.gang import GangState
from tpu_operator.state.views import PodView

log = logging.getLogger(__name__)

SLICES_PATH = f"/apis/{contract.SLICE_API_VERSION}/{contract.SLICE_CRD_PLURAL}"
"""GKE's Slices (cluster-scoped)."""
PROVISIONING_GROUP = PROVISIONING_REQUEST_API.split("/")[0]
RELEASE_RETRY_SECONDS = 10.0
"""Retry after the GKE Slices of a deleted TPUSlice could not be deleted."""


def node_partitions(ctx: Context, level: str) -> dict[str, dynamic.Partition]:
    """The partitions of ``level`` (e.g. 4x4x4) the TPU nodes' labels describe, by id:
    computed once per node snapshot (every dynamic slice and slice check reads them)."""
    return ctx.caches.from_nodes(
        f"partitions/{level}", lambda nodes: dynamic.partitions(nodes, level)
    )


async def release_dynamic_slices(ctx: Context, namespace: str, name: str) -> float | None:
    """Delete the GKE Slices of a TPUSlice that is gone (they are cluster-scoped: no owner
    reference collects them). Nothing to do, and nothing asked twice, where the Slice CRD
    does not exist."""
    if not ctx.caches.dynamic_slicing_seen:
        return None
    try:
        listed = await ctx.kube.request(
            "GET", SLICES_PATH, query={"labelSelector": dynamic.owner_selector(namespace, name)}
        )
        for item in (listed or {}).get("items", []):
            await ctx.kube.delete(f"{SLICES_PATH}/{item['metadata']['name']}")
    except ApiError as exc:
        if exc.not_found:
            return None
        log.warning("cannot delete the GKE Slices of %s/%s: %s", namespace, name, exc)
        return RELEASE_RETRY_SECONDS
    return None


class SliceCapacity:
    """The capacity objects of one slice, for one reconcile of it."""

    def __init__(
        self,
        ctx: Context,
        body: dict[str, Any],
        spec: TPUSliceSpec,
        role: SliceRole,
        status: TPUSliceStatus,
        after: Callable[[float], None],
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.spec = spec
        self.role = role
        self.shape: SliceShape = role.shape
        self.namespace = role.namespace
        self.name = role.name
        self.status = status
        """The slice's status as read."""
        self.after = after
        """Ask the slice's reconcile to run again after so many seconds."""
        self.provisioning: tuple[str, int, str] | None = None
        """The ProvisioningRequest of this reconcile: (name, tries, state in words)."""
        self.events: list[tuple[str, Reason, str]] = []
        """Events for the slice, posted after its status write."""
        self.withdrawn = False
        """This reconcile withdraws the slice's ProvisioningRequest (its capacity changed)."""

    def mode(self) -> CapacityMode:
        """The slice's capacity mode (``placement/capacity.py``), without the request its
        pods consume (``read_request`` says that)."""
        placement = self.spec.placement
        return CapacityMode(
            placement.capacity if placement else None,
            placement.max_run_duration_seconds if placement else None,
        )

    async def read_request(
        self,
        mode: CapacityMode,
        target: int,
        node_pool: str | None,
        stopping: bool,
        state: GangState,
        pods: list[PodView],
    ) -> provisioning_request.RequestPlan:
        """For queued provisioning outside Kueue, the slice's ProvisioningRequest: read
        (one GET, when there is one to look at) and decided
        (``policies/provisioning_request.py``). What the plan makes, withdraws or moves is
        done after the status is written (``act_on_request``)."""
        template_meta = ((self.body.get("spec") or {}).get("template") or {}).get("metadata")
        status = self.status
        facts = provisioning_request.RequestFacts(
            slice_name=self.name,
            queued=mode.capacity == QUEUED,
            kueue_made=contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST
            in ((template_meta or {}).get("annotations") or {}),
            stopping=stopping,
            attempt=target,
            recorded=status.provisioning_request,
            recorded_state=status.provisioning_state,
            tries=status.provisioning_tries if status.attempt == target else 0,
            claim=is_claim(node_pool),
            hosts=self.shape.hosts,
            to_create=bool(state.to_create),
            pods=pods,
        )
        name = provisioning_request.to_read(facts)
        found = None
        if name is not None:
            path = namespaced(self.namespace, PROVISIONING_REQUEST_PLURAL, group=PROVISIONING_GROUP)
            body = await self.ctx.kube.get(f"{path}/{name}")
            found = request_state(body) if body is not None else None
        plan = provisioning_request.decide(facts, found)
        self.provisioning = plan.recorded
        self.withdrawn = plan.withdraw is not None
        if plan.failed:
            self._event_later("Warning", Reason.PROVISIONING_FAILED, plan.failed)
        if plan.recheck is not None:
            self.after(plan.recheck)
        return plan

    async def act_on_request(
        self,
        plan: provisioning_request.RequestPlan,
        target: int,
        node_pool: str | None,
        mode: CapacityMode,
    ) -> None:
        """Withdraw, make and move what the committed plan says."""
        if plan.withdraw is not None:
            await self._withdraw(plan.withdraw)
        if plan.make is not None:
            await self._make_request(plan.make, target, node_pool, mode)
        if plan.consume is None or not plan.move:
            return
        annotation = {contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST: plan.consume}
        await send_all(
            self.ctx.kube.merge_patch(
                namespaced(self.namespace, "pods", pod),
                {"metadata": {"annotations": annotation}},
            )
            for pod in plan.move
        )

    async def _withdraw(self, name: str) -> None:
        """Delete a ProvisioningRequest this slice made, and its PodTemplate. One that
        cannot be deleted is left to GKE (a booking nobody consumes expires) and said in
        the log: the slice goes on with its new capacity either way."""
        path = namespaced(self.namespace, PROVISIONING_REQUEST_PLURAL, group=PROVISIONING_GROUP)
        try:
            if await self.ctx.kube.delete(f"{path}/{name}"):
                log.info("withdrew ProvisioningRequest %s/%s", self.namespace, name)
            await self.ctx.kube.delete(f"{namespaced(self.namespace, 'podtemplates')}/{name}")
        except ApiError as exc:
            log.warning(
                "cannot withdraw ProvisioningRequest %s/%s, left for GKE to expire (the "
                "operator's role needs delete on provisioningrequests and podtemplates): %s",
                self.namespace,
                name,
                exc,
            )

    async def _make_request(
        self, name: str, target: int, node_pool: str | None, mode: CapacityMode
    ) -> None:
        """The PodTemplate and ProvisioningRequest of one try (an existing one is kept)."""
        placement = self.spec.placement
        failure_policy = self.spec.failure_policy or FailurePolicy()
        wiring = PodWiring(
            job_name=self.role.job_name,
            service=self.spec.service or self.name,
            slice_name=self.name,
            shape=self.shape,
            num_slices=self.spec.num_slices,
            slice_index=self.spec.slice_index,
            worker_index=0,
            attempt=target,
            ports=ports_of(self.spec),
            slice_names=self.role.pod_slice_names,
        )
        owner = Owner(
            contract.API_VERSION, contract.SLICE_KIND, self.name, self.body["metadata"]["uid"]
        )
        pod = worker_pod(
            namespace=self.namespace,
            wiring=wiring,
            template=(self.body.get("spec") or {}).get("template") or {},
            owner=owner,
            placement=NodePlacement(
                slice_pool=claim_toleration_value(self.ctx, node_pool),
                extra_selector=dict(placement.node_selector or {}) if placement else {},
                not_ready_timeout_seconds=failure_policy.node_not_ready_timeout_seconds,
                capacity=mode,
            ),
        )
        template, request = request_objects(
            name=name,
            namespace=self.namespace,
            pod=pod,
            count=self.shape.hosts,
            max_run_duration_seconds=mode.max_run_duration_seconds,
            owner=owner.reference(),
        )
        await self.ctx.kube.create(namespaced(self.namespace, "podtemplates"), template)
        path = namespaced(self.namespace, PROVISIONING_REQUEST_PLURAL, group=PROVISIONING_GROUP)
        if await self.ctx.kube.create(path, request):
            log.info("created ProvisioningRequest %s/%s", self.namespace, name)

    def _event_later(self, kind: str, reason: Reason, message: str) -> None:
        self.events.append((kind, reason, message))

    async def read_dynamic_slice(
        self, target: int, release: bool, forming: bool
    ) -> dynamic_slice.DynamicPlan:
        """Ironwood dynamic slicing: this slice's GKE Slices read (and every Slice, when
        the attempt's is to be formed) and decided (``policies/dynamic_slice.py``). What
        the plan forms or deletes is done after the status is written
        (``act_on_dynamic_slices``)."""
        kube = self.ctx.kube
        key = (self.namespace, self.name)
        given = self.spec.gke_slice
        facts = dynamic_slice.DynamicFacts(
            name=given or dynamic.slice_name(self.namespace, self.name, target),
            mine={},
            release=release,
            forming=forming,
            refused=self.ctx.refused_dynamic_slices.pop(key, ""),
            given=given is not None,
        )
        try:
            if given is not None:  # formed by the admission: read, never formed here
                found = await kube.get(f"{SLICES_PATH}/{given}")
                if found is not None and found["metadata"].get("deletionTimestamp"):
                    found = None  # the last admission's, going: the next is formed anew
                facts = replace(
                    facts, mine={} if found is None else {given: dynamic.slice_state(found)}
                )
            else:
                listed = await kube.request(
                    "GET",
                    SLICES_PATH,
                    query={"labelSelector": dynamic.owner_selector(self.namespace, self.name)},
                )
                items = (listed or {}).get("items", [])
                mine = {item["metadata"]["name"]: dynamic.slice_state(item) for item in items}
                facts = replace(facts, mine=mine)
            if dynamic_slice.needs_choice(facts):
                everyone = await kube.request("GET", SLICES_PATH)
                nodes = self.ctx.caches.tpu_nodes()
                taken = dynamic.taken_partitions((everyone or {}).get("items", []))
                choice = dynamic.choose(
                    self.shape,
                    node_partitions(self.ctx, dynamic.level(self.shape)),
                    dynamic.busy_nodes(nodes, taken),
                )
                facts = replace(facts, choice=choice)
        except ApiError as exc:
            facts = replace(facts, mine={}, unread=exc.message or str(exc))
        plan = dynamic_slice.decide(facts)
        if plan.recheck is not None:
            self.after(plan.recheck)
        return plan

    async def act_on_dynamic_slices(self, plan: dynamic_slice.DynamicPlan, target: int) -> None:
        """Delete and form the GKE Slices the committed plan says. What the apiserver
        refuses is said by the slice's next status (and tried again)."""
        if not plan.delete and plan.form is None:
            if plan.refused:
                self.after(MIN_REQUEUE_SECONDS)  # the next status says what is true now
            return
        kube = self.ctx.kube
        try:
            for name in plan.delete:
                await kube.delete(f"{SLICES_PATH}/{name}")
            if plan.form is not None:
                name = dynamic.slice_name(self.namespace, self.name, target)
                body = dynamic.slice_body(name, self.shape, plan.form, self.namespace, self.name)
                await kube.create(SLICES_PATH, body)
        except ApiError as exc:
            said = exc.message or str(exc)
            log.warning(
                "cannot form or delete a GKE Slice of %s/%s: %s", self.namespace, self.name, said
            )
            self.ctx.refused_dynamic_slices[(self.namespace, self.name)] = said
            self.after(dynamic_slice.RECHECK_SECONDS)
            if said != plan.refused:
                self.after(MIN_REQUEUE_SECONDS)  # the next status says it
            return
        if plan.refused:
            self.after(MIN_REQUEUE_SECONDS)
