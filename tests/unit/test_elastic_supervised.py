"""An elastic job with supervised workers over the in-memory API: growing back asks
every worker to checkpoint first, and restarts once the checkpoint had its time."""

from __future__ import annotations

import pytest

from tests.unit.fakeapi import FakeCluster
from tests.unit.test_inplace_reconciler import (
    V5P,
    Checkpoints,
    job_spec,
    start_processes,
)
from tpu_operator.reconcile.supervisors import Supervisors

pytestmark = pytest.mark.unit


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
