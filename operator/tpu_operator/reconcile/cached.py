"""TPUJobs and TPUSlices as the operator caches them: what of each is kept, and the index
keys each is filed under (``runtime/caches.py`` reads them).

Both kinds have list-and-watch caches of the operator's own (``runtime/listwatch.py``),
as worker pods and TPU nodes do. A shared cluster has thousands of small jobs, and kopf
processes every event of every object in full: a Body wrapper, a per-object stream and
worker task, index and handler calls with their keyword arguments. Profiled with 400 jobs
of a shared cluster's mix starting at once (``bench/load.py``), that machinery was the
largest single share of the operator's CPU, and its cost per pod grew with the number of
jobs (each job's status is written, and comes back as an event, for as long as it
starts). The objects are decoded whole (``json``: their free-form pod templates may hold
integers beyond 64 bits), and kept without what only makes them larger (``snapshot``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpu_operator import contract
from tpu_operator.reconcile.pools import holds_spares, job_pool_records, slice_pool_records
from tpu_operator.runtime.caches import POOL_RECORD, SPARES_HOLDER
from tpu_operator.runtime.listwatch import Keys, Kind
from tpu_operator.runtime.ownership import slice_job_name
from tpu_operator.state.views import shared_copy

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
"""``kubectl apply``'s copy of the whole manifest, as one JSON string: the pod template
again, for every job applied that way. Nothing in the operator reads it."""


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of a TPUJob or TPUSlice (the reconcilers read spec, status, metadata),
    without what only makes a cached body larger: managed fields and kubectl's copy. Its
    strings are shared with the other cached copies (``shared_copy``)."""
    raw: dict[str, Any] = shared_copy({k: v for k, v in body.items() if k != "metadata"})
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    raw["metadata"] = shared_copy(meta)
    return raw


def slice_keys(cached: dict[str, Any]) -> Keys:
    """A TPUSlice's index keys: ("slice", ns, name), ("job", ns, its job) and the pools
    its status or spec records (``reconcile/pools.py``, rule 2)."""
    meta = cached.get("metadata") or {}
    namespace = meta.get("namespace")
    keys: Keys = {("slice", namespace, meta.get("name")): cached}
    job = slice_job_name(cached)
    if job:
        keys[("job", namespace, job)] = cached
    for pool, holder in slice_pool_records(cached).items():
        keys[(POOL_RECORD, pool)] = holder
    return keys


def job_keys(cached: dict[str, Any]) -> Keys:
    """A TPUJob's index keys: ("job", ns, name), the pools its status records and, while
    it names or holds spare pools, ``SPARES_HOLDER``."""
    meta = cached.get("metadata") or {}
    keys: Keys = {("job", meta.get("namespace"), meta.get("name")): cached}
    for pool, holder in job_pool_records(cached).items():
        keys[(POOL_RECORD, pool)] = holder
    if holds_spares(cached):
        keys[SPARES_HOLDER] = cached
    return keys


API = f"/apis/{contract.GROUP}/{contract.VERSION}"
SLICES = Kind("slices", contract.SLICE_PLURAL, True, "", None, snapshot, slice_keys, api=API)
JOBS = Kind("jobs", contract.JOB_PLURAL, True, "", None, snapshot, job_keys, api=API)
