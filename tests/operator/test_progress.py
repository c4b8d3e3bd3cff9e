"""The operator watching real JAX training: progress in status, stragglers, stalls, goodput.

Workers run the worker's demo training as real processes on the local cluster; the
operator samples their metrics endpoints. The operator of these tests publishes progress
every 2 s (--progress-publish-seconds) so that the tests need not wait 30 s.
"""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from localcluster.testing import wait_until
from tests.operator.support import Api, job_manifest
from tpu_operator import contract
from tpu_operator.progress.samples import parse

pytestmark = pytest.mark.integration
DEMO = "tpu-worker demo --log-every=20 --metrics-linger=30"
CHECKPOINTS = Path("/var/tmp/tpu-operator-tests")


def scrape(pod: dict, port: int = contract.DEFAULT_METRICS_PORT):
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse(response.read().decode(), 0.0)


def demo_job(namespace: str, name: str, shape: dict, command: str, **spec) -> dict:
    manifest = job_manifest(name, namespace, shape, command, **spec)
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return manifest


def test_status_reports_progress_and_names_the_straggler(tpu: Api, namespace, running_operator):
    command = f"{DEMO} --steps=100000 --slow-processes=2 --slow-seconds=0.4"
    tpu.apply(
        demo_job(
            namespace,
            "observed",
            {"type": "v5litepod-16"},
            command,
            monitoring={"sampleInterval": "1s", "stallTimeout": "5m"},
        )
    )
    first = wait_until(
        lambda: (tpu.status(namespace, "observed").get("progress") or {}).get("step"),
        timeout=180,
        message="the first step in status",
    )
    later = wait_until(
        lambda: (
            (p := tpu.status(namespace, "observed").get("progress") or {}).get("step", 0) > first
            and p
        ),
        timeout=60,
        message="the step in status to advance",
    )
    assert later["stepsPerSecond"] > 0
    assert later["tokensPerSecond"] > 0 and later["examplesPerSecond"] > 0
    assert 0 < later["mfu"] <= 1
    assert later["lastProgressTime"]

    # Status agrees with the metrics endpoints: the step within what is made in one
    # publish period plus one sample period; tokens/s within 35% of a rate the test
    # measures itself over a similar window (step times are noisy on two shared cores).
    pods = {p["metadata"]["name"]: p for p in tpu.pods(namespace)}
    status = tpu.status(namespace, "observed")["progress"]
    leader = scrape(pods["observed-0-0"])
    margin = (status["stepsPerSecond"] or 1) * (2 + 1 + 2) + 2
    assert leader.step - margin <= status["step"] <= leader.step
    began = time.monotonic()
    before = sum(scrape(pod).tokens for pod in pods.values())
    time.sleep(8)
    after = sum(scrape(pod).tokens for pod in pods.values())
    measured = (after - before) / (time.monotonic() - began)
    reported = tpu.status(namespace, "observed")["progress"]["tokensPerSecond"]
    assert abs(reported - measured) <= 0.35 * measured, (reported, measured)

    straggling = wait_until(
        lambda: next(
            (
                c
                for c in tpu.status(namespace, "observed")["conditions"]
                if c["type"] == "Straggler" and c["status"] == "True"
            ),
            None,
        ),
        timeout=120,
        message="the Straggler condition",
    )
    node = pods["observed-0-2"]["spec"]["nodeName"]
    assert "observed-0-2" in straggling["message"] and node in straggling["message"]
    assert "data wait" in straggling["message"]
    slowest = tpu.status(namespace, "observed")["progress"]["slowestWorkers"]
    assert slowest[0]["pod"] == "observed-0-2"
    assert tpu.status(namespace, "observed")["restarts"] == 0  # stragglers restart nothing
    tpu.wait_events(namespace, "observed", "Straggler")


def test_stalled_job_restarts_resumes_and_books_the_lost_steps(
    tpu: Api, namespace, running_operator
):
    checkpoints = CHECKPOINTS / namespace
    shutil.rmtree(checkpoints, ignore_errors=True)
    command = (
        'if [ "$TPU_OPERATOR_RESTART_ATTEMPT" = 1 ]; then '
        "export TPU_WORKER_DEMO_HANG_AT_STEP=25; fi; "
        f"exec {DEMO} --steps=60 --checkpoint-every=10 --checkpoint-dir={checkpoints} "
        "--watchdog-floor=600"
    )
    tpu.apply(
        demo_job(
            namespace,
            "stuck",
            {"type": "v5litepod-8", "chipsPerHost": 4},
            command,
            monitoring={"sampleInterval": "1s", "stallTimeout": "8s"},
            failurePolicy={"backoffSeconds": 0},
        )
    )
    stalled = wait_until(
        lambda: (s := tpu.status(namespace, "stuck")).get("restarts") == 1 and s,
        timeout=240,
        message="the stalled job to be restarted",
    )
    assert stalled["restartsByReason"] == {"Stalled": 1}
    assert stalled["lastFailure"]["reason"] == "Stalled"
    assert "no training step for" in stalled["lastFailure"]["message"]
    tpu.wait_events(namespace, "stuck", "Stalled")

    done = tpu.wait_phase(namespace, "stuck", "Succeeded", timeout=240)
    assert done["attempt"] == 2
    log = tpu.cluster.pod_log(namespace, "stuck-0-0", "worker").read_text()
    assert "resum" in log.lower() and "step 20" in log, log[-2000:]
    goodput = done["goodput"]
    badput = goodput["badputSeconds"]
    assert badput["lostProgress"] > 0, goodput
    assert badput["restartDowntime"] > 0 and badput["initialization"] > 0
    assert 0 < goodput["fraction"] < 1
    assert goodput["productiveSeconds"] + sum(badput.values()) == pytest.approx(
        goodput["wallSeconds"], abs=1.0
    )
