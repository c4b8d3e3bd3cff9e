"""Elastic multislice with real JAX processes: a job of 2 slices and no spare pool loses
a node of slice 0, trains on slice 1 alone from its last checkpoint (slice 1's worker 0
becomes the coordinator and process 0), and grows back to 2 slices once the pool heals,
after asking its workers to checkpoint.

Workers run ``tpu-worker demo`` (real multi-process JAX on CPU, under the supervisor) in
run-mode pods of the local cluster. (Two slices, not three: six JAX processes on the CI
machine's two cores take minutes to compile their first step.)
"""

from __future__ import annotations

import re

import pytest

from localcluster.testing import wait_until
from tests.operator.test_inplace import demo_job, running_attempt, steps_saved
from tpu_operator import contract

pytestmark = pytest.mark.integration


def worker_env(tpu, namespace: str, pod: str) -> dict[str, str]:
    (body,) = [p for p in tpu.pods(namespace) if p["metadata"]["name"] == pod]
    worker = next(c for c in body["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", "") for e in worker["env"]}


def last_run(cluster, namespace: str, pod: str) -> str:
    """The worker log of ``pod`` from its training process's last start."""
    log = cluster.pod_log(namespace, pod, contract.WORKER_CONTAINER).read_text()
    return log[log.rfind("joining JAX distributed system") :]


def test_a_job_trains_on_fewer_slices_while_a_pool_is_broken_and_grows_back(
    tpu, namespace, cluster, running_operator, tpu_pools
):
    tpu_pools(2)  # one per slice: no spare
    manifest, directory = demo_job(
        namespace,
        "elastic",
        "--steps=100000",
        numSlices=2,
        slice={"type": "v4-16"},
        elastic={"minSlices": 1},
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "elastic", 1, timeout=300)
    assert first["activeSlices"] == 2 and not first.get("droppedSlices")
    wait_until(lambda: steps_saved(directory), timeout=300, message="a first checkpoint")
    node = next(p for p in tpu.pods(namespace) if p["metadata"]["name"] == "elastic-0-0")["spec"][
        "nodeName"
    ]
    broken = first["nodePools"][0]
    cluster.agent.make_node_not_ready(node)
    healed = False
    try:
        status = running_attempt(tpu, namespace, "elastic", 2, timeout=300)
        assert status["activeSlices"] == 1, status
        (dropped,) = status["droppedSlices"]
        assert dropped["index"] == 0 and broken in dropped["reason"], status
        assert status["lastFailure"]["reason"] == "NodeLost"
        assert status["restartKind"] == "Recreate" and status["nodePools"] == first["nodePools"]
        names = sorted(p["metadata"]["name"] for p in tpu.pods(namespace))
        assert names == ["elastic-1-0", "elastic-1-1"], names
        # Slice 1 is the world now: its worker 0 is process 0 and the coordinator.
        env = worker_env(tpu, namespace, "elastic-1-0")
        assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("0", "2")
        assert env[contract.ENV_JAX_COORDINATOR_ADDRESS].startswith("elastic-1-0.elastic:")
        assert contract.ENV_MEGASCALE_NUM_SLICES not in env
        assert "SlicesDropped" in tpu.wait_events(namespace, "elastic", "SlicesDropped")
        # The smaller world resumed from the checkpoint and trains on: 2 processes.
        saved_before = max(steps_saved(directory))
        wait_until(
            lambda: max(steps_saved(directory)) > saved_before,
            timeout=300,
            message="attempt 2 (1 slice) to save a checkpoint after the one it resumed from",
        )
        run = last_run(cluster, namespace, "elastic-1-0")
        assert "over 2 processes" in run, run[-3000:]
        assert re.search(r"resumed from checkpoint at step \d+", run), run[-3000:]
        # The pool heals: the job grows back to 2 slices after a checkpoint.
        cluster.agent.heal_node(node)
        healed = True
        grown = running_attempt(tpu, namespace, "elastic", 3, timeout=300)
    finally:
        if not healed:
            cluster.agent.heal_node(node)
    assert grown["activeSlices"] == 2 and not grown.get("droppedSlices"), grown
    assert grown["restartsByReason"].get("SlicesRestored") == 1, grown
    assert grown["countedRestarts"] == 0, grown
    assert grown["checkpointRequests"] >= 1, grown
    env = worker_env(tpu, namespace, "elastic-1-1")
    assert env[contract.ENV_MEGASCALE_NUM_SLICES] == "2"
    assert env[contract.ENV_MEGASCALE_SLICE_ID] == "1"
    assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("3", "4")
    events = tpu.wait_events(namespace, "elastic", "SlicesRestored", "CheckpointRequested")
    assert "SlicesRestored" in events
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=300,
        message="attempt 3 (2 slices again) to save a checkpoint",
    )
    run = last_run(cluster, namespace, "elastic-0-0")
    assert "over 4 processes" in run and "resumed from checkpoint" in run, run[-3000:]
    goodput = tpu.status(namespace, "elastic")["goodput"]
    assert goodput["badputSeconds"]["degraded"] > 0, goodput
    assert "Traceback" not in running_operator.tail(400)
