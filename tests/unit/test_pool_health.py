"""Which of a job's recorded node pools are unhealthy (``reconcile/pools.unhealthy``), read
from the nodes as the watches have them."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.unit.fakeapi import FakeCluster
from tpu_operator import contract
from tpu_operator.reconcile.pools import unhealthy

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")  # v5p-16: 2 hosts of 4 chips


def ending(cluster: FakeCluster, names: list[str], at: dt.datetime) -> None:
    for name in names:
        node = cluster.objects[f"/api/v1/nodes/{name}"]
        node["metadata"]["annotations"] = {
            contract.NODE_ANNOTATION_TERMINATION: at.strftime("%Y-%m-%dT%H:%M:%SZ")
        }


@pytest.mark.parametrize(
    ("ends_in", "why"),
    [
        (None, None),  # no run duration
        (600, None),  # flex-start VMs that run on
        (-1, "p1 is taken back by GKE (its VMs' run duration ended)"),
    ],
)
def test_a_pool_whose_run_duration_ended_is_unhealthy(ends_in, why):
    cluster = FakeCluster()
    names = cluster.add_pool("p1", *V5P, hosts=2)
    if ends_in is not None:
        ending(cluster, names, cluster.now + dt.timedelta(seconds=ends_in))
    cluster._index()
    assert unhealthy(cluster.ctx, ["p1"], 2) == ({0: why} if why else {})


def test_not_ready_vms_and_missing_vms_are_said_first():
    cluster = FakeCluster()
    names = cluster.add_pool("p1", *V5P, hosts=2)
    ending(cluster, names, cluster.now - dt.timedelta(seconds=5))
    cluster.set_node_ready(names[0], False)
    cluster._index()
    assert unhealthy(cluster.ctx, ["p1"], 2) == {0: "p1 has 1 of its 2 VMs not ready or cordoned"}
