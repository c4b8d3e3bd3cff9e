"""What a job's TPUSlice and a standalone one do differently (reconcile/slice_roles.py),
each role built from a slice of the in-memory API (tests/unit/fakeapi.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.fakeapi import NS, FakeCluster
from tests.unit.test_reconcilers import V5P, job_spec, slice_spec
from tpu_operator.api.slice import TPUSliceSpec, TPUSliceStatus
from tpu_operator.policies.start import POOL_RETRY_SECONDS
from tpu_operator.reconcile.slice_roles import OwnedSlice, SliceRole, StandaloneSlice, role_of

pytestmark = pytest.mark.unit


def role(cluster: FakeCluster, name: str) -> SliceRole:
    found = role_or_none(cluster, name)
    assert found is not None
    return found


def role_or_none(cluster: FakeCluster, name: str) -> SliceRole | None:
    body = cluster.slice(name)
    spec = TPUSliceSpec.model_validate(body["spec"])
    return role_of(cluster.ctx, body, spec, spec.resolve())


def status(cluster: FakeCluster, name: str) -> TPUSliceStatus:
    return TPUSliceStatus.model_validate(cluster.slice(name).get("status") or {})


def test_each_kind_of_slice_gets_its_role():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec())
    cluster.apply_slice("s", slice_spec())
    cluster.settle()
    owned, alone = role(cluster, "j-0"), role(cluster, "s")
    answers: list[tuple[str, Any, Any]] = [
        ("kind", type(owned), type(alone)),
        ("standalone", owned.standalone, alone.standalone),
        ("job name of its pods", owned.job_name, alone.job_name),
        ("pool holder", owned.pool_holder, alone.pool_holder),
        ("pod slice names", owned.pod_slice_names, alone.pod_slice_names),
        (
            "reports its pool while stopping",
            owned.reports_pool_when_stopping,
            alone.reports_pool_when_stopping,
        ),
    ]
    assert answers == [
        ("kind", OwnedSlice, StandaloneSlice),
        ("standalone", False, True),
        ("job name of its pods", "j", "s"),
        ("pool holder", f"TPUJob {NS}/j", f"TPUSlice {NS}/s"),
        ("pod slice names", (), ("s",)),
        ("reports its pool while stopping", True, False),
    ]


def test_a_jobs_slice_takes_attempt_carried_pods_and_supervisor_key_from_its_spec():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec())
    cluster.settle()
    cluster.slice("j-0")["spec"].update(
        attempt=3, notBefore="2030-01-01T00:00:00Z", inPlaceFrom=2, controlKeySecret="key"
    )
    owned = role(cluster, "j-0")
    target, not_before = owned.target_and_not_before(status(cluster, "j-0"))
    assert (target, not_before) == (3, dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    assert (owned.in_place_from, owned.control_secret) == (2, "key")
    assert not owned.needs_pool  # its job places it


def test_a_standalone_slice_takes_its_attempt_from_its_status_and_carries_nothing():
    cluster = FakeCluster()
    cluster.apply_slice("s", slice_spec(inPlaceFrom=1, controlKeySecret="key"))
    cluster.settle()
    cluster.slice("s")["status"].update(phase="Suspended", attempt=4)
    alone = role(cluster, "s")
    assert alone.target_and_not_before(status(cluster, "s")) == (5, None)  # resumed
    assert (alone.in_place_from, alone.control_secret) == (None, None)


def test_only_a_standalone_slice_allocates_a_pool_or_waits_for_one():
    cluster = FakeCluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job("j", job_spec("v5p-16"))
    cluster.settle()
    cluster.apply_slice("s", slice_spec("v5p-16"))
    cluster.settle()
    assert cluster.job("j")["status"]["nodePools"] == ["p1"]
    owned, alone = role(cluster, "j-0"), role(cluster, "s")
    assert owned.pool(status(cluster, "j-0"), stopping=False).name == "p1"
    assert alone.needs_pool
    waiting = alone.pool(TPUSliceStatus(), stopping=False)
    assert (waiting.name, waiting.retry_after) == (None, POOL_RETRY_SECONDS)
    assert waiting.waiting_for
    assert alone.pool(TPUSliceStatus(), stopping=True).name is None  # a stopping one asks none
    cluster.add_pool("p2", *V5P, hosts=2)
    cluster._index()  # the caches as the watches would have them now
    assert alone.pool(TPUSliceStatus(), stopping=False).name == "p2"


def test_a_jobs_slice_whose_job_is_gone_has_no_role():
    """The garbage collector removes it and its pods; nothing reconciles it meanwhile."""
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec())
    cluster.settle()
    assert role_or_none(cluster, "j-0") is not None
    cluster.delete_job("j", collect=False)
    cluster.reconcile_job("j")  # its deletion's event reaches the caches
    assert role_or_none(cluster, "j-0") is None
