"""Placement and the start of an attempt: the first run, and every resume.

A multi-host attempt never starts without a node pool recorded for every slice: the pools
are chosen for all slices at once (``placement/pools.allocate``, through the world, which
reserves them) or taken from an admission's topology assignment; with none free the job
waits in ``Pending`` and says why. The attempt is committed first; the slices are created
(or moved to it) once the status is written (``Act.RUN``).
"""

from __future__ import annotations

from tpu_operator.api.conditions import stamp
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.placement.pools import requests_for, shape_words
from tpu_operator.placement.provisioning import SLICE_POOL_LABEL, claim_of, is_claim
from tpu_operator.policies import fallback
from tpu_operator.policies.plan import Act, JobFacts, Plan, World

POOL_RETRY_SECONDS = 15.0
"""Safety net for an object waiting for node pools: it is also woken by node events and
by the last pod leaving a pool."""


def resumes(attempt: int, phase: str | None) -> bool:
    """The next attempt begins (unless the spec still suspends it): none has begun, or the
    object was suspended or queued and is let go. One rule for a job and for a standalone
    TPUSlice (``standalone.attempt``): either created suspended first runs attempt 1, and
    a resume runs the attempt after the one that was stopped."""
    return attempt == 0 or phase in (Phase.SUSPENDED, Phase.QUEUED)


def should_start(facts: JobFacts, plan: Plan, attempt: int) -> bool:
    """Not started, resumed, or resumed and still waiting for node pools: a multi-host
    attempt never runs without its pools recorded."""
    status = plan.status
    return resumes(attempt, status.phase) or (facts.shape.needs_pool and not status.node_pools)


def start(
    facts: JobFacts, plan: Plan, world: World, attempt: int, admitted: list[str] | None
) -> None:
    """Begin the next attempt (first run or resume), or wait for node pools.
    ``admitted``: the pools an admission assigned (a topology assignment), if any."""
    status = plan.status
    # The Suspended condition stays True until the resumed attempt starts (a resumed
    # job may first wait for node pools, in phase Pending).
    resuming = plan.condition_is(ConditionType.SUSPENDED, True)
    plan.account.resume()  # a suspended or evicted job: its wait is scheduling again
    creating = ""
    if facts.machine_wait and admitted is None:
        wait_for_pools(plan, facts.machine_wait)
        return
    if facts.shape.needs_pool and not status.node_pools:
        pools = admitted or allocate(facts, plan, world)
        if pools is None:
            return
        status.node_pools = pools
        assigned(facts, plan, pools)
        asked = [i for i, p in enumerate(pools) if is_claim(p)]
        if asked:
            creating = "; GKE is to create the node pools of slices " + ", ".join(
                str(i) for i in asked
            )
    attempt += 1
    status.attempt = attempt
    status.phase = Phase.PENDING
    status.running_since = None  # each attempt runs once all of its own workers do
    status.message = f"attempt {attempt}: creating slices{creating}"
    if facts.machine_note and not facts.shape.multi_host:
        status.message += f"; {facts.machine_note}"
    if status.start_time is None or resuming:
        status.start_time = stamp(plan.now)
    status.restart_at = None
    if resuming:
        plan.event("Normal", Reason.RESUMED, f"resumed as attempt {attempt}")
        if plan.has_condition(ConditionType.PODS_STOPPED):
            plan.condition(ConditionType.PODS_STOPPED, False, Reason.RESUMED)
    plan.condition(
        ConditionType.SUSPENDED,
        False,
        Reason.RESUMED if resuming else Reason.NOT_SUSPENDED,
    )
    plan.act = Act.RUN


def replace(facts: JobFacts, plan: Plan, world: World, attempt: int) -> None:
    """Start again on the capacity of the fallback step the job just moved to: the pods of
    ``attempt``, which never all ran, wait for capacity of the step before. Its pools are
    chosen anew (or asked of GKE) and the next attempt's pods ask for the new step's
    capacity; until pools are found, the slices are stopped (their pods deleted)."""
    plan.account.close_attempt(facts.total_workers)
    plan.status.node_pools = None
    plan.status.in_place_since = None  # the next attempt's pods are new ones
    start(facts, plan, world, attempt, None)
    if plan.status.attempt == attempt:
        plan.act = Act.STOP  # waiting for pools: the old attempt's pods go meanwhile


def allocate(facts: JobFacts, plan: Plan, world: World) -> list[str] | None:
    """Pools for every slice, or None and the job waits (saying why)."""
    count = facts.spec.num_slices
    placement = fallback.placement_of(facts, plan.status)
    claims = world.claims(count, renewal=fallback.renewal(plan.status))
    requests = requests_for(facts.shape, placement, count, claims, admitted_capacity=facts.kueue)
    allocation = world.allocate(requests)
    if allocation.pools is not None:
        return allocation.pools
    wait_for_pools(plan, allocation.message)
    return None


def wait_for_pools(plan: Plan, message: str) -> None:
    """The job starts no attempt yet: it waits for node pools (``message`` says which)."""
    status = plan.status
    if status.message != message:
        plan.event("Normal", Reason.WAITING_FOR_NODE_POOLS, message)
    status.phase = Phase.PENDING
    status.message = message
    plan.condition(ConditionType.PODS_SCHEDULED, False, Reason.WAITING_FOR_NODE_POOLS, message)
    plan.after(POOL_RETRY_SECONDS)


def assigned(facts: JobFacts, plan: Plan, pools: list[str]) -> None:
    """Events for the pools of a starting attempt: those taken, those asked of GKE."""
    note = facts.machine_note
    named = [f"slice {i} -> {p}" for i, p in enumerate(pools) if not is_claim(p)]
    if named:
        plan.event(
            "Normal",
            Reason.NODE_POOLS_ASSIGNED,
            ", ".join(named) + (f" ({note})" if note else ""),
        )
    for index, ref in enumerate(pools):
        value = claim_of(ref)
        if value is not None:
            plan.event(
                "Normal",
                Reason.WAITING_FOR_NODE_POOLS,
                f"slice {index}: no free node pool of {shape_words(facts.shape)}; its pods "
                f"ask GKE to create one (node selector and toleration "
                f"{SLICE_POOL_LABEL}={value})",
            )
