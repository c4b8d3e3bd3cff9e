"""``spec.placement.fallbacks``: the capacity a job asks for after waiting for a node pool.

``spec.placement`` (its ``spot``, ``reservation`` and ``capacity``) is step 0;
``fallbacks[n-1]`` is step n. While the job waits for capacity on its step
(``PodsScheduled`` False: no free node pool, ``WaitingForNodePools``, or its pods wait for
the pools GKE is to create, or for a ProvisioningRequest, or cannot be scheduled,
``Unschedulable``), it moves to the next step once it has waited that step's
``afterSeconds`` on the one it is on, counted from the later of when the wait began (the
condition's ``lastTransitionTime``) and when it moved to its step
(``status.fallback.since``); a ``CapacityFallback`` event says so. The pools it is then
given, and its slices' pods, ask for the step's capacity (``placement_of``,
``wire_placement``); an attempt whose pods already wait is started again on the new
step's capacity (``start.replace``). The job stays on the step it reached;
``waitingTimeoutSeconds`` (``patience``) still bounds the whole wait. A job under Kueue
falls back through its ClusterQueue's ResourceFlavors instead: Kueue decides its capacity.
"""

from __future__ import annotations

from typing import Any

from tpu_operator.api.capacity import FallbackStatus, capacity_words
from tpu_operator.api.conditions import parse, stamp
from tpu_operator.api.job import TPUJobStatus
from tpu_operator.api.policy import Placement
from tpu_operator.api.status import ConditionType, Reason
from tpu_operator.policies.plan import JobFacts, Plan

STEP_FIELDS = ("spot", "reservation", "capacity", "maxRunDurationSeconds")
"""The placement fields a step replaces."""


def step_of(status: TPUJobStatus) -> int:
    """The step the job is on (0: spec.placement's own)."""
    return status.fallback.step if status.fallback is not None else 0


def placement_of(facts: JobFacts, status: TPUJobStatus) -> Placement | None:
    """The placement the job asks for now: spec.placement with its step's spot,
    reservation and capacity."""
    placement = facts.spec.placement
    return placement.step(step_of(status)) if placement is not None else None


def wire_placement(raw: dict[str, Any] | None, status: TPUJobStatus) -> dict[str, Any] | None:
    """The placement the job's TPUSlices carry (as stored, camelCase): the step's spot,
    reservation and capacity, without the fallbacks (a TPUSlice has none)."""
    if raw is None:
        return None
    placement = {k: v for k, v in raw.items() if k != "fallbacks"}
    fallbacks = raw.get("fallbacks") or []
    index = min(step_of(status), len(fallbacks))
    if index > 0:
        chosen = fallbacks[index - 1]
        for key in STEP_FIELDS:
            placement.pop(key, None)
            if chosen.get(key) is not None:
                placement[key] = chosen[key]
    return placement


WAITS: frozenset[str] = frozenset({Reason.WAITING_FOR_NODE_POOLS, Reason.UNSCHEDULABLE})
"""The ``PodsScheduled`` reasons that are waits for capacity a fallback may end."""


def _waiting_since(plan: Plan) -> float | None:
    """When the job began to wait for capacity (epoch seconds), if it does."""
    for condition in plan.conditions:
        if (
            condition.get("type") == ConditionType.PODS_SCHEDULED
            and condition.get("status") == "False"
            and condition.get("reason") in WAITS
        ):
            began = parse(condition.get("lastTransitionTime"))
            return began.timestamp() if began is not None else None
    return None


def check(facts: JobFacts, plan: Plan) -> bool:
    """Move to the next step when the job has waited long enough on the one it is on
    (True when it moved)."""
    placement = facts.spec.placement
    fallbacks = placement.fallbacks if placement is not None else None
    status = plan.status
    if not fallbacks or status.queue is not None or status.running_since is not None:
        return False
    current = step_of(status)
    if current >= len(fallbacks):
        return False
    began = _waiting_since(plan)
    if began is None:
        return False
    entered = parse(status.fallback.since) if status.fallback is not None else None
    start = max(began, entered.timestamp()) if entered is not None else began
    waited = plan.now.timestamp() - start
    following = fallbacks[current]
    if waited < following.after_seconds:
        plan.after(following.after_seconds - waited)
        return False
    assert placement is not None
    before = placement.step(current)
    status.fallback = FallbackStatus(
        step=current + 1, since=stamp(plan.now), capacity=following.words()
    )
    plan.event(
        "Normal",
        Reason.CAPACITY_FALLBACK,
        f"waited {waited:.0f} s for a node pool of "
        f"{capacity_words(before.spot, before.reservation, before.capacity)} (step {current}); "
        f"falling back "
        f"to step {current + 1} of placement.fallbacks: {following.words()}",
    )
    return True


def renewal(status: TPUJobStatus) -> int | None:
    """The salt of the slice-pool claims of a fallen-back job (``World.claims``): a pool GKE
    creates for a later step is never taken for the claim of an earlier one."""
    step = step_of(status)
    return -step if step else None
