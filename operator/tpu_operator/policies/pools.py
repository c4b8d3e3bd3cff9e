"""Recorded node pools of a running job: pools with no nodes left, and pools GKE created.

A recorded pool with no nodes (deleted, or scaled to zero) is replaced by a new claim for
the slices that have no pods of the attempt yet, when they may provision (a deleted pool
never comes back); otherwise the slice keeps it and the message says so
(``placement/pools.vanished_pools``). A claim reference (``auto:<value>``) is replaced by
the name of the pool GKE created for it once its nodes exist. A slice whose pods a restart
recreates and whose pool is unhealthy (a VM not ready or cordoned) moves to a free healthy
pool of its shape at once, rather than waiting for the repair (``move_from_unhealthy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from tpu_operator.api.status import Reason
from tpu_operator.placement.pools import requests_for
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
    its shape (its spot and reservation as the job asks), all at once, the job's other
    slices keeping theirs. With none free, or pools the user pinned, the slices stay and
    their new pods wait for the repair; an event says so (unless ``say_waits`` is false:
    an elastic job may go on without them, ``policies/elastic.py``). The slices that
    stay on a broken pool, and why each."""
    refs = plan.status.node_pools or []
    if not refs:
        return {}
    wanted = set(slices)
    broken = {
        i: f"node pool {why}" for i, why in world.unhealthy_pools(refs).items() if i in wanted
    }
    for index, why in (worn or {}).items():
        if index in wanted and index < len(refs) and not is_claim(refs[index]):
            broken.setdefault(index, why)
    placement = fallback.placement_of(facts, plan.status)
    if not broken or (placement is not None and placement.node_pools):
        return broken
    # A slice of flex-start or queued-provisioning capacity moves only to a new pool of
    # that capacity (a new claim: GKE provisions it); any other slice only to a free pool
    # that exists (its own repair is what it would otherwise wait for).
    claims = world.claims(len(refs), renewal=plan.status.attempt)
    requests = [
        replace(r, provision=r.fresh, leaves=refs[i]) if i in broken else replace(r, pinned=refs[i])
        for i, r in enumerate(
            requests_for(facts.shape, placement, len(refs), claims, admitted_capacity=facts.kueue)
        )
    ]
    allocation = world.allocate(requests)
    if allocation.pools is None:
        stuck = {
            i: f"{why}; no free healthy node pool of its shape to move to ({allocation.message})"
            for i, why in sorted(broken.items())
        }
        if say_waits:
            say_wait(plan, stuck)
        return stuck
    moved = list(refs)
    for index, why in sorted(broken.items()):
        moved[index] = allocation.pools[index]
        value = claim_of(moved[index])
        where = (
            f"moved to node pool {moved[index]}"
            if value is None
            else f"its pods ask GKE for a new node pool ({SLICE_POOL_LABEL}={value})"
        )
        plan.event("Warning", Reason.NODE_POOL_UNHEALTHY, f"slice {index}: {why}; {where}")
    plan.status.node_pools = moved
    return {}


def say_wait(plan: Plan, stuck: Mapping[int, str]) -> None:
    """Events for the slices whose new pods wait for their pool's repair."""
    for index, why in sorted(stuck.items()):
        plan.event(
            "Warning",
            Reason.NODE_POOL_UNHEALTHY,
            f"slice {index}: {why}; its new pods wait for the repair",
        )
