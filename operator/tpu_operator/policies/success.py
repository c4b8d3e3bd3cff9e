"""A job whose workers are done (``successPolicy``: every worker exited 0, or worker 0 of
slice 0 did): it succeeds, its slices stop and it records no pools."""

from __future__ import annotations

from tpu_operator.api.conditions import stamp
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.policies.plan import Act, JobFacts, Plan
from tpu_operator.policies.suspend import stopped
from tpu_operator.state.gang import GangState


def succeed(facts: JobFacts, plan: Plan, state: GangState) -> None:
    status = plan.status
    plan.act = Act.STOP
    plan.account.close_attempt(facts.total_workers)
    status.phase = Phase.SUCCEEDED
    policy = facts.spec.success_policy
    status.message = (
        f"all {state.total} workers exited 0"
        if policy == "AllWorkers"
        else "worker 0 of slice 0 exited 0 (successPolicy LeaderWorker)"
    )
    status.completion_time = stamp(plan.now)
    status.restart_at = None
    status.node_pools = None
    plan.condition(ConditionType.SUCCEEDED, True, policy, status.message)
    plan.condition(ConditionType.RUNNING, False, Reason.SUCCEEDED)
    plan.condition(ConditionType.RESTARTING, False, Reason.SUCCEEDED)
    plan.event("Normal", Reason.SUCCEEDED, status.message)
    stopped(plan)
