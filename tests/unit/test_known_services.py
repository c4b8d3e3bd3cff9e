"""The operator's headless Services as a listing shows them (``Context.known_services``).

After a restart or a resync the operator lists its Services once instead of having every
owner POST its Service again (409) and GET it to learn that it exists.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakeapi import FakeCluster, run_sync
from tpu_operator.runtime.kube import namespaced

pytestmark = pytest.mark.unit
NS = "ml"


def service(name: str, owner_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [{"kind": "TPUJob", "name": name, "uid": owner_uid}],
        },
        "spec": {"clusterIP": "None"},
    }


def ensure(cluster: FakeCluster, body: dict[str, Any]) -> list[tuple[str, int]]:
    cluster.clear_requests()
    run_sync(cluster.ctx.ensure_service(NS, body))
    return [(r.verb, r.code) for r in cluster.requests]


@pytest.mark.parametrize(
    ("listed", "exists", "expected"),
    [
        # Listed as its owner wants it: nothing to send.
        ([("a", "uid-a")], True, []),
        # Deleted since (not listed): created again.
        ([], False, [("POST", 201)]),
        # Not listed but there (made after the listing, or not labelled): learnt once.
        ([], True, [("POST", 409), ("GET", 200)]),
        # Listed with another owner (a TPUSlice of the same name): looked at again.
        ([("a", "uid-other")], True, [("POST", 409), ("GET", 200)]),
    ],
)
def test_a_listed_service_is_known_and_any_other_is_looked_at(
    listed: list[tuple[str, str]], exists: bool, expected: list[tuple[str, int]]
):
    cluster = FakeCluster()
    if exists:
        cluster.objects[namespaced(NS, "services", "a")] = service("a", "uid-a")
    cluster.ctx.known_services(service(name, uid)["metadata"] for name, uid in listed)
    assert ensure(cluster, service("a", "uid-a")) == expected
    assert ensure(cluster, service("a", "uid-a")) == [], "known from then on"


def test_a_listing_forgets_conflicts_so_they_are_looked_at_again():
    cluster = FakeCluster()
    cluster.objects[namespaced(NS, "services", "a")] = service("a", "uid-slice")
    ensure(cluster, service("a", "uid-job"))
    assert "belongs to TPUJob a" in cluster.ctx.service_conflict(NS, "a", "uid-job")
    cluster.ctx.known_services([service("a", "uid-slice")["metadata"]])
    assert cluster.ctx.service_conflict(NS, "a", "uid-job") == ""
    assert ensure(cluster, service("a", "uid-job")) == [("POST", 409), ("GET", 200)]
