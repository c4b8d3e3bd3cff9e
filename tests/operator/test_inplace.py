"""In-place gang restarts with real JAX processes: the supervisors in the worker pods
restart the training processes in the pods the job already has.

Workers run ``tpu-worker demo`` (real multi-process JAX on CPU) in run-mode pods of the
local cluster, whose node agent runs the readiness probe the operator gives supervised
containers. Faults come from the demo's hooks, in the first attempt only.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from localcluster.testing import wait_until
from tests.operator.support import Api
from tpu_operator import contract
from tpu_operator.state.views import MAINTENANCE_TIME_LABEL
from tpu_worker.demo import checkpoint

pytestmark = pytest.mark.integration
CHECKPOINTS = Path("/var/tmp/tpu-operator-tests/inplace")


def demo_job(namespace: str, name: str, *args: str, env: dict[str, str] | None = None, **spec):
    """A 2-host v5p job running the demo under the supervisor, checkpointing every 5 steps."""
    directory = CHECKPOINTS / namespace / name
    shutil.rmtree(directory, ignore_errors=True)
    worker = {
        "name": "worker",
        "image": "unused.local/worker",
        "command": [
            "tpu-worker",
            "demo",
            "--log-every=10",
            f"--checkpoint-dir={directory}",
            "--checkpoint-every=5",
            "--step-sleep=0.2",
            *args,
        ],
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "slice": {"type": "v5p-16"},
            "template": {"spec": {"terminationGracePeriodSeconds": 10, "containers": [worker]}},
            "failurePolicy": {"backoffSeconds": 0, "maxRestarts": 3},
            **spec,
        },
    }, directory


def exits_once(*, step: int, process: int) -> dict[str, str]:
    """Demo env: global process ``process`` exits 1 before ``step``, in attempt 1 only."""
    return {
        contract.ENV_DEMO_EXIT_AT_STEP: str(step),
        contract.ENV_DEMO_EXIT_PROCESSES: str(process),
        contract.ENV_DEMO_FAULT_ATTEMPTS: "1",
    }


def identities(tpu: Api, namespace: str) -> dict[str, tuple[str, str]]:
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], p["status"].get("podIP", ""))
        for p in tpu.pods(namespace)
    }


def steps_saved(directory: Path) -> list[int]:
    return checkpoint.saved_steps(directory)


def running_attempt(tpu: Api, namespace: str, name: str, attempt: int, timeout: float = 180):
    return wait_until(
        lambda: (
            (s := tpu.status(namespace, name)).get("phase") == "Running"
            and s.get("attempt") == attempt
            and s
        ),
        timeout=timeout,
        message=f"TPUJob {namespace}/{name} Running as attempt {attempt}",
    )


def test_a_worker_exit_restarts_every_process_in_the_same_pods(
    tpu, namespace, cluster, running_operator
):
    manifest, directory = demo_job(
        namespace,
        "inplace",
        "--steps=100000",
        env=exits_once(step=12, process=1),
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "inplace", 1)
    assert first["restarts"] == 0
    before = identities(tpu, namespace)
    pod = tpu.pods(namespace)[0]
    assert pod["metadata"]["annotations"][contract.ANNOTATION_SUPERVISED] == "true"
    status = running_attempt(tpu, namespace, "inplace", 2)
    assert status["restartKind"] == "InPlace"
    assert (status["restarts"], status["countedRestarts"], status["inPlaceRestarts"]) == (1, 1, 1)
    failure = status["lastFailure"]
    assert (failure["reason"], failure["exitCode"], failure["pod"]) == ("Failed", 1, "inplace-0-1")
    assert identities(tpu, namespace) == before, "the pods (UIDs, IPs) must be the same"
    # Carried into attempt 2 by their slice's record; no pod is written to (each keeps the
    # attempt it was created for).
    assert {
        p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in tpu.pods(namespace)
    } == {"1"}
    assert [
        (s["spec"]["attempt"], s["spec"].get("inPlaceFrom")) for s in tpu.slices(namespace)
    ] == [(2, 1)]
    events = tpu.wait_events(namespace, "inplace", "Restarting")
    assert "Restarting" in events
    # attempt 2 rendezvoused again, resumed from a checkpoint and trains on
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=120,
        message="attempt 2 to save a checkpoint after the one it resumed from",
    )
    # process 0 restores: its container log holds both attempts (one supervisor)
    log = cluster.pod_log(namespace, "inplace-0-0", contract.WORKER_CONTAINER)
    resumed = re.findall(r"resumed from checkpoint at step (\d+)", log.read_text())
    assert len(resumed) == 1 and int(resumed[0]) >= 5, resumed  # a checkpoint before step 12


def test_a_request_without_the_jobs_key_is_refused(tpu, namespace, running_operator):
    manifest, _ = demo_job(namespace, "guarded", "--steps=100000")
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "guarded", 1)
    ip = tpu.pods(namespace)[0]["status"]["podIP"]
    base = f"http://{ip}:{contract.DEFAULT_CONTROL_PORT}"
    for path, body in (("/v1/stop", {"attempt": 1, "grace_seconds": 1}), ("/v1/status", None)):
        request = urllib.request.Request(
            base + path,
            data=json.dumps(body).encode() if body is not None else None,
            method="POST" if body is not None else "GET",
            headers={"Authorization": "Bearer guessed"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
    with urllib.request.urlopen(base + "/readyz", timeout=5) as ready:
        assert ready.status == 200  # readiness is public and says nothing else
    time.sleep(2)
    status = tpu.status(namespace, "guarded")
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Running", 1, 0)


def test_a_hung_worker_is_stalled_and_restarted_in_place(tpu, namespace, running_operator):
    manifest, _ = demo_job(
        namespace,
        "hung",
        "--steps=100000",
        env={
            contract.ENV_DEMO_HANG_AT_STEP: "8",
            contract.ENV_DEMO_HANG_PROCESSES: "0",
            contract.ENV_DEMO_FAULT_ATTEMPTS: "1",
        },
        monitoring={"sampleInterval": "1s", "stallTimeout": "15s"},
    )
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "hung", 1)
    before = identities(tpu, namespace)
    status = running_attempt(tpu, namespace, "hung", 2, timeout=240)
    assert status["lastFailure"]["reason"] == "Stalled"
    assert status["restartKind"] == "InPlace"
    assert identities(tpu, namespace) == before


def test_a_lost_node_falls_back_to_recreating_the_pods(tpu, namespace, cluster, running_operator):
    manifest, _ = demo_job(namespace, "lost", "--steps=100000")
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "lost", 1)
    before = identities(tpu, namespace)
    node = tpu.pods(namespace)[0]["spec"]["nodeName"]
    cluster.agent.make_node_not_ready(node)
    try:
        status = wait_until(
            lambda: (s := tpu.status(namespace, "lost")).get("attempt") == 2 and s,
            timeout=120,
            message="a restart after the node went NotReady",
        )
        assert status["restartKind"] == "Recreate"
        assert status["lastFailure"]["reason"] == "NodeLost"
    finally:
        cluster.agent.heal_node(node)
    running_attempt(tpu, namespace, "lost", 2, timeout=240)
    after = identities(tpu, namespace)
    assert {uid for uid, _ in after.values()}.isdisjoint({uid for uid, _ in before.values()})


def test_a_maintenance_notice_asks_the_workers_to_checkpoint(
    tpu, namespace, cluster, running_operator
):
    manifest, directory = demo_job(
        namespace, "noticed", "--steps=100000", "--checkpoint-every=1000"
    )
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "noticed", 1)
    # At once: a request that reaches a process still starting is kept until it can act.
    assert steps_saved(directory) == []
    node = tpu.pods(namespace)[0]["spec"]["nodeName"]
    when = str(int(time.time()) + 3600)
    cluster.kubectl("label", "node", node, f"{MAINTENANCE_TIME_LABEL}={when}", "--overwrite")
    try:
        events = tpu.wait_events(namespace, "noticed", "CheckpointRequested", timeout=60)
        assert "CheckpointRequested" in events
        saved = wait_until(
            lambda: steps_saved(directory),
            timeout=120,
            message="a checkpoint written on the operator's request",
        )
        status = tpu.status(namespace, "noticed")
        assert status["checkpointRequests"] == 1
        assert status["disruptionNotices"] == [
            f"attempt 1: maintenance scheduled at {when} ({MAINTENANCE_TIME_LABEL})"
        ]
        assert (status["phase"], status["attempt"]) == ("Running", 1)
        assert saved[0] < 1000
    finally:
        cluster.kubectl("label", "node", node, f"{MAINTENANCE_TIME_LABEL}-")


def _restart_with(operator: Any, key_file: Path) -> None:
    operator.kill()
    args = [a for a in operator.extra_args if not a.startswith("--control-key-file")]
    operator.extra_args = [*args, f"--control-key-file={key_file}"]
    operator.start()


def test_supervisors_that_do_not_answer_the_operator_lead_to_recreation(
    tpu, namespace, running_operator, tmp_path
):
    manifest, _ = demo_job(
        namespace,
        "strangers",
        "--steps=100000",
        env=exits_once(step=15, process=1),
    )
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "strangers", 1)
    before = identities(tpu, namespace)
    original = list(running_operator.extra_args)
    other_key = tmp_path / "other.key"
    other_key.write_bytes(b"a-different-master-key-0123456789")
    _restart_with(running_operator, other_key)  # its signatures no longer match the pods'
    try:
        status = running_attempt(tpu, namespace, "strangers", 2, timeout=240)
        assert status["lastFailure"]["reason"] == "SupervisorUnreachable"
        assert status["restartKind"] == "Recreate"
        after = identities(tpu, namespace)
        assert {uid for uid, _ in after.values()}.isdisjoint({uid for uid, _ in before.values()})
    finally:
        running_operator.kill()
        running_operator.extra_args = original
        running_operator.start()


def test_the_operator_killed_during_an_in_place_restart_converges(tpu, namespace, running_operator):
    manifest, _ = demo_job(
        namespace,
        "interrupted",
        "--steps=100000",
        env=exits_once(step=12, process=0),
    )
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "interrupted", 1)
    before = identities(tpu, namespace)
    # SIGKILL the moment the restart is committed: mid stop/start
    wait_until(
        lambda: tpu.status(namespace, "interrupted").get("attempt") == 2,
        timeout=120,
        interval=0.05,
        message="the in-place restart to be committed",
    )
    running_operator.kill()
    labels = {p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in tpu.pods(namespace)}
    running_operator.start()
    status = running_attempt(tpu, namespace, "interrupted", 2)
    assert (status["restarts"], status["countedRestarts"], status["restartKind"]) == (
        1,
        1,
        "InPlace",
    ), f"pod attempt labels when killed: {labels}"
    assert identities(tpu, namespace) == before
    assert "Traceback" not in running_operator.tail(400)


def test_a_pod_lost_in_one_slice_recreates_that_slice_only(
    tpu, namespace, cluster, running_operator
):
    """Two slices, four JAX processes: a pod of slice 1 deleted, the operator SIGKILLed as
    it commits the restart. Slice 1's pods are recreated, slice 0's processes restart in
    place in the pods they have, and the new attempt resumes from the last checkpoint once
    every slice is ready."""
    manifest, directory = demo_job(namespace, "mixed", "--steps=100000", numSlices=2)
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "mixed", 1)
    wait_until(lambda: steps_saved(directory), timeout=120, message="a first checkpoint")
    before = identities(tpu, namespace)
    assert len(before) == 4
    cluster.kubectl("delete", "pod", "-n", namespace, "mixed-1-0", "--wait=false")
    # SIGKILL the moment the restart is committed: the next operator knows nothing of the
    # stops and starts sent, and must still start slice 0 once slice 1's new pods run.
    wait_until(
        lambda: tpu.status(namespace, "mixed").get("attempt") == 2,
        timeout=120,
        interval=0.05,
        message="the mixed restart to be committed",
    )
    running_operator.kill()
    running_operator.start()
    status = running_attempt(tpu, namespace, "mixed", 2, timeout=240)
    assert (status["restartKind"], status["recreatedSlices"]) == ("Mixed", [1]), status
    assert (status["restarts"], status["inPlaceRestarts"]) == (1, 1)
    assert status["lastFailure"]["pod"] == "mixed-1-0"
    after = identities(tpu, namespace)
    kept = {n: v[0] for n, v in before.items() if n.startswith("mixed-0-")}
    assert {n: after[n][0] for n in kept} == kept, "slice 0's pods must be the same"
    recreated = [n for n in after if n.startswith("mixed-1-")]
    assert len(recreated) == 2 and all(after[n][0] != before[n][0] for n in recreated)
    # (The Restarting event, posted after the status write, may have died with the
    # operator: tests/unit/test_inplace_reconciler.py checks its text.)
    # Attempt 2 rendezvoused across the kept and the new pods and trains on from a
    # checkpoint: process 0 (in a kept pod, one supervisor) resumed once.
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=120,
        message="attempt 2 to save a checkpoint after the one it resumed from",
    )
    log = cluster.pod_log(namespace, "mixed-0-0", contract.WORKER_CONTAINER)
    resumed = re.findall(r"resumed from checkpoint at step (\d+)", log.read_text())
    assert len(resumed) == 1 and int(resumed[0]) >= 5, resumed
    assert "Traceback" not in running_operator.tail(400)


def test_a_slice_on_a_broken_pool_moves_to_a_free_one(
    tpu, namespace, cluster, running_operator, tpu_pools
):
    """Two v4 slices on three pools: a node of slice 1's pool goes NotReady. Slice 1 is
    recreated on the free pool at once (not on its broken one, which no slice is given
    until it heals); slice 0 restarts in place; training resumes from a checkpoint."""
    tpu_pools(3)
    manifest, directory = demo_job(
        namespace, "spare", "--steps=100000", numSlices=2, slice={"type": "v4-16"}
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "spare", 1)
    wait_until(lambda: steps_saved(directory), timeout=120, message="a first checkpoint")
    before = identities(tpu, namespace)
    node = next(p for p in tpu.pods(namespace) if p["metadata"]["name"] == "spare-1-0")["spec"][
        "nodeName"
    ]
    cluster.agent.make_node_not_ready(node)
    try:
        status = running_attempt(tpu, namespace, "spare", 2, timeout=300)
    finally:
        cluster.agent.heal_node(node)
    assert (status["restartKind"], status["recreatedSlices"]) == ("Mixed", [1]), status
    assert status["lastFailure"]["reason"] == "NodeLost"
    kept, broken = first["nodePools"]
    assert status["nodePools"][0] == kept and status["nodePools"][1] != broken, status
    after = identities(tpu, namespace)
    assert {n: after[n][0] for n in after if n.startswith("spare-0-")} == {
        n: v[0] for n, v in before.items() if n.startswith("spare-0-")
    }
    moved = [p for p in tpu.pods(namespace) if p["metadata"]["name"].startswith("spare-1-")]
    assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in moved} == {
        status["nodePools"][1]
    }
    tpu.wait_events(namespace, "spare", "NodePoolUnhealthy")
    (event,) = [
        e["message"] for e in tpu.events(namespace, "spare") if e["reason"] == "NodePoolUnhealthy"
    ]
    assert f"slice 1: node pool {broken} has 1 of its 2 VMs not ready" in event, event
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=120,
        message="attempt 2 to save a checkpoint after the one it resumed from",
    )
    assert "Traceback" not in running_operator.tail(400)
