"""The GKE Slice of a TPUSlice on Ironwood dynamic slicing (``placement/dynamic.py``): the
one its pods select, what they wait for, and which Slices the reconciler forms or deletes.

Without Kueue's slice admission check, one Slice per attempt, named for the slice and the
attempt. A slice forming its pods deletes its Slices of other attempts, and forms the
attempt's of free healthy partitions (``dynamic.choose``) when it does not exist; one GKE
could not form is deleted and formed again. A stopping or finished slice deletes all of
its Slices. With that check (``given``), the Slice is the one the job's admission formed
(``gkeSlice``, ``policies/slice_check.py``): the slice waits for it to be Ready and never
forms or deletes one.

Pure: the reconciler (``reconcile/slices.py``) reads the slice's Slices (and, to form one,
every Slice), and does what ``decide`` says only after the status is written: a write that
loses to a concurrent change (409) forms and deletes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tpu_operator.placement.dynamic import Choice, SliceState

RECHECK_SECONDS = 2.0
"""How often a slice waiting for its GKE Slice (not watched) looks at it again."""


def trouble(error: str) -> str:
    """What the pods wait for when the Slices could not be read or written."""
    return f"dynamic slicing: {error} (is the slice controller enabled?)"


@dataclass(frozen=True)
class DynamicFacts:
    """What the slice's GKE Slices are decided from."""

    name: str
    """The Slice of the slice's current attempt."""
    mine: Mapping[str, SliceState]
    """The slice's Slices that exist, by name, and where GKE is with each."""
    release: bool
    """The slice stops or succeeded: none of its Slices is kept."""
    forming: bool
    """The slice would create its attempt's pods now."""
    choice: Choice | None = None
    """The partitions free for the attempt's Slice, read when it does not exist."""
    unread: str = ""
    """Why the Slices could not be read (what the apiserver said); then nothing is done."""
    refused: str = ""
    """Why the last try to form or delete a Slice failed (what the apiserver said): the
    status says it while the slice tries again."""
    given: bool = False
    """The Slice ``name`` is formed by the job's admission (Kueue's slice admission
    check, ``policies/slice_check.py``): the slice waits for it and forms or deletes
    none."""


@dataclass(frozen=True)
class DynamicPlan:
    """What the slice does about its Slices. ``delete`` and ``form`` are done after the
    status is written, never before."""

    gke_slice: str | None = None
    """The Ready Slice the pods select (they are created only then)."""
    waiting_for: str = ""
    """What the pods wait for, for the status ("" when nothing)."""
    delete: tuple[str, ...] = ()
    form: tuple[str, ...] | None = None
    """Partition ids to form the attempt's Slice (``DynamicFacts.name``) of."""
    recheck: float | None = None
    refused: str = ""
    """What the apiserver said at the last try to form or delete one (``DynamicFacts``),
    which this status says: once the act goes through, the next status says what is
    true now."""


def needs_choice(facts: DynamicFacts) -> bool:
    """Whether the attempt's Slice is to be formed (then the reconciler reads every Slice
    and chooses its partitions before ``decide``)."""
    return facts.forming and not facts.release and not facts.given and facts.name not in facts.mine


def decide(facts: DynamicFacts) -> DynamicPlan:
    if facts.unread:
        return DynamicPlan(
            waiting_for=trouble(facts.unread), recheck=RECHECK_SECONDS, refused=facts.refused
        )
    plan = _plan(facts)
    if facts.refused:
        return replace(
            plan,
            gke_slice=None,
            waiting_for=trouble(facts.refused),
            recheck=RECHECK_SECONDS,
            refused=facts.refused,
        )
    return plan


def _plan(facts: DynamicFacts) -> DynamicPlan:
    if facts.given:
        return _given(facts)
    name = facts.name
    delete = tuple(other for other in facts.mine if facts.release or other != name)
    if facts.release or not facts.forming:
        return DynamicPlan(delete=delete)
    current = facts.mine.get(name)
    if current is None:
        choice = facts.choice or Choice(None, "no partition was read")
        if choice.ids is None:
            return DynamicPlan(
                waiting_for=f"waiting for capacity to form a dynamic slice: {choice.message}",
                delete=delete,
                recheck=RECHECK_SECONDS,
            )
        return DynamicPlan(
            waiting_for=f"waiting for GKE's slice controller to form Slice {name} of "
            f"{', '.join(choice.ids)}",
            delete=delete,
            form=choice.ids,
            recheck=RECHECK_SECONDS,
        )
    if current.ready:
        return DynamicPlan(gke_slice=name, delete=delete)
    if current.failed:
        return DynamicPlan(
            waiting_for=f"GKE could not form Slice {name} ({current.reason}: "
            f"{current.message}); forming it again",
            delete=(*delete, name),
            recheck=RECHECK_SECONDS,
        )
    return DynamicPlan(
        waiting_for=f"waiting for GKE's slice controller to form Slice {name} ({current.reason})",
        delete=delete,
        recheck=RECHECK_SECONDS,
    )


def _given(facts: DynamicFacts) -> DynamicPlan:
    """The Slice the admission formed: the pods wait until it is Ready."""
    name = facts.name
    current = facts.mine.get(name)
    if facts.release or not facts.forming:
        return DynamicPlan()
    if current is None:
        return DynamicPlan(
            waiting_for=f"waiting for Slice {name}, which Kueue's slice admission check forms",
            recheck=RECHECK_SECONDS,
        )
    if current.ready:
        return DynamicPlan(gke_slice=name)
    if current.failed:
        return DynamicPlan(
            waiting_for=f"GKE could not form Slice {name} ({current.reason}: "
            f"{current.message}); Kueue places the job again",
            recheck=RECHECK_SECONDS,
        )
    return DynamicPlan(
        waiting_for=f"waiting for GKE's slice controller to form Slice {name} ({current.reason})",
        recheck=RECHECK_SECONDS,
    )
