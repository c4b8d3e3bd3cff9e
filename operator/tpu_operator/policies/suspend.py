"""Suspension, and the pods of a job that runs no attempt.

A suspended job (``spec.suspend``) stops its slices (their pods are deleted) and records
no pools; its pools stay held by its pods until they are gone (``reconcile/pools.py``).
A suspended or finished job says whether its pods are gone (condition ``PodsStopped``):
its chips are free only then. Resuming starts a new attempt (``start``)."""

from __future__ import annotations

from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.policies.plan import Act, JobFacts, Plan


def stopped(plan: Plan) -> None:
    """A suspended or finished job: say whether its pods (and so its pools) are gone."""
    status = plan.status
    active, terminating = status.active_pods, status.terminating_pods
    if active or terminating:
        plan.condition(
            ConditionType.PODS_STOPPED,
            False,
            Reason.PODS_STOPPING,
            f"{active} pods not yet marked for deletion, {terminating} terminating",
        )
    else:
        plan.condition(
            ConditionType.PODS_STOPPED,
            True,
            Reason.ALL_PODS_STOPPED,
            "no pod of the job is left: its node pools and chips are free",
        )


def suspend(facts: JobFacts, plan: Plan) -> None:
    """``spec.suspend``: stop the slices, close the attempt, hold no pools."""
    status = plan.status
    plan.act = Act.STOP
    if status.phase != Phase.SUSPENDED:
        plan.event("Normal", Reason.SUSPENDED, "suspended: deleting the workers' pods")
    plan.account.suspend(facts.total_workers)  # the attempt ends; its clock stops
    status.phase = Phase.SUSPENDED
    status.node_pools = None
    status.restart_at = None
    stopping = status.active_pods + status.terminating_pods
    status.message = f"suspended; {stopping} pods still stopping" if stopping else "suspended"
    status.ready_workers = 0
    status.ready = f"0/{facts.total_workers}"
    plan.condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, "spec.suspend is true")
    plan.condition(ConditionType.RUNNING, False, Reason.SUSPENDED)
    stopped(plan)
