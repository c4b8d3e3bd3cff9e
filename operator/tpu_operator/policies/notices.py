"""GKE's notices of maintenance or termination of the nodes of a running attempt: each new
one asks the job's workers to checkpoint now, once (docs/tasks/restarts.md), as soon as
they train."""

from __future__ import annotations

from tpu_operator.api.status import Reason
from tpu_operator.policies.plan import JobFacts, Plan, World

MAX_NOTICES = 32
"""Disruption notices remembered in status (each asks for one checkpoint)."""


def checkpoint_on_notices(facts: JobFacts, plan: Plan, world: World, attempt: int) -> None:
    """New notices on the nodes of ``attempt``'s pods: remembered, and a checkpoint asked
    of the workers after the status write (``plan.checkpoint_for``)."""
    status = plan.status
    if facts.monitoring.enabled and (facts.track is None or facts.track.step is None):
        # Not training yet (importing, rendezvous, compiling): a request now would reach
        # processes that cannot take it. The notice is handled once steps are seen.
        return
    seen = set(status.disruption_notices)
    new: list[str] = []
    # From the few noticed nodes to their pods, not from every pod of the job to its
    # node: this runs on each reconcile of a running job of up to 12,736 pods.
    for node, notice in sorted(world.noticed_nodes().items()):
        key = f"node {node}: {notice}"
        if key in seen:
            continue
        if any(
            p.job_owned
            and p.attempt == attempt
            and p.namespace == facts.namespace
            and p.job_name == facts.name
            for p in world.pods_on_node(node)
        ):
            seen.add(key)
            new.append(key)
    if not new:
        return
    status.disruption_notices = [*status.disruption_notices, *new][-MAX_NOTICES:]
    status.checkpoint_requests += 1
    plan.checkpoint_for = new
    plan.event(
        "Normal",
        Reason.CHECKPOINT_REQUESTED,
        f"asking the {facts.total_workers} workers to checkpoint now: " + "; ".join(new),
    )
