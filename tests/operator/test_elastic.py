"""Elastic multislice with real JAX processes: a job of 2 slices and no spare pool loses
a node of slice 0, trains on slice 1 alone from its last checkpoint (slice 1's worker 0
becomes the coordinator and process 0), and grows back to 2 slices once the pool heals,
after asking its workers to checkpoint. The operator is SIGKILLed the moment each decision
is committed (the smaller attempt, the checkpoint request of the grow-back, the full
attempt): each successor converges with no worker pod created twice for one attempt and no
restart counted twice.

Workers run ``tpu-worker demo`` (real multi-process JAX on CPU, under the supervisor) in
run-mode pods of the local cluster. (Two slices, not three: six JAX processes on the CI
machine's two cores take minutes to compile their first step.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from localcluster.testing import wait_until
from tests.chaos.scenario import Recorder
from tests.operator.support import Api, OperatorProcess
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


def committed(
    tpu: Api, namespace: str, name: str, what: str, test: Callable[[dict[str, Any]], object]
) -> dict[str, Any]:
    """The job's status once ``test`` holds of it, polled every 50 ms (to kill the operator
    right after it commits a decision)."""

    def status() -> dict[str, Any] | None:
        found = tpu.status(namespace, name)
        return found if test(found) else None

    return wait_until(
        status,
        timeout=300,
        interval=0.05,
        message=f"TPUJob {namespace}/{name}: {what}",
    )


def restart(operator: OperatorProcess) -> None:
    operator.kill()
    operator.start()


def test_a_job_shrinks_and_grows_back_through_operator_kills(
    tpu, namespace, cluster, running_operator, tpu_pools
):
    log_from = running_operator.log_path.stat().st_size
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
    healed = False
    with Recorder(tpu, namespace) as recorder:
        cluster.agent.make_node_not_ready(node)
        try:
            shrunk = committed(
                tpu, namespace, "elastic", "attempt 2 committed", lambda s: s.get("attempt") == 2
            )
            restart(running_operator)  # killed as the smaller attempt is committed
            status = running_attempt(tpu, namespace, "elastic", 2, timeout=300)
            assert shrunk["droppedSlices"] == status["droppedSlices"], (shrunk, status)
            assert status["activeSlices"] == 1, status
            (dropped,) = status["droppedSlices"]
            assert dropped["index"] == 0 and broken in dropped["reason"], status
            assert status["lastFailure"]["reason"] == "NodeLost"
            assert status["restartKind"] == "Recreate" and status["nodePools"] == first["nodePools"]
            assert (status["restarts"], status["restartsByReason"]) == (1, {"NodeLost": 1})
            names = sorted(p["metadata"]["name"] for p in tpu.pods(namespace))
            assert names == ["elastic-1-0", "elastic-1-1"], names
            # Slice 1 is the world now: its worker 0 is process 0 and the coordinator.
            env = worker_env(tpu, namespace, "elastic-1-0")
            assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("0", "2")
            assert env[contract.ENV_JAX_COORDINATOR_ADDRESS].startswith("elastic-1-0.elastic:")
            assert contract.ENV_MEGASCALE_NUM_SLICES not in env
            # (The SlicesDropped event, posted after the status write, may have died with
            # the operator: tests/unit/policies/test_elastic.py checks it.)
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
            # The pool heals: the job grows back to 2 slices after a checkpoint, the
            # operator killed as it asks for the checkpoint, and as it restarts.
            cluster.agent.heal_node(node)
            healed = True
            asked = committed(
                tpu,
                namespace,
                "elastic",
                "the checkpoint for growing back requested",
                lambda s: s.get("growBack") or s.get("attempt") == 3,
            )
            restart(running_operator)
            committed(
                tpu, namespace, "elastic", "attempt 3 committed", lambda s: s.get("attempt") == 3
            )
            restart(running_operator)
            grown = running_attempt(tpu, namespace, "elastic", 3, timeout=300)
        finally:
            if not healed:
                cluster.agent.heal_node(node)
    assert recorder.snapshots and not recorder.violations, recorder.violations
    assert asked.get("attempt") == 2, asked  # the kill came before the restart
    assert grown["activeSlices"] == 2 and not grown.get("droppedSlices"), grown
    assert grown["restarts"] == 2, grown
    assert grown["restartsByReason"] == {"NodeLost": 1, "SlicesRestored": 1}, grown
    assert grown["countedRestarts"] == 0, grown
    assert grown["checkpointRequests"] == 1, grown
    env = worker_env(tpu, namespace, "elastic-1-1")
    assert env[contract.ENV_MEGASCALE_NUM_SLICES] == "2"
    assert env[contract.ENV_MEGASCALE_SLICE_ID] == "1"
    assert (env[contract.ENV_PROCESS_ID], env[contract.ENV_NUM_PROCESSES]) == ("3", "4")
    # The workers of attempt 2 were asked for the checkpoint (by the operator killed as
    # it committed the request, or by its successor).
    worker_log = cluster.pod_log(namespace, "elastic-1-0", contract.WORKER_CONTAINER).read_text()
    assert "requested of attempt 2" in worker_log, worker_log[-3000:]
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
    log = running_operator.log_path.read_bytes()[log_from:].decode(errors="replace")
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:4000]
