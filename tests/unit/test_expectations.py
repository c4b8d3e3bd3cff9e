"""Created-pod expectations: a created pod is not created again until the cache shows it."""

from __future__ import annotations

import pytest

from tests.unit.fakeapi import ManualClock
from tpu_operator.reconcile.expectations import CreatedPods, DeletedPods

pytestmark = pytest.mark.unit
KEY = ("ns", "train-0")


def test_a_created_pod_is_awaited_until_the_cache_shows_it():
    pods = CreatedPods(ttl=30, clock=ManualClock(50.0))
    pods.created(KEY, "train-0-3", 1)
    assert pods.awaited(KEY, "train-0-3", 1)
    assert not pods.awaited(KEY, "train-0-3", 2)  # another attempt's pod of the same name
    assert not pods.awaited(("ns", "other-0"), "train-0-3", 1)
    pods.observe(KEY, [("train-0-3", 1)])
    assert not pods.awaited(KEY, "train-0-3", 1)


def test_an_expectation_expires_so_a_pod_deleted_unseen_is_created_again():
    clock = ManualClock(50.0)
    pods = CreatedPods(ttl=30, clock=clock)
    pods.created(KEY, "train-0-0", 1)
    clock.now += 29
    pods.observe(KEY, [])
    assert pods.awaited(KEY, "train-0-0", 1)
    clock.now += 2
    pods.observe(KEY, [])
    assert not pods.awaited(KEY, "train-0-0", 1)


def test_forgetting_a_slice_drops_its_expectations():
    pods = CreatedPods()
    pods.created(KEY, "train-0-0", 1)
    pods.forget(KEY)
    assert not pods.awaited(KEY, "train-0-0", 1)


def test_a_requested_deletion_is_awaited_until_it_expires():
    clock = ManualClock(50.0)
    deleted = DeletedPods(ttl=30, clock=clock)
    deleted.requested("uid-1")
    assert deleted.awaited("uid-1") and not deleted.awaited("uid-2")
    clock.now += 31
    assert not deleted.awaited("uid-1")
