"""A failed attempt: the failure policy, the kind of restart, and failing the job.

The failure is recorded (``status.lastFailure``), the policy decides whether it restarts
and whether it counts against ``maxRestarts`` (``decisions.decide``), and a restart is
booked with its backoff and its kind: in place (the supervisors stop and restart the
training processes in the pods they have), by recreating the pods, or mixed: the slices
the failure touched recreated, the others in place (``decisions.restart_kind``). The next
attempt is committed before any slice moves to it; slices on broken or deleted pools move
to healthy ones, a spare first (``pools.move_from_unhealthy``), a pool that vanished with
nowhere to move is replaced by a new one from GKE before its pods exist where the slice
may provision (``pools.renew_vanished``), and an elastic job goes on without the slices
that cannot (``elastic.shrink``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tpu_operator import contract
from tpu_operator.api.common import Failure
from tpu_operator.api.conditions import stamp
from tpu_operator.api.policy import FailurePolicy
from tpu_operator.api.status import ConditionType, Phase, Reason, RestartKind
from tpu_operator.decisions import (
    Decision,
    RestartChoice,
    RestartCounters,
    book_restart,
    decide,
    restart_kind,
)
from tpu_operator.policies import elastic, pools
from tpu_operator.policies.in_place import IN_PLACE_KINDS
from tpu_operator.policies.plan import Act, JobFacts, Plan, World
from tpu_operator.policies.suspend import stopped
from tpu_operator.state.gang import WorkerFailure


@dataclass(frozen=True)
class Booked:
    """The failure policy's word on a failed attempt, and the restart it booked."""

    decision: Decision
    delay: float = 0.0
    """The backoff before the next attempt may create pods (s)."""
    not_before: str | None = None
    """When the next attempt may create pods (None: at once, or no restart)."""


def book(
    failure: WorkerFailure,
    policy: FailurePolicy,
    counters: RestartCounters,
    now: dt.datetime,
    *,
    count_stalls: bool = True,
) -> Booked:
    """Whether ``failure`` restarts under ``policy`` (``decisions.decide``); a restart is
    counted in ``counters`` and given its backoff (``decisions.book_restart``). The one
    rule of a failed attempt, for a job and for a standalone TPUSlice."""
    decision = decide(failure, policy, counters.counted_restarts, count_stalls=count_stalls)
    if not decision.restart:
        return Booked(decision)
    delay = book_restart(counters, decision, policy)
    return Booked(decision, delay, stamp(now + dt.timedelta(seconds=delay)) if delay else None)


def fail(facts: JobFacts, plan: Plan, reason: Reason, message: str, record: Failure | None) -> None:
    """The job fails for good: its slices stop and it records no pools."""
    status = plan.status
    plan.act = Act.STOP
    plan.account.close_attempt(facts.total_workers)
    status.phase = Phase.FAILED
    status.message = message
    status.completion_time = stamp(plan.now)
    status.restart_at = None
    status.node_pools = None
    if record is not None:
        status.last_failure = record
    plan.condition(ConditionType.FAILED, True, reason, message)
    plan.condition(ConditionType.RUNNING, False, reason)
    plan.condition(ConditionType.RESTARTING, False, reason)
    plan.event("Warning", Reason.FAILED, message)
    stopped(plan)


POOL_FAULTS = frozenset({Reason.WORKER_FAILED, Reason.STALLED, Reason.NODE_LOST})
"""Failures a slice's hosts may be to blame for (``SliceSummary.poolFailures``); an
eviction, a preemption or a deleted pod is not."""


def failed_slice(facts: JobFacts, pod: str) -> int | None:
    """The index of the slice whose worker ``pod`` is (a gone pod by its name)."""
    for view in facts.pods:
        if view.name == pod:
            return view.slice_index
    head, _, _ = pod.rpartition("-")
    job, _, index = head.rpartition("-")
    if job == facts.name and index.isdigit() and int(index) < facts.spec.num_slices:
        return int(index)
    return None


def count_slice_failure(facts: JobFacts, plan: Plan, failure: WorkerFailure) -> dict[int, str]:
    """Count ``failure`` on its slice (``status.slices``); the slices whose failures on
    their node pool reached ``failurePolicy.maxSliceFailuresPerPool``, and why each (their
    next restart recreates them on another pool)."""
    index = failed_slice(facts, failure.pod) if failure.pod else None
    summaries = {s.index: s for s in plan.status.slices}
    summary = summaries.get(index) if index is not None else None
    if summary is not None:
        summary.failures += 1
        summary.pool_failures += int(failure.reason in POOL_FAULTS)
    limit = facts.policy.max_slice_failures_per_pool
    if not limit:
        return {}
    return {
        s.index: (
            f"its workers failed {s.pool_failures} times on node pool {s.node_pool} "
            f"(failurePolicy.maxSliceFailuresPerPool: {limit})"
        )
        for s in plan.status.slices
        if s.pool_failures >= limit and s.node_pool
    }


def attempt_failed(
    facts: JobFacts, plan: Plan, world: World, failure: WorkerFailure, attempt: int
) -> None:
    """``attempt`` failed with ``failure``: restart as the failure policy says, or fail."""
    status = plan.status
    booked = book(
        failure,
        facts.policy,
        status,
        plan.now,
        count_stalls=facts.monitoring.count_stall_restarts,
    )
    decision = booked.decision
    failed_at = plan.now
    track = facts.track
    if failure.reason == Reason.STALLED and track and track.advanced_at:
        # The attempt stopped being useful at its last step, not when that was noticed.
        failed_at = dt.datetime.fromtimestamp(track.advanced_at, dt.UTC)
    record = Failure(
        attempt=attempt,
        reason=failure.reason,
        message=failure.message,
        pod=failure.pod,
        node=failure.node,
        exit_code=failure.exit_code,
        counted=decision.counted,
        time=stamp(failed_at),
    )
    status.last_failure = record
    worn = count_slice_failure(facts, plan, failure)
    if not decision.restart:
        fail(facts, plan, decision.reason, decision.message, record)
        return
    plan.account.close_attempt(facts.total_workers)
    delay = booked.delay
    status.restart_at = booked.not_before
    status.attempt = attempt + 1
    status.phase = Phase.RESTARTING
    pods = facts.pods
    dropped = {d.index for d in status.dropped_slices}
    if dropped:
        # The attempt ran without some slices: the next one's world is chosen anew.
        choice = RestartChoice(
            RestartKind.RECREATE, f"the job ran on {status.active_slices} of its slices"
        )
    else:
        choice = restart_kind(
            supervised=facts.supervised,
            refused=facts.supervision_refused,
            mode=facts.policy.restart_mode,
            failure=failure,
            pods=[p for p in pods if p.attempt == attempt],
            num_slices=facts.spec.num_slices,
            hosts=facts.shape.hosts,
            not_ready_nodes=world.not_ready_nodes(p.node for p in pods),
            worn=worn,
        )
    # Committed first, then the slices move to the next attempt (Act.RUN): slices on
    # broken or deleted pools move to healthy ones (a spare first), and those left on a
    # pool that vanished get a new one from GKE where they may provision.
    said = len(plan.events)  # the restart's own event comes before what it did to pools
    recreated = (
        range(facts.spec.num_slices) if choice.kind == RestartKind.RECREATE else choice.recreate
    )
    elastic_job = facts.spec.elastic is not None
    stuck = pools.move_from_unhealthy(
        facts, plan, world, recreated, worn, say_waits=not elastic_job
    )
    pools.renew_vanished(facts, plan, world, status.attempt, facts.created_slices(status.attempt))
    if elastic_job and elastic.shrink(facts, plan, stuck, worn, dropped):
        choice = RestartChoice(
            RestartKind.RECREATE,
            f"the job trains on {status.active_slices} of its {facts.spec.num_slices} slices "
            "from now on",
        )
    kind = choice.kind
    in_place = kind in IN_PLACE_KINDS
    status.restart_kind = kind
    status.recreated_slices = sorted(choice.recreate) if kind == RestartKind.MIXED else None
    status.in_place_since = stamp(plan.now) if in_place else None
    status.in_place_restarts += int(in_place)
    how = {
        RestartKind.IN_PLACE: "in place",
        RestartKind.MIXED: "slice by slice",
        RestartKind.RECREATE: "by recreating the pods",
    }[kind]
    budget = f"{status.counted_restarts} of {facts.policy.max_restarts} counted restarts used"
    status.message = (
        f"restarting {how} ({choice.why}) as attempt {attempt + 1} in {delay:.0f} s: "
        f"{decision.message}"
    )
    plan.condition(ConditionType.RESTARTING, True, decision.reason, status.message)
    plan.condition(ConditionType.RUNNING, False, Reason.RESTARTING)
    plan.events.insert(said, ("Warning", Reason.RESTARTING, f"{status.message} ({budget})"))
    plan.after_commit.append(lambda: world.metrics.restart(contract.JOB_KIND, decision.reason))
    if delay:
        plan.after(delay)
