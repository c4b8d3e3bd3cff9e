"""``waitingTimeoutSeconds``: how long a job may wait for capacity before it fails.

A job waits while its ``PodsScheduled`` condition is False (no free node pools, pods the
scheduler cannot place, pods or TPUSlices the apiserver refuses, pods no scheduler looks
at) or while Kueue holds it (``Queued`` True). Each wait counts from when it began, the
condition's ``lastTransitionTime``; past the timeout the job fails with
``WaitingTimeout`` and the reason it waited for. Unset, it waits for as long as it takes.
"""

from __future__ import annotations

from tpu_operator.api.conditions import parse
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.policies.failure import fail
from tpu_operator.policies.plan import JobFacts, Plan

WAITING: dict[str, str] = {ConditionType.PODS_SCHEDULED: "False", ConditionType.QUEUED: "True"}
"""The conditions that say a job waits for capacity, and the status that says so."""


def waiting_since(plan: Plan) -> tuple[float, str] | None:
    """When the job's current wait began (epoch seconds) and what for, or None."""
    found: tuple[float, str] | None = None
    for condition in plan.conditions:
        wanted = WAITING.get(str(condition.get("type")))
        if wanted is None or condition.get("status") != wanted:
            continue
        began = parse(condition.get("lastTransitionTime"))
        if began is None:
            continue
        what = f"{condition.get('reason')}: {condition.get('message') or ''}".rstrip(": ")
        if found is None or began.timestamp() < found[0]:
            found = (began.timestamp(), what)
    return found


def check(facts: JobFacts, plan: Plan) -> None:
    """Fail a job that has waited longer than ``spec.waitingTimeoutSeconds``."""
    timeout = facts.spec.waiting_timeout_seconds
    if timeout is None or plan.status.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
        return
    wait = waiting_since(plan)
    if wait is None:
        return
    since, what = wait
    waited = plan.now.timestamp() - since
    if waited < timeout:
        plan.after(timeout - waited)
        return
    fail(
        facts,
        plan,
        Reason.WAITING_TIMEOUT,
        f"waited {waited:.0f} s for capacity, longer than waitingTimeoutSeconds ({timeout}); "
        f"last waiting for {what}",
        None,
    )
