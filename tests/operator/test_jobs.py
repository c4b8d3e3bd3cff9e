"""TPUJobs on the real control plane with the operator running: placement, wiring,
status, gang restarts, failure policy, suspension, garbage collection, restart safety."""

from __future__ import annotations

import pytest

from localcluster.pools import Pool, Simulate
from localcluster.testing import wait_until
from tests.operator.support import PodAttemptRecorder, job_manifest
from tpu_operator import contract

pytestmark = pytest.mark.integration


def env_of(pod: dict) -> dict[str, object]:
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in worker["env"]}


def test_single_slice_job_runs_to_success_on_its_pool(tpu, namespace, running_operator):
    tpu.apply(job_manifest("train", namespace, {"type": "v5litepod-16"}, "sleep 3; exit 0"))
    running = tpu.wait_phase(namespace, "train", "Running", timeout=60)
    assert running["ready"] == "4/4" and running["slicesReady"] == "1/1"
    assert running["shape"] == {
        "accelerator": "tpu-v5-lite-podslice",
        "topology": "4x4",
        "type": "v5litepod-16",
        "chips": 16,
        "chipsPerHost": 4,
        "hosts": 4,
        "machineType": "ct5lp-hightpu-4t",
    }
    assert running["nodePools"] == ["v5e-4x4"]
    pods = sorted(tpu.pods(namespace), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == [f"train-0-{w}" for w in range(4)]
    for worker, pod in enumerate(pods):
        spec = pod["spec"]
        assert spec["nodeName"].startswith("v5e-4x4-")
        assert spec["hostname"] == f"train-0-{worker}" and spec["subdomain"] == "train"
        assert spec["nodeSelector"] == {
            contract.NODE_LABEL_ACCELERATOR: "tpu-v5-lite-podslice",
            contract.NODE_LABEL_TOPOLOGY: "4x4",
            contract.NODE_LABEL_NODEPOOL: "v5e-4x4",
        }
        assert spec["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
        env = env_of(pod)
        assert env["TPU_WORKER_ID"] == str(worker)
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(f"train-0-{w}.train" for w in range(4))
        assert env["JAX_COORDINATOR_ADDRESS"] == "train-0-0.train:8482"
        assert pod["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] == "1"
        assert pod["status"]["podIP"].startswith("127.")
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 4, "one worker per VM"
    service = tpu.raw.get(f"/api/v1/namespaces/{namespace}/services/train")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True

    done = tpu.wait_phase(namespace, "train", "Succeeded", timeout=60)
    assert done["completionTime"] and done["startTime"]
    assert done["restarts"] == 0
    conditions = {c["type"]: c["status"] for c in done["conditions"]}
    assert conditions["Succeeded"] == "True" and conditions["Running"] == "False"
    tpu.wait_events(namespace, "train", "NodePoolsAssigned", "Running", "Succeeded")
    table = tpu.cluster.kubectl("get", "tpujobs", "-n", namespace).stdout
    assert table.split("\n")[0].split() == [
        "NAME",
        "PHASE",
        "WORKERS",
        "SLICES",
        "RESTARTS",
        "TYPE",
        "STEP",
        "TOKENS/S",
        "AGE",
    ]
    assert "Succeeded" in table and "v5litepod-16" in table


def test_multislice_places_each_slice_in_its_own_pool(tpu, namespace, running_operator):
    tpu.apply(job_manifest("multi", namespace, {"type": "v5p-16"}, "sleep 60", numSlices=2))
    status = tpu.wait_phase(namespace, "multi", "Running", timeout=60)
    assert sorted(status["nodePools"]) == ["v5p-a", "v5p-b"]
    by_slice: dict[str, set[str]] = {}
    for pod in tpu.pods(namespace):
        labels = pod["metadata"]["labels"]
        by_slice.setdefault(labels[contract.LABEL_SLICE_INDEX], set()).add(
            pod["spec"]["nodeName"].rsplit("-", 1)[0]
        )
        env = env_of(pod)
        assert env["MEGASCALE_NUM_SLICES"] == "2"
        assert env["MEGASCALE_SLICE_ID"] == labels[contract.LABEL_SLICE_INDEX]
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "multi-0-0.multi"
        process_id = int(labels[contract.LABEL_SLICE_INDEX]) * 2 + int(
            labels[contract.LABEL_WORKER_INDEX]
        )
        assert env[contract.ENV_PROCESS_ID] == str(process_id)
    assert by_slice == {"0": {status["nodePools"][0]}, "1": {status["nodePools"][1]}}

    # Each TPUSlice's status is written by its own reconcile, so it may trail the
    # job's by an event; it must get there on its own.
    def slice_phases() -> dict[str, str]:
        return {
            s["metadata"]["name"]: s.get("status", {}).get("phase", "")
            for s in tpu.slices(namespace)
        }

    wait_until(lambda: all(p == "Running" for p in slice_phases().values()), timeout=30)
    assert slice_phases() == {"multi-0": "Running", "multi-1": "Running"}
    # The pools are held: a second multislice job waits and says why.
    tpu.apply(job_manifest("second", namespace, {"type": "v5p-16"}, "true", numSlices=2))
    waiting = wait_until(
        lambda: (
            "free node pool" in tpu.status(namespace, "second").get("message", "")
            and tpu.status(namespace, "second")
        ),
        timeout=30,
        message="the second job to wait for node pools",
    )
    assert waiting["phase"] == "Pending"
    assert "held by" in waiting["message"]
    tpu.wait_events(namespace, "second", "WaitingForNodePools")


def test_worker_failure_restarts_the_whole_gang_without_overlap(tpu, namespace, running_operator):
    fail_once = (
        'if [ "$TPU_OPERATOR_RESTART_ATTEMPT" = 1 ] && [ "$TPU_WORKER_ID" = 1 ]; '
        "then sleep 1; exit 3; fi; sleep 4"
    )
    manifest = job_manifest(
        "flaky",
        namespace,
        {"type": "v5p-16"},
        fail_once,
        numSlices=2,
        failurePolicy={"maxRestarts": 2, "backoffSeconds": 1},
    )
    with PodAttemptRecorder(tpu, namespace) as recorder:
        tpu.apply(manifest)
        done = tpu.wait_phase(namespace, "flaky", "Succeeded", timeout=90)
    assert recorder.attempts_seen == {"1", "2"}
    assert recorder.overlaps == [], f"attempts 1 and 2 were alive together: {recorder.overlaps[0]}"
    assert done["attempt"] == 2
    assert done["restarts"] == 1 and done["countedRestarts"] == 1
    assert done["restartsByReason"] == {"Failed": 1}
    failure = done["lastFailure"]
    assert failure["exitCode"] == 3 and failure["reason"] == "Failed" and failure["counted"]
    assert failure["pod"] in ("flaky-0-1", "flaky-1-1") and failure["attempt"] == 1
    tpu.wait_events(namespace, "flaky", "Restarting")
    assert {
        p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in tpu.pods(namespace)
    } == {"2"}


def test_max_restarts_exhausted_fails_the_job(tpu, namespace, running_operator):
    manifest = job_manifest(
        "doomed",
        namespace,
        {"type": "v5litepod-8", "chipsPerHost": 4},
        "sleep 0.5; exit 2",
        failurePolicy={"maxRestarts": 1, "backoffSeconds": 0},
    )
    tpu.apply(manifest)
    failed = tpu.wait_phase(namespace, "doomed", "Failed", timeout=90)
    assert failed["restarts"] == 1 and failed["countedRestarts"] == 1
    failed_condition = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert failed_condition["status"] == "True"
    assert failed_condition["reason"] == "MaxRestartsExceeded"
    assert "maxRestarts (1) reached" in failed["message"]
    assert failed["lastFailure"]["exitCode"] == 2
    tpu.wait_events(namespace, "doomed", "Failed")


def test_fatal_exit_code_fails_at_once(tpu, namespace, running_operator):
    manifest = job_manifest(
        "fatal",
        namespace,
        {"type": "v5litepod-8", "chipsPerHost": 4},
        "exit 42",
        failurePolicy={"rules": [{"action": "FailJob", "values": [42]}]},
    )
    tpu.apply(manifest)
    failed = tpu.wait_phase(namespace, "fatal", "Failed", timeout=60)
    assert failed["restarts"] == 0
    assert "exit code 42 is fatal" in failed["message"]


def test_eviction_restarts_without_counting(tpu, namespace, cluster, running_operator):
    manifest = job_manifest(
        "evicted",
        namespace,
        {"type": "v5litepod-8", "chipsPerHost": 4},
        "sleep 300",
        failurePolicy={"maxRestarts": 0, "backoffSeconds": 0},
    )
    tpu.apply(manifest)
    tpu.wait_phase(namespace, "evicted", "Running", timeout=60)
    cluster.agent.evict_pod(namespace, "evicted-0-1")
    status = wait_until(
        lambda: (
            (s := tpu.status(namespace, "evicted")).get("attempt") == 2
            and s.get("phase") == "Running"
            and s
        ),
        timeout=90,
        message="the evicted job to run again as attempt 2",
    )
    assert status["restarts"] == 1 and status["countedRestarts"] == 0
    assert status["restartsByReason"] == {"Evicted": 1}
    assert status["lastFailure"]["counted"] is False


def test_node_loss_restarts_without_counting(tpu, namespace, cluster, running_operator):
    cluster.agent.add_pool(
        Pool(
            name="lossy", vms=3, accelerator="tpu-v5-lite-podslice", topology="2x2", chips_per_vm=4
        )
    )
    try:
        manifest = job_manifest(
            "lossy",
            namespace,
            {"type": "v5litepod-4"},
            "sleep 300",
            placement={"nodeSelector": {contract.NODE_LABEL_NODEPOOL: "lossy"}},
            failurePolicy={"maxRestarts": 0, "backoffSeconds": 0},
        )
        tpu.apply(manifest)
        tpu.wait_phase(namespace, "lossy", "Running", timeout=60)
        node = tpu.pods(namespace)[0]["spec"]["nodeName"]
        cluster.agent.delete_node(node)
        status = wait_until(
            lambda: (s := tpu.status(namespace, "lossy")).get("restarts") == 1 and s,
            timeout=150,
            message="the job to restart after its node was deleted",
        )
        assert status["restartsByReason"] == {"NodeLost": 1}
        assert status["countedRestarts"] == 0
        running = tpu.wait_phase(namespace, "lossy", "Running", timeout=90)
        assert running["attempt"] == 2
        assert tpu.pods(namespace)[0]["spec"]["nodeName"] != node
    finally:
        cluster.agent.remove_pool("lossy")


def test_suspend_and_resume(tpu, namespace, running_operator):
    tpu.apply(job_manifest("pausable", namespace, {"type": "v5p-16"}, "sleep 300"))
    tpu.wait_phase(namespace, "pausable", "Running", timeout=60)
    tpu.patch_job(namespace, "pausable", {"spec": {"suspend": True}})
    suspended = tpu.wait_phase(namespace, "pausable", "Suspended", timeout=30)
    wait_until(
        lambda: not tpu.pods(namespace),
        timeout=60,
        message="the suspended job's pods to be deleted",
    )
    assert "nodePools" not in suspended
    assert {s["spec"]["suspend"] for s in tpu.slices(namespace)} == {True}
    tpu.patch_job(namespace, "pausable", {"spec": {"suspend": False}})
    resumed = wait_until(
        lambda: (s := tpu.status(namespace, "pausable")).get("phase") == "Running" and s,
        timeout=60,
        message="the resumed job to run",
    )
    assert resumed["attempt"] == 2 and resumed["restarts"] == 0
    tpu.wait_events(namespace, "pausable", "Suspended", "Resumed")


def test_leader_success_policy_stops_the_other_workers(tpu, namespace, running_operator):
    command = 'if [ "$TPU_OPERATOR_PROCESS_ID" = 0 ]; then sleep 2; exit 0; fi; sleep 300'
    tpu.apply(
        job_manifest(
            "leader", namespace, {"type": "v5litepod-16"}, command, successPolicy="LeaderWorker"
        )
    )
    done = tpu.wait_phase(namespace, "leader", "Succeeded", timeout=60)
    assert "worker 0 of slice 0" in done["message"]
    wait_until(
        lambda: (
            all(
                p["status"].get("phase") in ("Succeeded", "Failed")
                or p["metadata"].get("deletionTimestamp")
                for p in tpu.pods(namespace)
            )
            or not tpu.pods(namespace)
        ),
        timeout=60,
        message="the other workers to be stopped",
    )


def test_deadline_and_ttl(tpu, namespace, running_operator):
    tpu.apply(
        job_manifest(
            "slow",
            namespace,
            {"type": "v5litepod-4"},
            "sleep 300",
            activeDeadlineSeconds=3,
            ttlSecondsAfterFinished=2,
        )
    )
    failed = tpu.wait_phase(namespace, "slow", "Failed", timeout=60)
    assert next(c for c in failed["conditions"] if c["type"] == "Failed")["reason"] == (
        "DeadlineExceeded"
    )
    wait_until(
        lambda: (
            "slow"
            not in tpu.cluster.kubectl("get", "tpujobs", "-n", namespace, "-o", "name").stdout
        ),
        timeout=60,
        message="ttlSecondsAfterFinished to delete the job",
    )


def test_deleting_a_job_garbage_collects_everything(tpu, namespace, running_operator):
    tpu.apply(job_manifest("doomed-gc", namespace, {"type": "v5p-16"}, "sleep 300", numSlices=2))
    tpu.wait_phase(namespace, "doomed-gc", "Running", timeout=60)
    tpu.cluster.kubectl("delete", "tpujob", "doomed-gc", "-n", namespace, "--wait=false")

    def gone() -> bool:
        leftovers = tpu.cluster.kubectl(
            "get", "tpuslices,pods,services", "-n", namespace, "-o", "name"
        ).stdout.strip()
        return not leftovers

    wait_until(
        gone, timeout=90, message="the garbage collector to delete slices, pods and the Service"
    )


def test_invalid_pod_template_fails_with_the_apiserver_message(tpu, namespace, running_operator):
    manifest = job_manifest("badpod", namespace, {"type": "v5litepod-4"}, "true")
    manifest["spec"]["template"]["spec"]["containers"][0]["image"] = ""
    tpu.apply(manifest)
    failed = tpu.wait_phase(namespace, "badpod", "Failed", timeout=60)
    assert "rejected the worker pod" in failed["message"]
    assert "image" in failed["message"]


def standalone_slice(name: str, namespace: str, command: str, **failure_policy: int) -> dict:
    """A standalone TPUSlice of 4 hosts (v5litepod-16) whose workers run ``command``."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.SLICE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "type": "v5litepod-16",
            "failurePolicy": failure_policy,
            "template": job_manifest("x", namespace, {}, command)["spec"]["template"],
        },
    }


def test_standalone_slice_restarts_itself(tpu, namespace, running_operator):
    command = 'if [ "$TPU_OPERATOR_RESTART_ATTEMPT" = 1 ]; then exit 5; fi; sleep 300'
    tpu.apply(standalone_slice("serve", namespace, command, backoffSeconds=0))

    def running_again() -> dict | None:
        items = tpu.slices(namespace)
        status = items[0].get("status", {}) if items else {}
        return status if status.get("phase") == "Running" and status.get("attempt") == 2 else None

    status = wait_until(running_again, timeout=90, message="the standalone slice to run attempt 2")
    assert status["restarts"] == 1 and status["restartsByReason"] == {"Failed": 1}
    assert status["nodePool"] == "v5e-4x4"
    service = tpu.raw.get(f"/api/v1/namespaces/{namespace}/services/serve")
    assert service["spec"]["selector"] == {contract.LABEL_SLICE_NAME: "serve"}
    env = env_of(tpu.pods(namespace)[0])
    assert env["JAX_COORDINATOR_ADDRESS"] == "serve-0.serve:8482"


def test_a_standalone_slice_failed_for_good_stops_its_other_workers(
    tpu, namespace, running_operator
):
    """As a job that failed for good: the workers that still run are stopped (they would
    hold their TPU VMs for ever), and a resume changes nothing."""
    command = 'if [ "$TPU_OPERATOR_PROCESS_ID" = 0 ]; then sleep 2; exit 3; fi; sleep 300'
    tpu.apply(standalone_slice("doomed", namespace, command, maxRestarts=0))

    def status() -> dict:
        items = tpu.slices(namespace)
        return items[0].get("status", {}) if items else {}

    def stopped() -> dict | None:
        now = status()
        pods = tpu.pods(namespace)
        running = [
            p
            for p in pods
            if p["status"].get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        ]
        stopped = next((c for c in now.get("conditions", []) if c["type"] == "PodsStopped"), {})
        done = now.get("phase") == "Failed" and not running and stopped.get("status") == "True"
        return now if done else None

    failed = wait_until(stopped, timeout=90, message="the slice to fail and stop its workers")
    assert failed["attempt"] == 1 and failed["failure"]["exitCode"] == 3
    assert "maxRestarts (0) reached" in failed["message"]
    assert not failed.get("nodePool")  # its pool is free for others
    tpu.patch_slice(namespace, "doomed", {"spec": {"suspend": True}})
    tpu.patch_slice(namespace, "doomed", {"spec": {"suspend": False}})
    wait_until(
        lambda: status().get("observedGeneration") == 3,
        timeout=30,
        message="the slice to read its spec again",
    )
    assert (status()["phase"], status()["attempt"]) == ("Failed", 1)
    assert not [p for p in tpu.pods(namespace) if p["status"].get("phase") == "Pending"]


def test_operator_killed_mid_creation_converges_to_exactly_64_pods(
    tpu, namespace, cluster, running_operator
):
    cluster.agent.add_pool(
        Pool(
            name="big",
            vms=64,
            accelerator="tpu-v5p-slice",
            topology="4x8x8",
            chips_per_vm=4,
            mode="simulate",
            simulate=Simulate(),
        )
    )
    try:
        tpu.apply(job_manifest("big", namespace, {"type": "v5p-512"}, "sleep 300"))
        wait_until(
            lambda: len(tpu.pods(namespace)) >= 3, timeout=60, message="pod creation to begin"
        )
        running_operator.kill()
        created_before = len(tpu.pods(namespace))
        running_operator.start()
        status = tpu.wait_phase(namespace, "big", "Running", timeout=120)
        pods = tpu.pods(namespace)
        workers = sorted(int(p["metadata"]["labels"][contract.LABEL_WORKER_INDEX]) for p in pods)
        assert workers == list(range(64)), f"{len(pods)} pods (had {created_before} at the kill)"
        assert status["attempt"] == 1 and status["restarts"] == 0
        assert status["ready"] == "64/64"
    finally:
        tpu.cluster.kubectl("delete", "tpujob", "big", "-n", namespace, "--wait=true", timeout=120)
        cluster.agent.remove_pool("big")
