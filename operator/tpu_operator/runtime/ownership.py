"""Which worker pods are the operator's: TPUSlices by UID, and pods told apart by them.

Anyone who can create pods in a watched namespace can give one the operator's labels. A
pod is the operator's worker (``state.views.OWN``) only if its controller owner reference
names a TPUSlice the operator knows, by UID, and its labels agree with that slice: its
namespace and slice name, and its job (the slice's controlling TPUJob) or, for a
standalone slice, the slice's own name. This is the Job controller's rule: labels select,
the controller reference decides. Everything else is ``FOREIGN``: it is not counted in a
gang, holds no pool, is never stopped, deleted or sent a control request, and leaves no
tombstone; or ``ORPHAN``: a pod of a TPUSlice the operator does not know that is being
deleted (its slice was deleted before this process started, and the garbage collector is
removing it), which holds its pool until it is gone and nothing else.

Deleted slices are remembered for ``REMEMBERED_SECONDS``: their pods, which the garbage
collector deletes after them, stay the operator's while they stop. The pod watch and
kopf's TPUSlice watch are separate streams, so a pod may be seen before its slice (a
standby, or the first listings after a start): it is filed as foreign under its owner's
UID, and filed again as the operator's when the slice arrives (``Runtime.slice_known``).

The same record tells which attempt a slice's pods belong to: a TPUJob that restarts in
place carries a slice's pods into its next attempt by writing it once on the slice
(``spec.attempt`` and ``spec.inPlaceFrom``), not on each pod. A pod's view takes its
attempt from here (``carried``: ``state.views.carried_attempt``), and its pods are filed
again whenever that record changes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpu_operator import contract
from tpu_operator.state.views import FOREIGN, ORPHAN, OWN, PodView, carried_attempt

REMEMBERED_SECONDS = 3600.0
"""How long a deleted TPUSlice's UID is remembered (as ``caches.TOMBSTONE_TTL``)."""

SliceRecord = tuple[str, str, str | None, int, int | None]
"""A TPUSlice's namespace, name, controlling TPUJob (None: a standalone slice), and for a
job's slice its attempt and ``inPlaceFrom`` (the attempts whose pods it carries in place)."""


class SliceOwners:
    """The TPUSlices the operator knows by UID (and those deleted within ``ttl``)."""

    def __init__(
        self, ttl: float = REMEMBERED_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._live: dict[str, SliceRecord] = {}
        self._gone: dict[str, tuple[SliceRecord, float]] = {}

    def known(self, body: Mapping[str, Any]) -> bool:
        """A TPUSlice was listed or changed; True if its UID is new here or the attempt
        its pods belong to changed (its pods are then filed again)."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return False
        job = slice_job_name(body)
        spec = body.get("spec") or {}
        attempt, carried_from = 0, None
        if job is not None:
            attempt = _int(spec.get("attempt"), 0)
            carried_from = spec.get("inPlaceFrom")
            carried_from = None if carried_from is None else _int(carried_from, None)
        record = (meta.get("namespace") or "", meta.get("name") or "", job, attempt, carried_from)
        changed = self._live.get(uid) != record
        self._live[uid] = record
        self._gone.pop(uid, None)
        return changed

    def gone(self, uid: str) -> None:
        """A TPUSlice was deleted: its pods stay the operator's for ``ttl`` while they go."""
        record = self._live.pop(uid, None)
        if record is not None:
            self._gone[uid] = (record, self._clock())

    def live_uids(self) -> set[str]:
        """The UIDs of the TPUSlices known to exist."""
        return set(self._live)

    def prune(self) -> None:
        cutoff = self._clock() - self.ttl
        for uid in [u for u, (_, at) in self._gone.items() if at < cutoff]:
            del self._gone[uid]

    def ownership(
        self, owner: str | None, namespace: str, slice_name: str, job_name: str, deleting: bool
    ) -> str:
        """``OWN``, ``ORPHAN`` or ``FOREIGN`` for a pod (``state.views.Trusts``)."""
        record = self._live.get(owner) if owner else None
        if record is None and owner:
            gone = self._gone.get(owner)
            record = gone[0] if gone is not None else None
        if record is None:
            return ORPHAN if owner and deleting else FOREIGN
        slice_namespace, name, job, _, _ = record
        if (slice_namespace, name) != (namespace, slice_name):
            return FOREIGN
        return OWN if job_name == (job if job is not None else name) else FOREIGN

    def carried(self, owner: str | None, label: int) -> int:
        """The attempt a pod of the slice with UID ``owner`` belongs to, given its label's
        (``state.views.Carries``)."""
        record = self._live.get(owner) if owner else None
        if record is None and owner:
            gone = self._gone.get(owner)
            record = gone[0] if gone is not None else None
        if record is None:
            return label
        return carried_attempt(label, record[3], record[4])


def _int(value: object, default: int | None) -> Any:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def slice_job_name(body: Mapping[str, Any]) -> str | None:
    """The TPUJob that owns a TPUSlice (from its controller owner reference), if any."""
    owner = slice_job(body)
    return owner[0] if owner is not None else None


def slice_job(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """Name and UID of the TPUJob that owns a TPUSlice (its controller owner reference)."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == contract.JOB_KIND and ref.get("controller"):
            return ref.get("name"), str(ref.get("uid", ""))
    return None


def owned_by(job: Mapping[str, Any] | None, slice_body: Mapping[str, Any]) -> bool:
    """Whether ``job`` (a cached TPUJob) exists, is not being deleted and is the TPUJob the
    slice's controller owner reference names, by UID (a job deleted and created again
    under the same name is another job)."""
    if job is None:
        return False
    meta = job.get("metadata") or {}
    owner = slice_job(slice_body)
    return (
        owner is not None
        and not meta.get("deletionTimestamp")
        and owner[0] == meta.get("name")
        and owner[1] == meta.get("uid")
    )


def refile(view: PodView, owners: SliceOwners) -> PodView:
    """``view`` as its slice's record now has it (whose it is, which attempt it belongs
    to); the same object when nothing changed."""
    ownership = owners.ownership(
        view.owner, view.namespace, view.slice_name, view.job_name, view.deleting
    )
    label = view.label_attempt if view.label_attempt >= 0 else view.attempt
    attempt = owners.carried(view.owner, label) if ownership == OWN else label
    if ownership == view.ownership and attempt == view.attempt:
        return view
    return dataclasses.replace(
        view,
        ownership=ownership,
        attempt=attempt,
        label_attempt=label if label != attempt else -1,
    )
