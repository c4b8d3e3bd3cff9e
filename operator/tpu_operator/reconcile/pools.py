"""Who holds which multi-host node pool, for TPUJobs and standalone TPUSlices alike.

A pool is held, for anyone but its holder, while any of these says so:

1. a pod pinned to it (``cloud.google.com/gke-nodepool`` node selector) still exists and
   has not finished, whoever owns it: Pending, Running or terminating. This is the rule
   that matters when a pool changes hands: a suspended, deleted, finished or restarted
   holder keeps its pools until its pods are really gone, exactly as a job's next attempt
   waits for the pods of the previous one. It is read from the pod cache (an index by
   pool), so it survives operator restarts;
2. the holder's own records: an active TPUJob's ``status.nodePools``, each of its
   TPUSlices that exists and is not suspended (``spec.nodePool``: a job deleted or
   restarted keeps its pools through its slices until the garbage collector or the job
   removes them, and its pods hold them after that), and an active standalone TPUSlice's
   ``status.nodePool`` (covers the time between the choice and the pods' creation);
3. the pods the operator created on it that its pod cache does not show yet
   (``expectations.PodsInFlight``): the pod watch trails the slice and job watches, so a
   slice deleted right after it created its pods is not taken for a free pool;
4. an in-memory reservation, made before the holder's record is written and kept until
   the holder's next successful status write, so that two objects reconciled at the same
   time cannot choose the same pool, and a write that lost to the holder's own earlier one
   (the cache not showing it yet) does not let go of the pools that one recorded.

A claim reference (``auto:<value>``, a pool GKE is to create for one slice) is held like a
pool, and once GKE created that pool (its nodes carry the slice-pool label ``<value>``)
the pool is held by the claim's holder too: a claim and its pool are one pool.

Holders are named with their kind (``TPUJob ns/name``, ``TPUSlice ns/name``) so that a
job and a standalone slice of the same name never share a pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from tpu_operator import catalog, contract
from tpu_operator.api.policy import Placement
from tpu_operator.api.shape import ShapeFields
from tpu_operator.api.status import TERMINAL_PHASES, Phase
from tpu_operator.catalog import SliceShape
from tpu_operator.placement.pools import (
    NO_SPARES,
    Allocation,
    MachineChoice,
    PoolGone,
    PoolView,
    Request,
    ShapeKey,
    Spares,
    allocate,
    choose_machine,
    pool_unhealthy,
    pools_by_shape,
    pools_from_nodes,
    provisions,
    resolve_claim,
    spares_of,
    vanished_pools,
    with_default,
)
from tpu_operator.placement.provisioning import (
    SLICE_POOL_LABEL,
    claim_of,
    claim_ref,
    claim_value,
    is_claim,
)
from tpu_operator.reconcile.context import Context
from tpu_operator.runtime.ownership import slice_job_name
from tpu_operator.state.views import PodView


def job_holder(namespace: str, name: str) -> str:
    return f"{contract.JOB_KIND} {namespace}/{name}"


def slice_holder(namespace: str, name: str) -> str:
    return f"{contract.SLICE_KIND} {namespace}/{name}"


def job_pool_records(body: Mapping[str, Any]) -> dict[str, str]:
    """Rule 2 for a TPUJob: pool -> the job, for the pools its status records while it is
    active (neither finished nor suspended). The job index files it (``controllers``)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    phase = status.get("phase")
    if phase in TERMINAL_PHASES or phase == Phase.SUSPENDED:
        return {}
    holder = job_holder(meta.get("namespace", ""), meta.get("name", ""))
    return {pool: holder for pool in status.get("nodePools") or [] if isinstance(pool, str)}


def slice_pool_records(body: Mapping[str, Any]) -> dict[str, str]:
    """Rule 2 for a TPUSlice. A job's slice holds the pool its spec pins for its job while
    it exists and is not suspended, whatever its job's state: a job that is deleted keeps
    its slices until the garbage collector removes them, and they may have pods in flight.
    A standalone slice holds the pool its status records while it is active."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    namespace = meta.get("namespace", "")
    job = slice_job_name(body)
    if job is not None:
        spec = body.get("spec") or {}
        pool = spec.get("nodePool")
        if spec.get("suspend") or not isinstance(pool, str) or not pool:
            return {}
        return {pool: job_holder(namespace, job)}
    pool = status.get("nodePool")
    if not isinstance(pool, str) or not pool or status.get("phase") in TERMINAL_PHASES:
        return {}
    return {pool: slice_holder(namespace, meta.get("name", ""))}


def pod_holder(pod: PodView) -> str:
    """The holder a worker pod belongs to: its TPUJob, or its standalone TPUSlice."""
    if pod.job_owned:
        return job_holder(pod.namespace, pod.job_name)
    return slice_holder(pod.namespace, pod.slice_name)


class HeldPools(Mapping[str, str]):
    """Node pools held by anyone but ``exclude``: pool -> who holds it, in words.

    Looked up pool by pool, as ``placement.pools.allocate`` does: the pods on a pool are
    counted when a pool is asked about (once per lookup object), not for every pool of the
    cluster on every allocation. That made each allocation walk every worker pod, and a
    burst of N jobs choosing pools cost N times the cluster's pods. The holders' own
    records (rule 2) are looked up the same way, in the job and slice indexes by pool
    (reading every job and slice on each allocation made a burst of N jobs cost N times
    the cluster's jobs); reservations (rule 3) are a mapping by pool already.

    The rules' order decides which holder is named: the pods on a pool, then the records,
    the pods in flight and the reservations naming it, then (for a pool GKE created for a
    claim) the claim's holder, found by the same rules.

    ``pool in held`` answers whether anyone holds it without the words: an allocation asks
    it of every pool it passes over (on a shared cluster, each job's choice passes over
    the pools of the jobs before it), and counting each held pool's pods by holder to
    name them was the allocation's cost. ``get`` names the holder, for the message of a
    request that waits.
    """

    def __init__(self, ctx: Context, exclude: str, pools: dict[str, PoolView]) -> None:
        self._caches = ctx.caches
        self._exclude = exclude
        self._claims = {p.name: p.slice_pool for p in pools.values() if p.slice_pool}
        """Pool -> the slice-pool value GKE created it for."""
        self._reservations = ctx.reservations.by_pool
        self._in_flight = ctx.pods_in_flight
        self._found: dict[str, str | None] = {}
        """Pool -> its holder in words (``get``)."""
        self._holds: dict[str, bool] = {}
        """Pool -> whether anyone holds it (``in``)."""

    def _direct(self, pool: str, counted: bool) -> str | None:
        """Rules 1-4 for ``pool`` itself (a pool name or a claim reference); ``counted``:
        name the holder with its pods on the pool (else the holder alone)."""
        cached = self._caches.pods_in_pool(pool)
        exclude = self._exclude
        if not counted:
            for pod in cached:
                if not pod.terminal and (holder := pod_holder(pod)) != exclude:
                    return holder
        else:
            on_pool = [p for p in cached if not p.terminal]
            by_holder = Counter(pod_holder(p) for p in on_pool)
            by_holder.pop(exclude, None)
            if by_holder:
                holder, count = by_holder.most_common(1)[0]
                stopping = sum(1 for p in on_pool if p.deleting and pod_holder(p) == holder)
                return f"{holder} ({count} of its pods are on it, {stopping} terminating)"
        for holder in self._caches.pool_records(pool):
            if holder != self._exclude:
                return holder
        unseen = self._in_flight.unseen(pool, cached)
        unseen.pop(self._exclude, None)
        if unseen:
            holder, count = unseen.most_common(1)[0]
            return f"{holder} ({count} of its pods are being created on it)"
        reserved = self._reservations.get(pool)
        return reserved if reserved != self._exclude else None

    def _holder(self, pool: str, counted: bool) -> str | None:
        holder = self._direct(pool, counted)
        claim = self._claims.get(pool)
        if holder is None and claim is not None:
            holder = self._direct(claim_ref(claim), counted)  # a claim and its pool are one
        return holder

    def get(self, pool: str, default: Any = None) -> Any:
        if pool not in self._found:
            self._found[pool] = self._holder(pool, counted=True)
        found = self._found[pool]
        return default if found is None else found

    def __contains__(self, pool: object) -> bool:
        if not isinstance(pool, str):
            return False
        if pool in self._found:
            return self._found[pool] is not None
        if pool not in self._holds:
            self._holds[pool] = self._holder(pool, counted=False) is not None
        return self._holds[pool]

    def __getitem__(self, pool: str) -> str:
        found = self.get(pool)
        if found is None:
            raise KeyError(pool)
        return found

    def __iter__(self) -> Iterator[str]:
        """Every held pool (walks every pinned pool: for status and tests, not for
        allocations)."""
        caches = self._caches
        names = {*caches.pinned_pools(), *caches.recorded_pools(), *self._reservations}
        names |= self._claims.keys()
        return iter(sorted(n for n in names if self.get(n) is not None))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def held_pools(
    ctx: Context, exclude: str = "", pools: dict[str, PoolView] | None = None
) -> HeldPools:
    """Node pools held by anyone but ``exclude`` (``pools``: the TPU pools, when the caller
    has them already); see ``HeldPools``."""
    return HeldPools(ctx, exclude, tpu_pools(ctx) if pools is None else pools)


def tpu_pools(ctx: Context) -> dict[str, PoolView]:
    """The cluster's TPU node pools, aggregated once per node change (shared: read only)."""
    return ctx.caches.from_nodes("pools", pools_from_nodes)


def tpu_pools_by_shape(ctx: Context) -> dict[ShapeKey, tuple[PoolView, ...]]:
    """``tpu_pools`` by shape, grouped and sorted once per node change (shared: read
    only)."""
    return ctx.caches.from_nodes("pools-by-shape", lambda _: pools_by_shape(tpu_pools(ctx)))


def holds_spares(body: Mapping[str, Any]) -> bool:
    """A TPUJob that names spare pools (``spec.placement.spares``) or holds some
    (``status.spareNodePools``) and has not finished: filed under ``SPARES_HOLDER`` in the
    job cache, so an allocation reads these jobs alone, not every job of the cluster."""
    spec = body.get("spec") or {}
    spares = (spec.get("placement") or {}).get("spares") if isinstance(spec, dict) else None
    status = body.get("status") or {}
    if not isinstance(spares, dict) and not status.get("spareNodePools"):
        return False
    return status.get("phase") not in TERMINAL_PHASES


def spares_of_others(ctx: Context, holder: str) -> Spares:
    """The pools the TPUJobs other than ``holder`` that have not finished hold in reserve
    (``spec.placement.spares``, ``status.spareNodePools``): no one else's placement takes
    them. Read from the job cache's index of the jobs that hold spares (``holds_spares``):
    on a shared cluster of thousands of jobs, a walk of every job on every allocation was
    a cost that grew with the number of jobs squared."""
    found = NO_SPARES
    for body in ctx.caches.jobs_holding_spares():  # each filed by ``holds_spares``
        meta = body.get("metadata") or {}
        if job_holder(meta.get("namespace", ""), meta.get("name", "")) == holder:
            continue
        spares = ((body.get("spec") or {}).get("placement") or {}).get("spares")
        held = (body.get("status") or {}).get("spareNodePools")
        spares = spares if isinstance(spares, dict) else {}
        names = [n for n in [*(spares.get("nodePools") or ()), *(held or ())] if isinstance(n, str)]
        labels = (spares.get("selector") or {}).get("matchLabels")
        found = found | spares_of(names, labels if isinstance(labels, dict) else None)
    return found


def slice_pool_values(
    meta: dict[str, Any], slices: int | None, renewal: int | None = None
) -> list[str]:
    """Slice-pool label values for one allocation of a job's ``slices`` (None: of a
    standalone slice): new with every generation, so that a resumed object never selects
    a pool GKE created for an earlier placement of it, and new with every ``renewal`` (the
    attempt that asks again for a pool that vanished)."""
    name, generation = meta["name"], meta.get("generation", 0)
    salt = f"{meta.get('uid', '')}/{generation}"
    if renewal is not None:
        salt += f"/{renewal}"
    if slices is None:
        return [claim_value(name, salt)]
    return [claim_value(name, salt, index) for index in range(slices)]


def choose_pools(ctx: Context, holder: str, requests: list[Request]) -> Allocation:
    """Free pools for ``requests`` (all or none), reserved for ``holder`` when found."""
    pools = tpu_pools(ctx)
    requests = with_default(requests, ctx.default_provisioning)
    if ctx.default_spares:
        requests = [replace(r, spares=r.spares | ctx.default_spares) for r in requests]
    others = spares_of_others(ctx, holder)
    if others:
        requests = [replace(r, others=others) for r in requests]
    held = held_pools(ctx, exclude=holder, pools=pools)
    allocation = allocate(requests, pools, held, tpu_pools_by_shape(ctx))
    if allocation.pools is not None:
        ctx.reservations.reserve(holder, allocation.pools)
    return allocation


def resolve_claims(
    ctx: Context, refs: list[str], shape: SliceShape
) -> tuple[list[str], dict[int, str], list[str]]:
    """Replace claim references whose pool GKE has created by the pool's name.

    Returns the new list, the slices newly resolved (index -> pool) and, for the claims
    still waiting, why (one line per slice).
    """
    pools = tpu_pools(ctx)
    resolved: dict[int, str] = {}
    waiting: list[str] = []
    out = list(refs)
    for index, ref in enumerate(refs):
        value = claim_of(ref)
        if value is None:
            continue
        name, why = resolve_claim(value, shape, pools)
        if name is None:
            waiting.append(f"slice {index} (label {SLICE_POOL_LABEL}={value}): {why}")
            continue
        out[index] = name
        resolved[index] = name
    return out, resolved, waiting


def claim_toleration_value(ctx: Context, ref: str | None) -> str | None:
    """The slice-pool value whose taint the pods must tolerate: the claim's own, or, for a
    pool GKE created for a claim, that pool's (its nodes are tainted with it)."""
    value = claim_of(ref)
    if value is not None or not ref:
        return value
    pool = tpu_pools(ctx).get(ref)
    return pool.slice_pool if pool is not None else None


def free_vms(ctx: Context, pools: dict[str, PoolView]) -> dict[str, int]:
    """Pool -> its ready VMs on which no unfinished worker pod sits."""
    free: dict[str, int] = {}
    for node in ctx.caches.tpu_nodes():
        if not node.pool or node.pool not in pools or not node.ready or node.unschedulable:
            continue
        if any(not p.terminal for p in ctx.caches.pods_on_node(node.name)):
            continue
        free[node.pool] = free.get(node.pool, 0) + 1
    return free


def machine_for(
    ctx: Context,
    holder: str,
    fields: ShapeFields,
    shape: SliceShape,
    placement: Placement | None,
    recorded: dict[str, Any] | None,
) -> MachineChoice:
    """The shape to run: ``shape`` unless the user left chipsPerHost unset for a topology
    that fits two machine types, then the machine type the cluster has (once decided and
    recorded in ``status.shape`` — ``recorded`` — the decision stays). Returns the shape
    and a note for the status and events (empty when nothing was decided now), or what
    the job waits for when the cluster has neither machine type."""
    generation = shape.generation
    choices = catalog.chips_per_host_choices(generation, shape.topology)
    if fields.chips_per_host is not None or len(choices) < 2:
        return MachineChoice(shape)
    if recorded and recorded.get("chipsPerHost") in choices:
        return MachineChoice(
            catalog.shape(shape.accelerator, shape.topology, recorded["chipsPerHost"])
        )
    options = [catalog.shape(shape.accelerator, shape.topology, c) for c in choices]
    pools = tpu_pools(ctx)
    choice = choose_machine(
        options,
        pools,
        held_pools(ctx, exclude=holder, pools=pools),
        free_vms(ctx, pools),
        spot=placement.spot if placement else None,
        reservation=placement.reservation if placement else None,
        provision=provisions(
            placement.provisioning if placement else None, ctx.default_provisioning
        ),
    )
    if choice.waiting and placement and placement.node_pools:
        # pinned pools without nodes yet: the autoscaler scales them up for the pods
        return MachineChoice(choice.shape)
    return choice


def vanished(
    ctx: Context,
    refs: list[str],
    placement: Placement | None,
    created: Iterable[int],
) -> list[PoolGone]:
    """A job's recorded pools (``refs``) with no nodes left, and what to do about each
    (``placement/pools.vanished_pools``; ``created``: the slices whose pods of the current
    attempt exist already)."""
    return vanished_pools(
        refs,
        tpu_pools(ctx),
        pinned=placement.node_pools if placement else None,
        provision=provisions(
            placement.provisioning if placement else None, ctx.default_provisioning
        )
        # Flex-start and queued capacity comes as new pools (placement/pools.requests_for).
        or bool(placement and placement.capacity and placement.provisioning is None),
        created=frozenset(created),
    )


def unhealthy(ctx: Context, refs: list[str], hosts: int) -> dict[int, str]:
    """A job's recorded pools (``refs``, by slice index) that have nodes but are unhealthy,
    and why: a VM not ready or cordoned (``placement/pools.pool_unhealthy``), or fewer VMs
    than the slice's ``hosts`` (one deleted, GKE yet to replace it). Claims and pools with
    no nodes left (``vanished``) are not."""
    pools = tpu_pools(ctx)
    now = ctx.clock().timestamp()
    found: dict[int, str] = {}
    for index, ref in enumerate(refs):
        pool = pools.get(ref) if ref and not is_claim(ref) else None
        if pool is None or not pool.nodes:
            continue
        why = pool_unhealthy(pool)
        if why is None and pool.nodes < hosts:
            why = f"{pool.name} has {pool.nodes} of the {hosts} VMs its slice needs"
        if why is None and pool.ends is not None and pool.ends <= now:
            # Flex-start VMs at the end of their run duration: GKE is taking them back.
            why = f"{pool.name} is taken back by GKE (its VMs' run duration ended)"
        if why:
            found[index] = why
    return found
