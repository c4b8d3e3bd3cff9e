"""Elastic multislice with real JAX processes: a job of 3 slices and no spare pool loses
a node of slice 1, trains on slices 0 and 2 from its last checkpoint, and grows back to
3 slices once the pool heals (after asking its workers to checkpoint).

Workers run ``tpu-worker demo`` (real multi-process JAX on CPU, under the supervisor) in
run-mode pods of the local cluster.
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


def processes_of_last_run(cluster, namespace: str, pod: str) -> int | None:
    log = cluster.pod_log(namespace, pod, contract.WORKER_CONTAINER).read_text()
    found = re.findall(r"over (\d+) processes", log)
    return int(found[-1]) if found else None


def test_a_job_trains_on_fewer_slices_while_a_pool_is_broken_and_grows_back(
    tpu, namespace, cluster, running_operator, tpu_pools
):
    tpu_pools(3)  # one per slice: no spare
    manifest, directory = demo_job(
        namespace,
        "elastic",
        "--steps=100000",
        "--batch-size=12",  # a multiple of the data axis of 6 devices (3) and of 4 (2)
        numSlices=3,
        slice={"type": "v4-16"},
        elastic={"minSlices": 2},
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "elastic", 1, timeout=300)
    assert first["activeSlices"] == 3 and not first.get("droppedSlices")
    wait_until(lambda: steps_saved(directory), timeout=180, message="a first checkpoint")
    node = next(p for p in tpu.pods(namespace) if p["metadata"]["name"] == "elastic-1-0")["spec"][
        "nodeName"
    ]
    broken = first["nodePools"][1]
    cluster.agent.make_node_not_ready(node)
    healed = False
    try:
        status = running_attempt(tpu, namespace, "elastic", 2, timeout=300)
        assert status["activeSlices"] == 2, status
        (dropped,) = status["droppedSlices"]
        assert dropped["index"] == 1 and broken in dropped["reason"], status
        assert status["lastFailure"]["reason"] == "NodeLost"
        assert status["restartKind"] == "Recreate" and status["nodePools"] == first["nodePools"]
        names = sorted(p["metadata"]["name"] for p in tpu.pods(namespace))
        assert names == [f"elastic-{s}-{w}" for s in (0, 2) for w in (0, 1)], names
        env = worker_env(tpu, namespace, "elastic-2-1")
        assert env[contract.ENV_MEGASCALE_NUM_SLICES] == "2"
        assert env[contract.ENV_MEGASCALE_SLICE_ID] == "1"
        assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("3", "4")
        events = tpu.wait_events(namespace, "elastic", "SlicesDropped")
        assert "SlicesDropped" in events
        # The smaller world resumed from the checkpoint and trains on: 4 processes.
        saved_before = max(steps_saved(directory))
        wait_until(
            lambda: max(steps_saved(directory)) > saved_before,
            timeout=180,
            message="attempt 2 (2 slices) to save a checkpoint after the one it resumed from",
        )
        assert processes_of_last_run(cluster, namespace, "elastic-0-0") == 4
        log = cluster.pod_log(namespace, "elastic-0-0", contract.WORKER_CONTAINER).read_text()
        assert re.search(r"resumed from checkpoint at step \d+", log), log[-2000:]
        # The pool heals: the job grows back to 3 slices after a checkpoint.
        cluster.agent.heal_node(node)
        healed = True
        grown = running_attempt(tpu, namespace, "elastic", 3, timeout=300)
    finally:
        if not healed:
            cluster.agent.heal_node(node)
    assert grown["activeSlices"] == 3 and not grown.get("droppedSlices"), grown
    assert grown["restartsByReason"].get("SlicesRestored") == 1, grown
    assert grown["countedRestarts"] == 0, grown
    assert grown["checkpointRequests"] >= 1, grown
    env = worker_env(tpu, namespace, "elastic-2-1")
    assert env[contract.ENV_MEGASCALE_NUM_SLICES] == "3"
    assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("5", "6")
    events = tpu.wait_events(namespace, "elastic", "SlicesRestored")
    assert "CheckpointRequested" in events
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=180,
        message="attempt 3 (3 slices again) to save a checkpoint",
    )
    assert processes_of_last_run(cluster, namespace, "elastic-0-0") == 6
    goodput = tpu.status(namespace, "elastic")["goodput"]
    assert goodput["badputSeconds"]["degraded"] > 0, goodput
    assert "Traceback" not in running_operator.tail(400)
