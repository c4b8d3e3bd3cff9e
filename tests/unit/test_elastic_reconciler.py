"""An elastic job over the in-memory API (tests/unit/fakeapi.py): a slice whose pool
breaks with no spare is dropped, the others train on as a smaller world, and the job
grows back once the pool heals."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakeapi import FakeCluster
from tpu_operator import contract

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")  # v5p-16: 2 hosts of 4 chips


def spec(**extra: Any) -> dict[str, Any]:
    return {
        "slice": {"type": "v5p-16"},
        "numSlices": 3,
        "elastic": {"minSlices": 2},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
        **extra,
    }


def env(pod: dict[str, Any]) -> dict[str, Any]:
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value") for e in worker["env"]}


def running(cluster: FakeCluster) -> None:
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"


def test_a_slice_on_a_broken_pool_is_dropped_and_comes_back_when_it_heals():
    cluster = FakeCluster()
    for pool in ("p0", "p1", "p2"):
        cluster.add_pool(pool, *V5P, hosts=2)
    cluster.apply_job("j", spec())
    cluster.settle()
    running(cluster)
    status = cluster.job("j")["status"]
    assert status["nodePools"] == ["p0", "p1", "p2"] and status["activeSlices"] == 3
    # A VM of slice 1's pool goes NotReady; there is no spare pool.
    node = cluster.pods("j")["j-1-0"]["spec"]["nodeName"]
    cluster.set_node_ready(node, False)
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"], status["restartKind"]) == (
        "Restarting",
        2,
        "Recreate",
    )
    assert status["activeSlices"] == 2
    ((dropped),) = status["droppedSlices"]
    assert dropped["index"] == 1 and "p1" in dropped["reason"]
    assert "SlicesDropped" in cluster.recorded.reasons("j")
    # Slice 1 stops; slices 0 and 2 form the next attempt's world.
    cluster.settle()
    assert cluster.slice("j-1")["spec"]["suspend"] is True
    assert cluster.slice("j-2")["spec"]["worldSlices"] == [0, 2]
    cluster.confirm_deletions()
    cluster.advance(10)  # the restart backoff
    cluster.settle()
    pods = cluster.pods("j")
    assert sorted(pods) == ["j-0-0", "j-0-1", "j-2-0", "j-2-1"]
    wiring = env(pods["j-2-1"])
    assert wiring[contract.ENV_MEGASCALE_NUM_SLICES] == "2"
    assert wiring[contract.ENV_MEGASCALE_SLICE_ID] == "1"
    assert wiring[contract.ENV_PROCESS_ID] == "3"
    assert wiring[contract.ENV_NUM_PROCESSES] == "4"
    assert wiring[contract.ENV_RESTART_ATTEMPT] == "2"
    running(cluster)
    status = cluster.job("j")["status"]
    assert status["ready"] == "4/4" and status["attempt"] == 2
    # Still broken: it stays smaller.
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["attempt"] == 2
    # The pool heals: the job grows back to 3 slices (unsupervised workers are not asked
    # to checkpoint first), not counted against maxRestarts.
    cluster.set_node_ready(node, True)
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"]) == ("Restarting", 3)
    assert status["droppedSlices"] == [] and status["activeSlices"] == 3
    assert status["countedRestarts"] == 0
    assert status["restartsByReason"] == {"NodeLost": 1, "SlicesRestored": 1}
    assert "SlicesRestored" in cluster.recorded.reasons("j")
    cluster.settle()
    assert cluster.slice("j-1")["spec"]["suspend"] is False
    assert "worldSlices" not in cluster.slice("j-2")["spec"]
    cluster.confirm_deletions()
    cluster.advance(30)
    cluster.settle()
    pods = cluster.pods("j")
    assert len(pods) == 6
    assert env(pods["j-2-1"])[contract.ENV_MEGASCALE_NUM_SLICES] == "3"
    assert env(pods["j-2-1"])[contract.ENV_PROCESS_ID] == "5"
    running(cluster)
    assert cluster.job("j")["status"]["ready"] == "6/6"


def test_below_min_slices_the_job_waits_for_the_repair():
    cluster = FakeCluster()
    for pool in ("p0", "p1", "p2"):
        cluster.add_pool(pool, *V5P, hosts=2)
    cluster.apply_job("j", spec(elastic={"minSlices": 3}))
    cluster.settle()
    running(cluster)
    node = cluster.pods("j")["j-1-0"]["spec"]["nodeName"]
    cluster.set_node_ready(node, False)
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2 and status["droppedSlices"] == []
    assert "worldSlices" not in cluster.slice("j-2")["spec"]
    assert "NodePoolUnhealthy" in cluster.recorded.reasons("j")


def test_without_slice_0_the_leader_is_the_first_slice_that_runs():
    """successPolicy LeaderWorker: with slice 0 dropped, worker 0 of slice 1 (the world's
    process 0) ending well ends the job well."""
    cluster = FakeCluster()
    for pool in ("p0", "p1", "p2"):
        cluster.add_pool(pool, *V5P, hosts=2)
    cluster.apply_job("j", spec(successPolicy="LeaderWorker"))
    cluster.settle()
    running(cluster)
    node = cluster.pods("j")["j-0-0"]["spec"]["nodeName"]
    cluster.set_node_ready(node, False)
    cluster.reconcile_job("j")
    assert [d["index"] for d in cluster.job("j")["status"]["droppedSlices"]] == [0]
    cluster.settle()
    cluster.confirm_deletions()
    cluster.advance(10)
    cluster.settle()
    pods = cluster.pods("j")
    assert sorted(pods) == ["j-1-0", "j-1-1", "j-2-0", "j-2-1"]
    leader = env(pods["j-1-0"])
    assert leader[contract.ENV_PROCESS_ID] == "0"
    assert leader[contract.ENV_JAX_COORDINATOR_ADDRESS].startswith("j-1-0.j:")
    running(cluster)
    cluster.exit_pod("j-1-0", 0)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Succeeded"
