"""GKE's notices of maintenance or termination of the nodes of a running attempt: each new
one asks the job's workers to checkpoint now, once (docs/tasks/restarts.md), as soon as
they train. A VM that says when GKE takes it back (a flex-start VM's
``node.gke.io/machine-termination-datetime``) gives its notice ahead of that time by
``termination_lead`` (twice the last checkpoint's save time and a margin, at least
``TERMINATION_LEAD_SECONDS``), whether or not GKE taints it first."""

from __future__ import annotations

import datetime as dt
import re

from tpu_operator import contract
from tpu_operator.api.status import Reason
from tpu_operator.policies.plan import JobFacts, Plan, World
from tpu_operator.worker_metrics import PHASE_CHECKPOINT_SAVE

MAX_NOTICES = 32
"""Disruption notices remembered in status (each asks for one checkpoint)."""

TERMINATION_LEAD_SECONDS = 120.0
"""The least time ahead of a VM's announced termination at which its workers are asked to
checkpoint."""
TERMINATION_MARGIN_SECONDS = 30.0
"""Added to twice the last checkpoint's save time, for the request to reach the workers."""


def checkpoint_seconds(facts: JobFacts) -> float | None:
    """How long worker 0's last checkpoint took to save, if it reported one."""
    leader = facts.track.leader() if facts.track else None
    sample = leader.latest if leader else None
    if sample is None:
        return None
    return sample.phases.get(PHASE_CHECKPOINT_SAVE, 0.0)


def termination_lead(facts: JobFacts) -> float:
    """How long before a VM's announced termination its workers are asked to checkpoint."""
    saving = checkpoint_seconds(facts) or 0.0
    return max(TERMINATION_LEAD_SECONDS, 2 * saving + TERMINATION_MARGIN_SECONDS)


def termination_notices(facts: JobFacts, plan: Plan, world: World) -> dict[str, str]:
    """Node -> notice for the VMs GKE takes back within the lead, and a wake-up at the next
    lead of the job's pools."""
    now = plan.now.timestamp()
    lead = termination_lead(facts)
    end = world.pools_end(plan.status.node_pools or [])
    if end is not None and end - lead > now:
        plan.after(end - lead - now)
    return {
        node: (
            f"run duration ends at {dt.datetime.fromtimestamp(when, dt.UTC):%Y-%m-%dT%H:%M:%SZ} "
            f"({contract.NODE_ANNOTATION_TERMINATION})"
        )
        for node, when in world.terminating_nodes(now + lead).items()
    }


def kind_of(notice: str) -> str:
    """A notice without what differs from node to node of one event (the time a taint was
    added, each VM's end of run duration): the nodes of a slice, or of a whole job, that
    GKE disrupts at once give one notice."""
    return _NODE_DETAIL.sub("", notice)


_NODE_DETAIL = re.compile(r" since [^\s)]+| at \d{4}-\d\d-\d\dT[^\s)]+")


def checkpoint_on_notices(facts: JobFacts, plan: Plan, world: World, attempt: int) -> None:
    """New notices on the nodes of ``attempt``'s pods: remembered (one entry per kind of
    notice and attempt, however many nodes have it), and a checkpoint asked of the workers
    after the status write (``plan.checkpoint_for``). While a remembered notice is still on
    a node of the attempt's pods, the latest request is asked again under its id (the
    supervisors acknowledge a repeated id without asking twice, and this operator sends it
    only to those that have not acknowledged it): the operator that committed it may have
    died before asking, or a supervisor may not have answered."""
    status = plan.status
    noticed = {**termination_notices(facts, plan, world), **world.noticed_nodes()}
    if facts.monitoring.enabled and (facts.track is None or facts.track.step is None):
        # Not training yet (importing, rendezvous, compiling): the notice is handled once
        # steps are seen (a checkpoint before the first step saves nothing).
        return
    seen = set(status.disruption_notices)
    found: dict[str, list[tuple[str, str]]] = {}
    still = False
    # From the few noticed nodes to their pods, not from every pod of the job to its
    # node: this runs on each reconcile of a running job of up to 12,736 pods.
    for node, notice in sorted(noticed.items()):
        key = f"attempt {attempt}: {kind_of(notice)}"
        if key in seen and still:
            continue
        if any(
            p.job_owned
            and p.attempt == attempt
            and p.namespace == facts.namespace
            and p.job_name == facts.name
            for p in world.pods_on_node(node)
        ):
            if key in seen:
                still = True
            else:
                found.setdefault(key, []).append((node, notice))
    if not found:
        if still:
            prefix = f"attempt {attempt}: "
            latest = [n for n in status.disruption_notices if n.startswith(prefix)]
            plan.checkpoint_for = latest[-1:]
        return
    new = list(found)
    status.disruption_notices = [*status.disruption_notices, *new][-MAX_NOTICES:]
    status.checkpoint_requests += 1
    plan.checkpoint_for = new
    plan.event(
        "Normal",
        Reason.CHECKPOINT_REQUESTED,
        f"asking the {facts.total_workers} workers to checkpoint now: "
        + "; ".join(_said(nodes) for nodes in found.values()),
    )


def _said(nodes: list[tuple[str, str]]) -> str:
    """One kind of notice in words: the first node's, and how many more have it."""
    node, notice = nodes[0]
    more = f" (and {len(nodes) - 1} more nodes)" if len(nodes) > 1 else ""
    return f"node {node}: {notice}{more}"
