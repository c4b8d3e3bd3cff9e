"""Why the pods of an attempt wait, in the words the job's status gives it.

In order: pools GKE is still creating (the pods are expected to wait), a pod the scheduler
cannot place (its message, and any pods that are not the job's workers on its pools),
pods or TPUSlices the apiserver refuses (retried until the cause is gone), and pods no
scheduler has looked at for a while (``state/gang.scheduler_wait``). Each is condition
``PodsScheduled`` False with its reason, and one Warning event when it starts.
"""

from __future__ import annotations

from tpu_operator.api.status import ConditionType, Reason
from tpu_operator.placement.provisioning import is_claim
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.state.gang import GangState, scheduler_wait

SLICE_RETRY_SECONDS = 30.0
"""Retry after the apiserver refused the job's TPUSlices (an admission policy, a quota):
the cause is outside the operator and may be lifted at any time."""
REFUSED_PODS = (Reason.PODS_FORBIDDEN, Reason.POD_CREATION_FAILED)
"""The reasons a slice retries the creation of pods the apiserver refused."""
SHOWN = 3
"""Pods named in a message (the rest are counted)."""


def refused_pods(facts: JobFacts, attempt: int, state: GangState) -> tuple[Reason, str] | None:
    """Why a slice cannot create this attempt's pods (the apiserver refuses them and the
    slice retries), as its Ready condition says. None once every pod of the attempt
    exists: the slice's status that says so can reach this job after the pods themselves
    have run to the end."""
    if not state.to_create:
        return None
    for _, body in sorted(facts.slices.items()):
        status = body.get("status") or {}
        if status.get("attempt") != attempt:
            continue
        for condition in status.get("conditions") or []:
            if (
                condition.get("type") == ConditionType.READY
                and condition.get("reason") in REFUSED_PODS
            ):
                return Reason(condition["reason"]), str(condition.get("message", ""))
    return None


def pods_allowed(facts: JobFacts, plan: Plan, attempt: int, state: GangState) -> None:
    """Once every pod the apiserver refused exists, PodsScheduled stops saying it refuses
    them (pods that then run to the end never pass through the phase policy)."""
    if plan.condition_reason(ConditionType.PODS_SCHEDULED) not in REFUSED_PODS:
        return
    if refused_pods(facts, attempt, state) is None:
        plan.condition(ConditionType.PODS_SCHEDULED, True, Reason.SCHEDULED)


def refused_slices(world: World) -> tuple[Reason, str] | None:
    """Why the job's TPUSlices cannot be written (retried until the cause is gone)."""
    refusal = world.slice_refusal()
    if refusal is None or refusal.invalid:
        return None
    return Reason.SLICE_CREATION_FAILED, (
        f"the apiserver refuses the job's TPUSlices, retrying every "
        f"{SLICE_RETRY_SECONDS:.0f} s until the cause is gone: {refusal.message}"
    )


def no_scheduler(plan: Plan, world: World, state: GangState) -> tuple[Reason, str] | None:
    """Pods no scheduler has looked at for a while, while it looked at no other pod of the
    operator's either (``state/gang.scheduler_wait``)."""
    unseen = state.unseen
    looked_at = world.scheduler_looked_at(unseen.scheduler) if unseen is not None else None
    message, recheck = scheduler_wait(unseen, plan.now, looked_at)
    if recheck is not None:
        plan.after(recheck)
    return (Reason.NO_SCHEDULER, message) if message else None


def others_on_pools(plan: Plan, world: World) -> str:
    """Pods with the operator's labels that are not its workers, on the job's pools
    (pinned to one or on one of its nodes): they compete for the chips like any pod, and
    may be why the workers do not schedule (``runtime/ownership.py``)."""
    pools = [p for p in plan.status.node_pools or [] if not is_claim(p)]
    if not pools:
        return ""
    found = [
        f"{p.namespace}/{p.name}" + (f" on node {p.node}" if p.node else " pinned to the pool")
        for p in world.others_on_pools(pools)
        if not p.terminal
    ]
    if not found:
        return ""
    shown = ", ".join(found[:SHOWN])
    if len(found) > SHOWN:
        shown += f" and {len(found) - SHOWN} more"
    return f"; pods that are not this job's workers are on its node pools: {shown}"


def explain(facts: JobFacts, plan: Plan, world: World, attempt: int, state: GangState) -> bool:
    """Say why the attempt's pods wait, if they do (True); the phase says the rest."""
    status = plan.status
    gone = "".join(f"; {g}" for g in plan.pools_gone)
    if state.unschedulable and plan.provisioning:
        # Expected: the pods wait for the pools GKE creates for them.
        pod, why = state.unschedulable
        message = (
            f"waiting for GKE to create node pools: {'; '.join(plan.provisioning)} "
            f"(pod {pod}: {why})"
        ) + gone
        status.message = f"attempt {attempt}: {message}"
        plan.condition(ConditionType.PODS_SCHEDULED, False, Reason.WAITING_FOR_NODE_POOLS, message)
        return True
    if state.unschedulable:
        pod, why = state.unschedulable
        message = f"pod {pod} cannot be scheduled: {why}{gone}{others_on_pools(plan, world)}"
        status.message = f"attempt {attempt}: {message}"
        if not plan.condition_is(ConditionType.PODS_SCHEDULED, False):
            plan.event("Warning", Reason.UNSCHEDULABLE, message)
        plan.condition(ConditionType.PODS_SCHEDULED, False, Reason.UNSCHEDULABLE, message)
        return True
    refused = (
        refused_pods(facts, attempt, state)
        or refused_slices(world)
        or no_scheduler(plan, world, state)
    )
    if refused is None:
        return False
    reason, message = refused
    status.message = f"attempt {attempt}: {message}"
    if plan.condition_reason(ConditionType.PODS_SCHEDULED) != reason:
        plan.event("Warning", reason, message)
    plan.condition(ConditionType.PODS_SCHEDULED, False, reason, message)
    return True
