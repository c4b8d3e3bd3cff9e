"""Recorded node pools of a running job: pools with no nodes left, and pools GKE created.

A recorded pool with no nodes (deleted, or scaled to zero) is replaced by a new claim for
the slices that have no pods of the attempt yet, when they may provision (a deleted pool
never comes back); otherwise the slice keeps it and the message says so
(``placement/pools.vanished_pools``). A claim reference (``auto:<value>``) is replaced by
the name of the pool GKE created for it once its nodes exist.
"""

from __future__ import annotations

from collections.abc import Iterable

from tpu_operator.api.status import Reason
from tpu_operator.placement.provisioning import claim_ref, is_claim
from tpu_operator.policies.plan import JobFacts, Plan, World


def renew_vanished(
    facts: JobFacts, plan: Plan, world: World, attempt: int, created: Iterable[int]
) -> None:
    """Replace the recorded pools of ``attempt`` that have no nodes left and that its
    slices (those not in ``created``) should not wait for, and say which are gone."""
    refs = plan.status.node_pools or []
    gone = world.vanished_pools(refs, created)
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
