"""Stalled training and stragglers, from the progress sampler's track of the attempt.

A job whose step has not advanced for ``monitoring.stallTimeout`` (less the compile and
checkpoint time its leader reports) is stalled: condition ``Stalled``, a Warning event,
and with ``stallAction: Restart`` a failure of the attempt (``verdict``). A worker whose
data wait or step time per step stands out from its slice's is a straggler: condition
``Straggler`` and an event, no restart (docs/concepts/goodput.md)."""

from __future__ import annotations

from tpu_operator.api.monitoring import seconds
from tpu_operator.api.status import ConditionType, Reason
from tpu_operator.policies.plan import JobFacts, Plan
from tpu_operator.state.gang import WorkerFailure


def stall(facts: JobFacts, plan: Plan) -> WorkerFailure | None:
    """A stall of the running attempt (a failure of it), or None; conditions either way."""
    track = facts.track
    if track is None:
        return None
    monitoring = facts.monitoring
    stalled_for = track.stalled_for(plan.now.timestamp())
    timeout = seconds(monitoring.stall_timeout)
    if stalled_for is None or stalled_for <= timeout:
        if track.step is not None:
            plan.condition(
                ConditionType.STALLED,
                False,
                Reason.PROGRESSING,
                f"at step {int(track.step)}",
            )
        return None
    leader = track.leader()
    pod = leader.pod if leader else ""
    message = (
        f"no training step for {stalled_for:.0f} s (stallTimeout "
        f"{monitoring.stall_timeout}) at step {int(track.step or 0)}"
    )
    if not plan.condition_is(ConditionType.STALLED, True):
        plan.event("Warning", Reason.STALLED, message)
    plan.condition(ConditionType.STALLED, True, Reason.STALLED, message)
    return WorkerFailure(Reason.STALLED, message, pod, leader.node if leader else None, None, None)


def stragglers(facts: JobFacts, plan: Plan) -> bool:
    """Name the slowest workers, if any stands out (and the job is not stalled, progress).
    True when the ``Straggler`` condition turns (a straggler found or gone): the progress
    published with it must then be fresh, so that ``progress.slowestWorkers`` agrees with
    the condition."""
    track = facts.track
    if track is None or track.leader() is None:
        return False
    found = track.stragglers(facts.monitoring.straggler_threshold)
    turned = plan.condition_is(ConditionType.STRAGGLER, True) != bool(found)
    if not found:
        plan.condition(ConditionType.STRAGGLER, False, Reason.NO_STRAGGLER)
    else:
        message = "; ".join(s.describe() for s in found)
        if not plan.condition_is(ConditionType.STRAGGLER, True):
            plan.event("Warning", Reason.STRAGGLER, message)
        plan.condition(ConditionType.STRAGGLER, True, Reason.STRAGGLER, message)
    if not plan.condition_is(ConditionType.STALLED, True):
        plan.condition(ConditionType.STALLED, False, Reason.PROGRESSING)
    return turned
