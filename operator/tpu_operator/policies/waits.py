"""A wait for capacity that ends: how long, and what for.

A job waits while ``PodsScheduled`` is False (no free node pools, pools GKE is still
creating, pods the scheduler cannot place, pods or TPUSlices the apiserver refuses, pods
no scheduler looks at) or while Kueue holds it (``Queued`` True): the condition's reason
says what for, its ``lastTransitionTime`` since when (``patience.waiting_since``). When a
wait ends (the condition turns, or its reason changes to another wait), the job posts a
``WaitEnded`` event with the time and the reason, and the operator's
``tpu_operator_wait_seconds`` histogram takes the time under that reason, after the
status write: what a platform engineer sums to see where a cluster's jobs lose time.
"""

from __future__ import annotations

import functools
from typing import Any

from tpu_operator.api.conditions import parse
from tpu_operator.api.status import Reason
from tpu_operator.policies.patience import WAITING
from tpu_operator.policies.plan import JobFacts, Plan, World


def _waits(conditions: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """Waiting conditions by type: (reason, lastTransitionTime)."""
    return {
        str(c.get("type")): (str(c.get("reason") or ""), c.get("lastTransitionTime"))
        for c in conditions
        if WAITING.get(str(c.get("type"))) == c.get("status")
    }


def ended(facts: JobFacts, plan: Plan, world: World) -> None:
    """Report each wait the recorded status had that this reconcile's plan ends."""
    before = _waits(list(facts.recorded.get("conditions") or []))
    if not before:
        return
    now = _waits(plan.conditions)
    for type_, (reason, since) in sorted(before.items()):
        if now.get(type_, ("", None))[0] == reason:
            continue  # still waiting for the same thing
        began = parse(since)
        if began is None or not reason:
            continue
        seconds = max(0.0, (plan.now - began).total_seconds())
        plan.event(
            "Normal",
            Reason.WAIT_ENDED,
            f"waited {seconds:.0f} s ({type_} {reason}); "
            + ("now waiting for another reason" if type_ in now else "no longer waiting"),
        )
        plan.after_commit.append(functools.partial(world.metrics.waited, reason, seconds))
