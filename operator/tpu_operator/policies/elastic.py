"""Elastic multislice (``spec.elastic``): train on fewer slices while one cannot be
replaced, and grow back to ``numSlices`` once it can.

Shrinking happens at a restart (``failure.attempt_failed``): a slice the restart would
recreate whose node pool is unhealthy, or whose failures there reached
``failurePolicy.maxSliceFailuresPerPool``, moves to a free healthy pool of its shape
(``pools.move_from_unhealthy``); when there is none, the next attempt runs without it on
the others, if at least ``elastic.minSlices`` remain (``slices_to_drop``), and waits for
the repair otherwise, as a job that is not elastic does. A changed world is brought up by
recreating the pods: their multislice env (``MEGASCALE_NUM_SLICES``, slice ids, process ids
and count, the coordinator) is that of the slices that run (``worldSlices`` of each
TPUSlice, ``builders/wiring.py``), and the workers resume from their last checkpoint.
Every restart of a job that runs without some slices recreates its pods, and brings the
dropped slices back when it can.

Growing back happens while the smaller attempt runs (``grow``): once each dropped slice
has a healthy pool again (its own, healed, or a free one of its shape), the workers are
asked to checkpoint (as for a maintenance notice, ``notices.py``; asked again under the
same id while the checkpoint is not written, so that a request an operator committed but
died before sending is still sent), and once worker 0
reports the checkpoint written (or ``CHECKPOINT_WAIT_SECONDS`` passed) the job restarts on
all its slices: a restart not counted against ``maxRestarts`` (reason
``SlicesRestored``). The capacity missing while it runs smaller is booked in goodput as
``degraded`` (``progress/report.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence

from tpu_operator import contract
from tpu_operator.api.conditions import stamp
from tpu_operator.api.job import DroppedSlice, GrowBack
from tpu_operator.api.status import ConditionType, Phase, Reason, RestartKind
from tpu_operator.decisions import Decision, book_restart
from tpu_operator.placement.provisioning import is_claim
from tpu_operator.policies import fallback, notices
from tpu_operator.policies import pools as pool_moves
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.timestamps import parse

CHECKPOINT_WAIT_SECONDS = 60.0
"""How long a job growing back waits for worker 0 to report the checkpoint it was asked
for, before it restarts anyway (without progress figures, it waits this long)."""
RECHECK_SECONDS = 15.0
"""How often a job running without some slices looks for pools to grow back onto."""
CHECKPOINT_POLL_SECONDS = 2.0
"""How often a job growing back looks whether its checkpoint is written."""


# pure decisions
def slices_to_drop(num_slices: int, stuck: Mapping[int, str], min_slices: int) -> dict[int, str]:
    """The slices the next attempt runs without: every slice of ``stuck`` (a restart
    cannot bring it back now; why each), when at least ``min_slices`` of the job's
    ``num_slices`` remain; none otherwise (the job waits for them)."""
    drop = {i: why for i, why in sorted(stuck.items()) if 0 <= i < num_slices}
    if not drop or num_slices - len(drop) < min_slices:
        return {}
    return drop


def world_of(num_slices: int, dropped: Collection[int]) -> list[int] | None:
    """The slices an attempt runs on, in order; None when it runs on all of them."""
    if not dropped:
        return None
    return [i for i in range(num_slices) if i not in dropped]


def pools_back(
    dropped: Sequence[DroppedSlice], refs: Sequence[str], unhealthy: Mapping[int, str]
) -> tuple[list[int], list[int]]:
    """The dropped slices that may return to the pool they have (healthy again, and not
    the pool their failures wore out), and those that need another one."""
    own, other = [], []
    for slice_ in dropped:
        index = slice_.index
        ref = refs[index] if index < len(refs) else None
        if ref and not is_claim(ref) and index not in unhealthy and not slice_.worn:
            own.append(index)
        else:
            other.append(index)
    return own, other


def checkpoint_written(
    *,
    requested_at: dt.datetime,
    now: dt.datetime,
    saved_before: float | None,
    saved_now: float | None,
    wait_seconds: float = CHECKPOINT_WAIT_SECONDS,
) -> bool:
    """Whether a job growing back may restart: worker 0's checkpoint-save seconds grew
    since the request (the checkpoint it was asked for is written), or the request is
    ``wait_seconds`` old."""
    if saved_before is not None and saved_now is not None and saved_now > saved_before:
        return True
    return (now - requested_at).total_seconds() >= wait_seconds


# the policies
def shrink(
    facts: JobFacts,
    plan: Plan,
    stuck: Mapping[int, str],
    worn: Collection[int],
    was_dropped: set[int],
) -> bool:
    """At a restart: the slices in ``stuck`` are dropped for the next attempt if at least
    ``elastic.minSlices`` remain (and every other slice runs again); otherwise the stuck
    slices wait for the repair. ``worn``: slices whose failures wore out their pool
    (they come back only on another one). Whether the next attempt's world differs from the
    failed one's (its pods must then all be recreated)."""
    status = plan.status
    elastic = facts.spec.elastic
    num = facts.spec.num_slices
    drop = slices_to_drop(num, stuck, elastic.min_slices) if elastic else {}
    if not drop:
        pool_moves.say_wait(plan, stuck)
    previous = {d.index: d for d in status.dropped_slices}
    status.dropped_slices = [
        DroppedSlice(
            index=i,
            reason=why,
            since=previous[i].since if i in previous else stamp(plan.now),
            worn=i in worn,
        )
        for i, why in drop.items()
    ]
    status.active_slices = num - len(drop) if elastic else None
    status.grow_back = None
    new = set(drop) - was_dropped
    if new:
        world_ = world_of(num, drop) or []
        plan.event(
            "Warning",
            Reason.SLICES_DROPPED,
            f"training on {len(world_)} of {num} slices (elastic.minSlices: "
            f"{elastic.min_slices if elastic else num}) from attempt {status.attempt}; "
            + "; ".join(f"without slice {i}: {why}" for i, why in drop.items()),
        )
    back = was_dropped - set(drop)
    if back:
        plan.event(
            "Normal",
            Reason.SLICES_RESTORED,
            f"slices {', '.join(str(i) for i in sorted(back))} run again from attempt "
            f"{status.attempt} ({num - len(drop)} of {num} slices)",
        )
    return set(drop) != was_dropped


def grow(facts: JobFacts, plan: Plan, world: World, attempt: int) -> None:
    """A running attempt without some slices: grow back once each has a healthy pool,
    after a checkpoint."""
    status = plan.status
    if not status.dropped_slices or status.phase != Phase.RUNNING:
        return
    refs = list(status.node_pools or [])
    placement = fallback.placement_of(facts, status)
    _, other = pools_back(status.dropped_slices, refs, world.unhealthy_pools(refs))
    pools = refs
    if other:
        pinned = placement is not None and bool(placement.node_pools)
        allocation = None
        if len(refs) == facts.spec.num_slices and not pinned:
            # Growing back takes a pool that is there; a flex-start or queued-provisioning
            # slice never one of another capacity: it waits for its own.
            requests = pool_moves.moving(
                facts, world, placement, refs, other, attempt, new_vms=False
            )
            allocation = world.allocate(requests)
        if allocation is None or allocation.pools is None:
            status.grow_back = None  # no capacity (or no longer)
            plan.after(RECHECK_SECONDS)
            return
        chosen = allocation.pools
        pools = [chosen[i] if i in other else ref for i, ref in enumerate(refs)]
    grow_back = status.grow_back
    if grow_back is None and facts.supervised:
        status.grow_back = GrowBack(
            requested_at=stamp(plan.now), checkpoint_save_seconds=notices.checkpoint_seconds(facts)
        )
        status.checkpoint_requests += 1
        note = _checkpoint_note(facts, plan, attempt)
        plan.checkpoint_for = [f"{note} at {status.grow_back.requested_at}"]
        plan.event("Normal", Reason.CHECKPOINT_REQUESTED, note)
        plan.after(CHECKPOINT_POLL_SECONDS)
        return
    if grow_back is not None:
        requested = parse(grow_back.requested_at) or plan.now
        if not checkpoint_written(
            requested_at=requested,
            now=plan.now,
            saved_before=grow_back.checkpoint_save_seconds,
            saved_now=notices.checkpoint_seconds(facts),
        ):
            # The request again, under the same id (its supervisors acknowledge a repeated
            # one without asking again): the operator that committed it may have died
            # before asking, or some supervisor may not have answered.
            note = _checkpoint_note(facts, plan, attempt)
            plan.checkpoint_for = [f"{note} at {grow_back.requested_at}"]
            plan.after(CHECKPOINT_POLL_SECONDS)
            return
    _restart_full(facts, plan, world, attempt, pools)


def _checkpoint_note(facts: JobFacts, plan: Plan, attempt: int) -> str:
    """The checkpoint request of a job growing back, in words (the same on every
    reconcile of the attempt: the request's id derives from it)."""
    back = [d.index for d in plan.status.dropped_slices]
    return (
        f"attempt {attempt}: a healthy node pool is there for slice"
        + ("s " if len(back) > 1 else " ")
        + ", ".join(str(i) for i in back)
        + f" again: asking the {facts.total_workers} "
        f"workers to checkpoint before growing back to {facts.spec.num_slices} slices"
    )


def _restart_full(
    facts: JobFacts, plan: Plan, world: World, attempt: int, pools: list[str]
) -> None:
    """Restart on every slice: a new attempt, not counted against maxRestarts."""
    status = plan.status
    back = [d.index for d in status.dropped_slices]
    num = facts.spec.num_slices
    message = (
        f"a healthy node pool is there for slice{'s' if len(back) > 1 else ''} "
        + ", ".join(str(i) for i in back)
        + f" again: growing back to {num} slices"
    )
    plan.account.close_attempt(facts.total_workers, ended=True)
    book_restart(status, Decision(True, False, Reason.SLICES_RESTORED, message), facts.policy)
    status.attempt = attempt + 1
    status.phase = Phase.RESTARTING
    status.restart_at = None
    status.restart_kind = RestartKind.RECREATE
    status.recreated_slices = None
    status.in_place_since = None
    status.node_pools = pools
    status.dropped_slices = []
    status.active_slices = num
    status.grow_back = None
    status.message = f"restarting by recreating the pods as attempt {attempt + 1}: {message}"
    plan.condition(ConditionType.RESTARTING, True, Reason.SLICES_RESTORED, status.message)
    plan.condition(ConditionType.RUNNING, False, Reason.RESTARTING)
    plan.event(
        "Normal", Reason.SLICES_RESTORED, status.message + " (not counted against maxRestarts)"
    )
    plan.after_commit.append(
        lambda: world.metrics.restart(contract.JOB_KIND, Reason.SLICES_RESTORED)
    )
