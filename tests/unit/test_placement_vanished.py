"""A recorded node pool that loses all its nodes (GKE deleted the pool it created for a
slice, a user deleted a pool, the autoscaler scaled one to zero), and the operator-wide
provisioning default: the reconcilers against the fake API server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakeapi import FakeCluster
from tests.unit.test_reconcilers import (
    SLICE_POOL,
    V5P,
    auto,
    bind_to_claim_pools,
    condition,
    job_spec,
    typed_pool,
    unschedulable,
)
from tpu_operator import cli, contract

pytestmark = pytest.mark.unit


def delete_pool(cluster: FakeCluster, pool: str) -> None:
    """The pool's nodes are deleted, and with them the pods bound to them."""
    nodes = [
        key
        for key, obj in cluster.objects.items()
        if key.startswith("/api/v1/nodes/")
        and obj["metadata"]["labels"].get(contract.NODE_LABEL_NODEPOOL) == pool
    ]
    names = {cluster.objects[key]["metadata"]["name"] for key in nodes}
    for key in nodes:
        cluster.objects.pop(key)
    for key, pod in list(cluster.pods().items()):
        if pod["spec"].get("nodeName") in names:
            cluster._remove(f"/api/v1/namespaces/ml/pods/{key}")


def running_on_claimed_pool(cluster: FakeCluster, pool: str) -> str:
    """Start job j (v5p-16, Auto), let GKE create ``pool`` for its claim; the claim value."""
    cluster.apply_job("j", job_spec("v5p-16", **auto(failurePolicy={"backoffSeconds": 0})))
    cluster.settle()
    (ref,) = cluster.job("j")["status"]["nodePools"]
    typed_pool(cluster, pool, V5P, 2, 4, slice_pool=ref[5:])
    bind_to_claim_pools(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["nodePools"]) == ("Running", [pool])
    return ref[5:]


def test_a_pool_gke_created_that_vanishes_is_asked_for_again_before_the_next_pods():
    cluster = FakeCluster()
    first = running_on_claimed_pool(cluster, "nap-a")

    delete_pool(cluster, "nap-a")  # GKE (or a user) deleted the pool with the slice on it
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2
    (ref,) = status["nodePools"]
    assert ref.startswith("auto:j-0-") and ref[5:] != first
    gone = [m for n, _, r, m in cluster.recorded.events if (n, r) == ("TPUJob/j", "NodePoolGone")]
    assert gone == [
        "slice 0: node pool nap-a has no nodes; GKE deleted it or scaled it to zero; its "
        "pods ask GKE for a new pool"
    ]
    # the pods of attempt 2 ask for the new pool, none is pinned to the vanished one
    pods = cluster.pods("j")
    assert len(pods) == 2
    for pod in pods.values():
        assert pod["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "2"
        assert pod["spec"]["nodeSelector"][SLICE_POOL] == ref[5:]
        assert contract.NODE_LABEL_NODEPOOL not in pod["spec"]["nodeSelector"]
    unschedulable(cluster, "j")
    cluster.settle()
    assert cluster.job("j")["status"]["message"].startswith(
        "attempt 2: waiting for GKE to create node pools: "
    )

    typed_pool(cluster, "nap-b", V5P, 2, 4, slice_pool=ref[5:])
    bind_to_claim_pools(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["nodePools"]) == ("Running", ["nap-b"])
    assert cluster.recorded.reasons("j").count("NodePoolGone") == 1


def test_a_pinned_pool_without_nodes_is_kept_and_the_status_says_so():
    cluster = FakeCluster()
    spec = job_spec("v5p-16", placement={"nodePools": ["mine"], "provisioning": "Auto"})
    cluster.apply_job("j", spec)
    cluster.settle()
    unschedulable(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["nodePools"] == ["mine"]
    assert (
        "slice 0: pinned node pool mine has no nodes; waiting for the cluster autoscaler"
        in (status["message"])
    )
    assert "re-create it or pin another pool in placement.nodePools" in status["message"]
    assert condition(cluster.job("j"), "PodsScheduled")["reason"] == "Unschedulable"
    assert "NodePoolGone" not in cluster.recorded.reasons("j")
    for pod in cluster.pods("j").values():
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] == "mine"


def test_without_provisioning_a_vanished_pool_is_kept_and_the_status_says_what_to_do():
    cluster = FakeCluster()
    cluster.add_pool("p", *V5P, 2)
    cluster.apply_job("j", job_spec("v5p-16", failurePolicy={"backoffSeconds": 0}))
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["nodePools"] == ["p"]
    delete_pool(cluster, "p")
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    unschedulable(cluster, "j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["nodePools"]) == (2, ["p"])
    assert "slice 0: node pool p has no nodes" in status["message"]
    assert "placement.provisioning: Auto lets GKE create a new one" in status["message"]
    assert "NodePoolGone" not in cluster.recorded.reasons("j")


def waiting_or_claimed(cluster: FakeCluster, placement: dict[str, Any] | None) -> list[str]:
    extra = {"placement": placement} if placement is not None else {}
    cluster.apply_job("j", job_spec("v5p-16", **extra))
    cluster.reconcile_job("j")
    return cluster.job("j")["status"].get("nodePools") or []


@pytest.mark.parametrize(
    ("default", "placement", "claims"),
    [
        ("ExistingPools", None, False),
        ("Auto", None, True),
        ("Auto", {"spot": False}, True),
        ("Auto", {"provisioning": "ExistingPools"}, False),
        ("ExistingPools", {"provisioning": "Auto"}, True),
    ],
)
def test_the_operator_default_decides_when_the_job_does_not_say(default, placement, claims):
    cluster = FakeCluster()
    cluster.ctx.default_provisioning = default
    pools = waiting_or_claimed(cluster, placement)
    if claims:
        assert len(pools) == 1 and pools[0].startswith("auto:j-0-")
    else:
        assert pools == []
        message = cluster.job("j")["status"]["message"]
        assert message.startswith("waiting for a free node pool for slice 0")
        assert "placement.provisioning: Auto lets GKE create one" in message


def test_the_default_provisioning_flag_takes_the_api_values_only(capsys):
    parser = cli._parser()
    assert parser.parse_args(["run"]).default_provisioning == "ExistingPools"
    assert parser.parse_args(["run", "--default-provisioning=Auto"]).default_provisioning == "Auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--default-provisioning=auto"])
    assert "invalid choice: 'auto'" in capsys.readouterr().err
