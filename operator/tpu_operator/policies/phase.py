"""The phase of an attempt that goes on, its message and conditions.

``Restarting`` while the previous attempt's pods drain or the restart backoff runs;
``Pending`` while every pod is still to be created; ``Starting`` until every worker of the
attempt runs; ``Running`` from then on until the attempt ends (a worker whose readiness
fails for a while, a long compilation or checkpoint on a busy host, shows in ``ready``
and the message, not in the phase). Every attempt has its own ``runningSince``; the
goodput account books the wait before it (``progress/account.py``).
"""

from __future__ import annotations

from tpu_operator import contract
from tpu_operator.api.job import SliceSummary
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.policies import notices, stalls, waiting
from tpu_operator.policies.in_place import restarting_in_place
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.state.gang import GangState, Outcome


def summaries(facts: JobFacts, plan: Plan, state: GangState) -> None:
    """The job's worker counts and one summary per slice."""
    status = plan.status
    status.workers = state.total
    status.ready_workers = state.ready
    status.ready = f"{state.ready}/{state.total}"
    before = {s.index: s for s in status.slices}
    found = []
    ready_slices = 0
    for index in range(facts.spec.num_slices):
        count = state.slices.get(index)
        body = facts.slices.get(index) or {}
        slice_status = body.get("status") or {}
        total = count.total if count else facts.shape.hosts
        ready = count.ready if count else 0
        ready_slices += int(ready == total and total > 0)
        pool = (body.get("spec") or {}).get("nodePool")
        known = before.get(index)
        found.append(
            SliceSummary(
                index=index,
                name=contract.slice_name(facts.name, index),
                phase=slice_status.get("phase", Phase.PENDING),
                workers=total,
                ready_workers=ready,
                node_pool=pool,
                failures=known.failures if known else 0,
                # A slice that moved to another pool starts its count there again.
                pool_failures=known.pool_failures if known and known.node_pool == pool else 0,
            )
        )
    status.slices = found
    status.slices_ready = f"{ready_slices}/{facts.spec.num_slices}"
    if facts.spec.elastic is not None:
        status.active_slices = facts.spec.num_slices - len(status.dropped_slices)


def of_attempt(
    status_running: bool,
    outcome: Outcome,
    state: GangState,
    draining: bool,
    backing_off: bool,
) -> Phase:
    """The phase of an attempt that goes on (``status_running``: it has run once)."""
    if draining or backing_off:
        return Phase.RESTARTING
    if outcome == "Creating" and len(state.to_create) == state.total:
        return Phase.PENDING
    if outcome == "Starting" and status_running:
        return Phase.RUNNING
    if outcome in ("Creating", "Starting"):
        return Phase.STARTING
    return Phase.RUNNING


def message(
    phase: Phase,
    outcome: Outcome,
    state: GangState,
    attempt: int,
    draining: bool,
    in_place: bool,
    restart_at: str | None,
) -> str:
    """The status message of an attempt that goes on."""
    if phase == Phase.RESTARTING:
        if draining and in_place:
            return (
                f"attempt {attempt}: restarting in place; the training processes of "
                f"{len(state.stale)} pods are being stopped"
            )
        if draining:
            return (
                f"attempt {attempt}: waiting for {len(state.stale)} pods of the previous "
                "attempt to stop"
            )
        return f"attempt {attempt}: restart backoff until {restart_at}"
    if phase == Phase.PENDING:
        return f"attempt {attempt}: creating {state.total} pods"
    if phase == Phase.STARTING:
        return f"attempt {attempt}: {state.ready}/{state.total} workers ready"
    if outcome == "Starting":
        # Every worker of this attempt has run: only a failure ends the attempt.
        return (
            f"attempt {attempt}: all {state.total} workers running, "
            f"{state.ready + state.succeeded} ready or done"
        )
    return f"attempt {attempt}: all {state.total} workers running"


def goes_on(
    facts: JobFacts,
    plan: Plan,
    world: World,
    state: GangState,
    outcome: Outcome,
    attempt: int,
    draining: bool,
    backing_off: bool,
) -> None:
    """The status of an attempt that neither failed nor succeeded."""
    status = plan.status
    phase = of_attempt(status.running_since is not None, outcome, state, draining, backing_off)
    in_place = restarting_in_place(status)
    status.message = message(phase, outcome, state, attempt, draining, in_place, status.restart_at)
    if phase == Phase.RUNNING and in_place and not world.in_place_started(attempt):
        # Pods whose process was stopped still show Ready for a while: the attempt runs
        # once their supervisors were told to start it (after every recreated pod runs).
        phase = Phase.STARTING
        status.message = (
            f"attempt {attempt}: restarting in place; the training processes start once "
            "every old one has stopped and every recreated pod runs"
        )
    if phase == Phase.RUNNING:
        status.in_place_since = None  # an in-place restart is over once running
        if status.running_since is None:
            plan.account.began_running(first_attempt=attempt == 1 and status.restarts == 0)
        if facts.previous_phase != Phase.RUNNING:
            plan.event("Normal", Reason.RUNNING, status.message)
            if attempt == 1 and status.restarts == 0 and facts.supervision_refused:
                plan.event("Warning", Reason.IN_PLACE_REFUSED, facts.supervision_refused)
            if attempt == 1 and status.restarts == 0:
                elapsed = (plan.now - facts.created).total_seconds()
                plan.after_commit.append(lambda: world.metrics.time_to_running(elapsed))
    if phase != Phase.RESTARTING and status.restart_at is not None and not backing_off:
        status.restart_at = None
    status.phase = phase
    plan.condition(ConditionType.RUNNING, phase == Phase.RUNNING, phase, status.message)
    plan.condition(
        ConditionType.RESTARTING,
        phase == Phase.RESTARTING,
        Reason.RESTARTING if phase == Phase.RESTARTING else phase,
    )
    conflict = world.service_conflict()
    if conflict:
        status.message = f"attempt {attempt}: {conflict}"
        if conflict not in (facts.recorded.get("message") or ""):
            plan.event("Warning", Reason.SERVICE_CONFLICT, conflict)
    said = waiting.explain(facts, plan, world, attempt, state)
    if not said and phase in (Phase.STARTING, Phase.RUNNING):
        plan.condition(ConditionType.PODS_SCHEDULED, True, Reason.SCHEDULED)
    if phase == Phase.RUNNING and facts.supervised:
        notices.checkpoint_on_notices(facts, plan, world, attempt)
    turned = stalls.stragglers(facts, plan)
    plan.account.publish(phase, state.total, fresh=turned)
