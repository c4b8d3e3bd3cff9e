"""An elastic job with supervised workers over the in-memory API: growing back asks
every worker to checkpoint first (again, under the same id, while the checkpoint is not
written and some worker was not asked: the operator that committed the request died
before asking, or a supervisor did not answer), and restarts once the checkpoint had its
time."""

from __future__ import annotations

import pytest

from tests.unit.fakeapi import FakeCluster
from tests.unit.test_inplace_reconciler import (
    V5P,
    Checkpoints,
    Dying,
    Killed,
    job_spec,
    start_processes,
    supervised,
)
from tpu_operator.policies import elastic
from tpu_operator.reconcile.supervisors import Supervisors

pytestmark = pytest.mark.unit


def degraded_job(cluster: FakeCluster) -> tuple[Dying, str]:
    """A 3-slice elastic job running as attempt 2 without slice 1 (a node of its pool
    NotReady); the channel and that node."""
    channel = supervised(cluster)
    for index in range(3):
        cluster.add_pool(f"p{index}", *V5P, hosts=2)
    spec = job_spec(monitoring={"enabled": False})
    cluster.apply_job("j", {**spec, "numSlices": 3, "elastic": {"minSlices": 2}})
    cluster.settle()
    start_processes(cluster, channel, 1)
    cluster.settle()
    node = cluster.pods("j")["j-1-0"]["spec"]["nodeName"]
    cluster.set_node_ready(node, False)
    cluster.advance(1)
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    start_processes(cluster, channel, 2)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"], status["activeSlices"]) == ("Running", 2, 2)
    return channel, node


@pytest.mark.parametrize("lost", ["operator killed before asking", "a worker unreachable"])
def test_a_checkpoint_request_not_delivered_is_sent_again_while_growing_back(lost):
    cluster = FakeCluster()
    channel, node = degraded_job(cluster)
    cluster.set_node_ready(node, True)
    missed = cluster.pods("j")["j-2-1"]["status"]["podIP"]
    cluster.advance(15)
    if lost == "operator killed before asking":
        # The request is committed, and the operator dies as it acts on it.
        channel.killing = True
        with pytest.raises(Killed):
            cluster.reconcile_job("j")
        assert channel.asked == []
    else:
        channel.unreachable.add(missed)
        cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["checkpointRequests"]) == (2, 1)
    assert status["growBack"]["requestedAt"]
    if lost == "operator killed before asking":
        processes = channel.processes
        channel = supervised(cluster)  # its successor, to the same supervisors
        channel.processes = processes
        asked_before = 0
    else:
        assert len(channel.asked) == 3 and missed not in {ip for ip, _ in channel.asked}
        channel.unreachable.clear()
        asked_before = 3
    cluster.advance(2)
    cluster.settle()
    # Every worker is asked, once, under one id; the request is counted (and said) once.
    asked = channel.asked[asked_before:]
    assert len(asked) == 4 - asked_before and len({r for _, r in channel.asked}) == 1
    assert sorted(ip for ip, _ in channel.asked) == sorted(
        p["status"]["podIP"] for p in cluster.pods("j").values()
    )
    cluster.advance(2)
    cluster.settle()
    assert len(channel.asked) == 4
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["checkpointRequests"]) == (2, 1)
    assert cluster.recorded.reasons("j").count("CheckpointRequested") == 1
    # Then the restart on every slice, as when the first request reached every worker.
    cluster.advance(elastic.CHECKPOINT_WAIT_SECONDS)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["activeSlices"], status["droppedSlices"]) == (3, 3, [])
    assert status["restartsByReason"] == {"NodeLost": 1, "SlicesRestored": 1}


def test_growing_back_asks_for_a_checkpoint_then_restarts_on_every_slice():
    cluster = FakeCluster()
    channel = Checkpoints(cluster)
    cluster.ctx.supervisors = Supervisors(
        channel,  # type: ignore[arg-type]
        cluster,  # type: ignore[arg-type]
        clock=lambda: cluster.monotonic,
    )
    for index in range(3):
        cluster.add_pool(f"p{index}", *V5P, hosts=2)
    spec = job_spec(monitoring={"enabled": False})
    cluster.apply_job("j", {**spec, "numSlices": 3, "elastic": {"minSlices": 2}})
    cluster.settle()
    start_processes(cluster, channel, 1)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    node = cluster.pods("j")["j-1-0"]["spec"]["nodeName"]
    cluster.set_node_ready(node, False)
    cluster.advance(1)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"], status["activeSlices"]) == (
        2,
        "Recreate",
        2,
    )
    cluster.confirm_deletions()
    cluster.settle()
    assert sorted(cluster.pods("j")) == ["j-0-0", "j-0-1", "j-2-0", "j-2-1"]
    start_processes(cluster, channel, 2)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    # The pool heals: every running worker is asked to checkpoint, nothing restarts yet.
    cluster.set_node_ready(node, True)
    cluster.advance(15)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"]) == ("Running", 2)
    assert status["checkpointRequests"] == 1 and status["growBack"]["requestedAt"]
    assert len(channel.asked) == 4 and len({r for _, r in channel.asked}) == 1
    assert cluster.recorded.reasons("j").count("CheckpointRequested") == 1
    # Without progress figures the checkpoint gets 60 s; then all 3 slices run again.
    cluster.advance(30)
    cluster.settle()
    assert cluster.job("j")["status"]["attempt"] == 2
    cluster.advance(31)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["activeSlices"], status["droppedSlices"]) == (3, 3, [])
    assert status["countedRestarts"] == 0 and "growBack" not in status
    assert len(channel.asked) == 4  # asked once
    assert "SlicesRestored" in cluster.recorded.reasons("j")
