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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tpu_operator import contract
from tpu_operator.state.views import FOREIGN, ORPHAN, OWN

REMEMBERED_SECONDS = 3600.0
"""How long a deleted TPUSlice's UID is remembered (as ``caches.TOMBSTONE_TTL``)."""

SliceRecord = tuple[str, str, str | None]
"""A TPUSlice's namespace, name and controlling TPUJob (None: a standalone slice)."""


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
        """A TPUSlice was listed or changed; True if its UID is new here."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return False
        record = (meta.get("namespace") or "", meta.get("name") or "", slice_job_name(body))
        new = uid not in self._live
        self._live[uid] = record
        self._gone.pop(uid, None)
        return new

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
        slice_namespace, name, job = record
        if (slice_namespace, name) != (namespace, slice_name):
            return FOREIGN
        return OWN if job_name == (job if job is not None else name) else FOREIGN


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
