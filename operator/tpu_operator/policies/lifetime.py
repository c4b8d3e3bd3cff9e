"""``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished``.

The deadline runs from ``status.startTime`` (reset on resume); past it the running job
fails with ``DeadlineExceeded``. A finished job keeps its slices stopped, reports its
pods until they are gone, and is deleted once its TTL after ``completionTime`` ran out."""

from __future__ import annotations

import datetime as dt

from tpu_operator.api.conditions import parse
from tpu_operator.policies.plan import Act, JobFacts, Plan
from tpu_operator.policies.suspend import stopped


def deadline_passed(facts: JobFacts, plan: Plan) -> bool:
    """Whether the running job has been active longer than its deadline (if not, the plan
    looks again when it will have been)."""
    deadline = facts.spec.active_deadline_seconds
    started = parse(plan.status.start_time)
    if deadline is None or started is None:
        return False
    remaining = started + dt.timedelta(seconds=deadline) - plan.now
    if remaining.total_seconds() > 0:
        plan.after(remaining.total_seconds())
        return False
    return True


def finished(facts: JobFacts, plan: Plan) -> None:
    """A job that succeeded or failed: its slices stay stopped, its summary follows what
    its slices report, and it is deleted once ``ttlSecondsAfterFinished`` ran out."""
    plan.act = Act.STOP
    for summary in plan.status.slices:
        # The slices report their own end after the job's: keep the summary current.
        slice_status = (facts.slices.get(summary.index) or {}).get("status") or {}
        summary.phase = slice_status.get("phase", summary.phase)
    stopped(plan)
    ttl = facts.spec.ttl_seconds_after_finished
    ended = parse(plan.status.completion_time)
    if ttl is None or ended is None:
        return
    due = ended + dt.timedelta(seconds=ttl)
    if plan.now < due:
        plan.after((due - plan.now).total_seconds())
        return
    plan.act = Act.DELETE
