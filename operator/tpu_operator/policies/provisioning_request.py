"""The ProvisioningRequest of a slice on queued provisioning outside Kueue: which request
its pods consume, what the slice makes or withdraws, and what its status says.

A request is made while the slice's pool is still to be created by GKE (a claim): one per
try, named for the slice, the attempt and the try (``placement/capacity.request_name``),
so that an operator restarted at any point finds the request it made rather than making a
second. A request that failed, or whose capacity expired or was revoked before every pod
was scheduled, ends the try: the next try's number is written to the status first, and
the request made on a later reconcile (after a backoff); pods still waiting are moved to
it. A slice whose capacity is no longer queued provisioning (its job fell back to another
kind) withdraws the request it made, so that no VMs are booked for pods that no longer
come.

Pure, in two steps: ``to_read`` names the request the reconciler looks at (one GET), and
``decide`` says, from what it found, what the status records and what the reconciler
makes, withdraws and moves. The reconciler (``reconcile/slices.py``) does all of that
only after the status is written: a write that loses to a concurrent change (409) makes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpu_operator.placement.capacity import RequestState, request_name
from tpu_operator.state.views import PodView

POLL_SECONDS = 5.0
"""How often a slice looks at the ProvisioningRequest it waits for (one GET)."""
RETRY_SECONDS = 10.0
RETRY_MAX = 600.0
"""Backoff before the next request after one failed or expired (doubling per try)."""


def words(kind: str, message: str) -> str:
    """A request's state for the status: its kind, and the autoscaler's message."""
    return f"{kind}: {message}" if message and message != kind else kind


@dataclass(frozen=True)
class RequestFacts:
    """What the slice's request is decided from."""

    slice_name: str
    queued: bool
    """The slice's capacity is queued provisioning."""
    kueue_made: bool
    """Kueue made the request its pods consume (the template carries its annotation)."""
    stopping: bool
    attempt: int
    """The attempt the slice runs (0: not started)."""
    recorded: str | None
    """The request the slice's status names (``status.provisioningRequest``)."""
    recorded_state: str
    """``status.provisioningState``."""
    tries: int
    """Requests that ended for this attempt so far (0 for a new attempt)."""
    claim: bool
    """The slice's pool is still to be created by GKE."""
    hosts: int
    to_create: bool
    """Pods of the attempt are still to be created."""
    pods: Sequence[PodView] = ()
    """The slice's pods (the attempt's decide whether its capacity was taken)."""


@dataclass(frozen=True)
class RequestPlan:
    """What the slice does about its request. ``make``, ``withdraw`` and ``move`` are
    done after the status is written, never before."""

    consume: str | None = None
    """The request the slice's pods consume (``CapacityMode.provisioning_request``)."""
    recorded: tuple[str, int, str] | None = None
    """What the status records: (request, tries, its state in words)."""
    withdraw: str | None = None
    """Delete this request and its PodTemplate (the status forgets it)."""
    make: str | None = None
    """Create this request and its PodTemplate (an existing one is kept)."""
    move: tuple[str, ...] = ()
    """Pods (names) still waiting that are pointed at ``consume``."""
    failed: str = ""
    """A ``ProvisioningFailed`` event's message: the try ended."""
    recheck: float | None = None


def name(facts: RequestFacts) -> str:
    """The request of the slice's current attempt and try."""
    return request_name(facts.slice_name, facts.attempt, facts.tries)


def to_read(facts: RequestFacts) -> str | None:
    """The request the reconciler reads (one GET) before ``decide``, if any."""
    if not facts.queued or facts.kueue_made or facts.stopping or not facts.attempt:
        return None
    current = name(facts)
    if facts.claim:
        return current
    # The pool exists: the pods select it by name. The request's last word is read once
    # more, for the status (until it said Provisioned).
    if facts.recorded == current and not facts.recorded_state.startswith("Provisioned"):
        return current
    return None


def decide(facts: RequestFacts, found: tuple[RequestState, str] | None) -> RequestPlan:
    """What the slice does about its request, given what ``to_read`` found: its state and
    the autoscaler's message (``placement/capacity.request_state``), None when it does
    not exist (or nothing was read)."""
    withdraw = None
    if facts.recorded and not facts.queued and not facts.kueue_made:
        withdraw = facts.recorded
    read = to_read(facts)
    if read is None:
        return RequestPlan(withdraw=withdraw)
    kind, message = found if found is not None else ("Pending", "")
    if not facts.claim:
        return RequestPlan(recorded=(read, facts.tries, words(kind, message)))
    current = [p for p in facts.pods if p.attempt == facts.attempt and not p.deleting]
    scheduled = len(current) == facts.hosts and all(p.node for p in current)
    make = None
    if found is None:
        if facts.to_create or current:
            make = read
    elif kind == "Failed" or (kind in ("BookingExpired", "Revoked") and not scheduled):
        backoff = min(RETRY_SECONDS * 2**facts.tries, RETRY_MAX)
        return RequestPlan(
            consume=read,
            recorded=(read, facts.tries + 1, words(kind, message)),
            failed=f"ProvisioningRequest {read}: {kind}: {message}; asking again in "
            f"{backoff:.0f} s",
            recheck=backoff,
        )
    moved = tuple(p.name for p in current if p.consumes != read and not p.node)
    waiting = kind not in ("Provisioned",) or not scheduled
    return RequestPlan(
        consume=read,
        recorded=(read, facts.tries, words(kind, message)),
        make=make,
        move=moved,
        recheck=POLL_SECONDS if waiting else None,
    )
