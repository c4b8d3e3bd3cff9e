"""Recorded node pools of a running job: pools with no nodes left, and pools GKE created.

A recorded pool with no nodes (deleted, or scaled to zero) is replaced by a new claim for
the slices that have no pods of the attempt yet, when they may provision (a deleted pool
never comes back); otherwise the slice keeps it and the message says so
(``placement/pools.vanished_pools``). A claim reference (``auto:<value>``) is replaced by
the name of the pool GKE created for it once its nodes exist. A slice whose pods a restart
recreates and whose pool is unhealthy (a VM not ready or cordoned) moves to a free healthy
pool of its shape at once, rather than waiting for the repair (``move_from_unhealthy``): a
spare pool first (``spec.placement.spares``, the operator's ``--spare-node-pool-selector``),
which no first placement takes. The pool it left is recorded in ``status.brokenNodePools``
(condition ``NodePoolsHealthy`` False) until it is healthy again or gone (``watch_broken``);
no slice is given it meanwhile (``placement/pools.pool_unhealthy``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from functools import partial

from tpu_operator.api.conditions import stamp
from tpu_operator.api.job import BrokenPool
from tpu_operator.api.policy import Placement
from tpu_operator.api.status import ConditionType, Reason
from tpu_operator.placement.pools import Request, requests_for
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL, claim_of, claim_ref, is_claim
from tpu_operator.policies import fallback
from tpu_operator.policies.plan import JobFacts, Plan, World


def renew_vanished(
    facts: JobFacts, plan: Plan, world: World, attempt: int, created: Iterable[int]
) -> None:
    """Replace the recorded pools of ``attempt`` that have no nodes left and that its
    slices (those not in ``created``) should not wait for, and say which are gone."""
    refs = plan.status.node_pools or []
    gone = world.vanished_pools(refs, created, fallback.placement_of(facts, plan.status))
    plan.pools_gone = [g.message for g in gone]
    if not any(g.reclaim for g in gone):
        return
    values = world.claims(len(refs), renewal=attempt)
    renewed = list(refs)
    for g in gone:
        if g.reclaim:
            renewed[g.index] = claim_ref(values[g.index])
            plan.event("Warning", Reason.NODE_POOL_GONE, g.message)
    plan.status.node_pools = renewed


def resolve_claims(plan: Plan, world: World) -> None:
    """Record the pools GKE created for the slices' claims, once their nodes are there."""
    pools = plan.status.node_pools or []
    if not any(is_claim(p) for p in pools):
        return
    refs, resolved, plan.provisioning = world.resolve_claims(pools)
    if resolved:
        plan.status.node_pools = refs
        mapping = ", ".join(f"slice {i} -> {p}" for i, p in resolved.items())
        plan.event("Normal", Reason.NODE_POOLS_ASSIGNED, f"{mapping} (created by GKE)")


def check(facts: JobFacts, plan: Plan, world: World) -> None:
    """The running attempt's pools: renew the vanished, record the ones GKE created."""
    attempt = plan.status.attempt
    renew_vanished(facts, plan, world, attempt, facts.created_slices(attempt))
    resolve_claims(plan, world)
    watch_broken(plan, world)


def still_broken(broken: list[BrokenPool], unhealthy: Mapping[int, str]) -> list[BrokenPool]:
    """The pools of ``broken`` that are still unhealthy (``unhealthy``: by index in
    ``broken``, why), with why now; a healthy pool, or one with no nodes left, leaves."""
    return [
        b.model_copy(update={"reason": unhealthy[i]})
        for i, b in enumerate(broken)
        if i in unhealthy
    ]


def broken_words(broken: list[BrokenPool]) -> str:
    """``node pool p (slice 1 moved to spare s): why; ...``"""
    return "; ".join(
        f"node pool {b.node_pool} (slice {b.slice} moved to {'spare ' if b.spare else ''}"
        f"{b.moved_to}): {b.reason}"
        for b in broken
    )


def watch_broken(plan: Plan, world: World) -> None:
    """Keep ``status.brokenNodePools`` to the pools the job moved off that are still
    unhealthy, and condition NodePoolsHealthy in line with it. A pool a slice left for a
    spare becomes, once healthy, a spare of the job in its place (``status.spareNodePools``)."""
    status = plan.status
    keep_spares(plan, world)
    if not status.broken_node_pools:
        return
    broken = status.broken_node_pools
    unhealthy = world.unhealthy_pools([b.node_pool for b in broken])
    left = still_broken(broken, unhealthy)
    if left == broken:
        return
    healed = [b for b in broken if all(b.node_pool != k.node_pool for k in left)]
    gone = {g.pool for g in world.vanished_pools([b.node_pool for b in healed], (), None)}
    for b in healed:
        if b.node_pool in gone:
            said = f"node pool {b.node_pool} is gone"
        elif b.spare and b.node_pool not in (status.node_pools or ()):
            said = (
                f"node pool {b.node_pool} is healthy again; held as a spare of this job in "
                f"place of spare {b.moved_to}, which slice {b.slice} runs on"
            )
            if b.node_pool not in status.spare_node_pools:
                status.spare_node_pools = [*status.spare_node_pools, b.node_pool]
        else:
            said = f"node pool {b.node_pool} is healthy again; it is free"
        plan.event("Normal", Reason.NODE_POOLS_HEALTHY, said)
    status.broken_node_pools = left
    if left:
        plan.condition(
            ConditionType.NODE_POOLS_HEALTHY, False, Reason.NODE_POOL_UNHEALTHY, broken_words(left)
        )
    else:
        plan.condition(
            ConditionType.NODE_POOLS_HEALTHY,
            True,
            Reason.NODE_POOLS_HEALTHY,
            "every node pool the job's slices moved off is healthy again or gone",
        )


def keep_spares(plan: Plan, world: World) -> None:
    """``status.spareNodePools`` without the pools that are gone or that a slice of the
    job now runs on (a slice that moved there)."""
    status = plan.status
    if not status.spare_node_pools:
        return
    gone = {g.pool for g in world.vanished_pools(list(status.spare_node_pools), (), None)}
    running = set(status.node_pools or ())
    kept = [p for p in status.spare_node_pools if p not in gone and p not in running]
    if kept != status.spare_node_pools:
        status.spare_node_pools = kept


def moving(
    facts: JobFacts,
    world: World,
    placement: Placement | None,
    refs: list[str],
    slices: Collection[int],
    attempt: int,
    *,
    new_vms: bool,
    may_provision: Collection[int] = (),
) -> list[Request]:
    """The requests of an allocation that moves ``slices`` off their pools (``refs``, one
    per slice), the others pinned to theirs: a moving slice takes a spare first, never
    the pool it leaves, and never a pool of another capacity than its own. ``new_vms``: a
    flex-start or queued-provisioning slice may ask GKE for a new pool of its capacity (a
    claim renewed for ``attempt``); otherwise only a pool that exists is taken, except by
    the slices of ``may_provision`` (whose pool was deleted and who may provision), which
    ask GKE for a new pool when no free one fits."""
    claims = world.claims(len(refs), renewal=attempt)
    return [
        replace(
            r,
            provision=(new_vms and r.fresh) or i in may_provision,
            leaves=refs[i],
            replacing=True,
        )
        if i in slices
        else replace(r, pinned=refs[i])
        for i, r in enumerate(
            requests_for(facts.shape, placement, len(refs), claims, admitted_capacity=facts.kueue)
        )
    ]


def move_from_unhealthy(
    facts: JobFacts,
    plan: Plan,
    world: World,
    slices: Iterable[int],
    worn: Mapping[int, str] | None = None,
    *,
    say_waits: bool = True,
) -> dict[int, str]:
    """Move the ``slices`` a restart recreates off their unhealthy pools, and those
    ``worn`` (failures repeating on their pool; why each): each to a free healthy pool of
    its shape (its spot and reservation as the job asks; a spare pool first), all at
    once, the job's other slices keeping theirs. A pool left for its state is recorded in
    ``status.brokenNodePools`` (condition NodePoolsHealthy False). With none free, or
    pools the user pinned, the slices stay and their new pods wait for the repair; an
    event says so (unless ``say_waits`` is false: an elastic job may go on without them,
    ``policies/elastic.py``). The slices that stay on a broken pool, and why each."""
    refs = plan.status.node_pools or []
    if not refs:
        return {}
    wanted = set(slices)
    unhealthy = {i: why for i, why in world.unhealthy_pools(refs).items() if i in wanted}
    broken = {i: f"node pool {why}" for i, why in unhealthy.items()}
    for index, why in (worn or {}).items():
        if index in wanted and index < len(refs) and not is_claim(refs[index]):
            broken.setdefault(index, why)
    placement = fallback.placement_of(facts, plan.status)
    if placement is not None and placement.node_pools:
        return broken
    # A pool with no nodes left under a running job was deleted (the autoscaler scales
    # down no node that runs pods): its slice moves as from a broken pool. With nowhere
    # to go, ``renew_vanished`` decides: a new pool from GKE, or a wait it explains.
    gone = {g.index: g for g in world.vanished_pools(refs, (), placement) if g.index in wanted}
    for index, g in gone.items():
        broken.setdefault(index, f"node pool {g.pool} has no nodes (deleted)")
    if not broken:
        return {}
    # A slice of flex-start or queued-provisioning capacity moves only to a new pool of
    # that capacity (a new claim: GKE provisions it); any other slice only to a free pool
    # that exists (its own repair is what it would otherwise wait for).
    # A deleted pool's slice that may provision asks GKE for a new pool if none is free,
    # so that it never keeps another moving slice from a free pool (all move at once).
    reclaim = {i for i, g in gone.items() if g.reclaim}
    requests = moving(
        facts,
        world,
        placement,
        refs,
        broken,
        plan.status.attempt,
        new_vms=True,
        may_provision=reclaim,
    )
    allocation = world.allocate(requests)
    if allocation.pools is None:
        stuck = {
            i: f"{why}; no free healthy node pool of its shape to move to ({allocation.message})"
            for i, why in sorted(broken.items())
            if not (i in gone and gone[i].reclaim)
        }
        if say_waits:
            say_wait(plan, {i: why for i, why in stuck.items() if i not in gone})
        return stuck
    moved = list(refs)
    recorded = list(plan.status.broken_node_pools)
    for index, why in sorted(broken.items()):
        moved[index] = allocation.pools[index]
        spare = index in allocation.spares
        value = claim_of(moved[index])
        if value is not None and index in gone:
            # Nothing free: a new pool from GKE, said as a renewal says it (not a move).
            plan.event("Warning", Reason.NODE_POOL_GONE, gone[index].message)
            continue
        if value is not None:
            where = f"its pods ask GKE for a new node pool ({SLICE_POOL_LABEL}={value})"
        else:
            kind = "spare node pool" if spare else "node pool"
            where = f"moved to {kind} {moved[index]}"
        reason = Reason.NODE_POOL_GONE if index in gone else Reason.NODE_POOL_UNHEALTHY
        plan.event("Warning", reason, f"slice {index}: {why}; {where}")
        plan.after_commit.append(partial(world.metrics.slice_moved, "spare" if spare else "pool"))
        if index in unhealthy and all(b.node_pool != refs[index] for b in recorded):
            recorded.append(
                BrokenPool(
                    node_pool=refs[index],
                    slice=index,
                    moved_to=moved[index],
                    spare=spare,
                    reason=unhealthy[index],
                    since=stamp(plan.now),
                )
            )
    plan.status.node_pools = moved
    if recorded != plan.status.broken_node_pools:
        plan.status.broken_node_pools = recorded
        plan.condition(
            ConditionType.NODE_POOLS_HEALTHY,
            False,
            Reason.NODE_POOL_UNHEALTHY,
            broken_words(recorded),
        )
    return {}


def say_wait(plan: Plan, stuck: Mapping[int, str]) -> None:
    """Events for the slices whose new pods wait for their pool's repair."""
    for index, why in sorted(stuck.items()):
        plan.event(
            "Warning",
            Reason.NODE_POOL_UNHEALTHY,
            f"slice {index}: {why}; its new pods wait for the repair",
        )
