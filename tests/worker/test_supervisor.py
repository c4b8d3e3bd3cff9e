"""The supervisor (``tpu-worker`` with a control port) as real processes: in-place restarts.

Two supervisors run the demo as their children (2 JAX processes on CPU), wired and
isolated like pods (``launch``); the test is the operator: it signs commands with the
job's key (``tpu_operator.supervision``) and sends them to each pod's control port.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.worker import launch
from tests.worker.scrape import scrape
from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator import worker_metrics as wm
from tpu_worker.demo import checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not launch.can_isolate(), reason="needs root and unshare (pod isolation)"),
]

STARTUP_S = 300.0  # rendezvous + compile on 2 busy cores
KEY = b"0123456789abcdef0123456789abcdef"
WAIT_S = 30.0  # ENV_SUPERVISOR_WAIT: how long a failed supervisor waits for a start
HEARTBEAT_S = 10.0


def call(
    pod: launch.Pod,
    method: str,
    path: str,
    message: object | None = None,
    *,
    key: bytes | None = KEY,
    header: str | None = None,
) -> tuple[int, dict[str, object], str | None]:
    """One control request; (HTTP code, JSON body, the Authorization header sent). A 200
    or 409 answer must be signed for the request, as the operator checks it."""
    body = b"" if message is None else json.dumps(message).encode()
    if header is None and key is not None:
        header = sv.sign(key, method, path, body, pod=pod.uid)
    request = urllib.request.Request(pod.control_url + path, data=body or None, method=method)
    if header is not None:
        request.add_header("Authorization", header)
    if body:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            code, text, signature = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        code, text, signature = error.code, error.read(), error.headers
    if code in (200, 409) and header is not None and key is not None:
        answer = signature.get(sv.ANSWER_HEADER)
        sv.verify_answer(key, pod.uid, sv.nonce_of(header), code, text, answer)
    return code, json.loads(text), header


def status(pod: launch.Pod) -> dict[str, object]:
    code, body, _ = call(pod, "GET", sv.STATUS_PATH)
    assert code == 200, body
    sv.SupervisorStatus.from_json(body)  # the shape the operator parses
    return body


def ready(pod: launch.Pod) -> int:
    """The readiness probe's HTTP status; 0 while nothing listens on the control port yet."""
    try:
        with urllib.request.urlopen(pod.control_url + sv.READY_PATH, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except urllib.error.URLError as error:
        # The supervisor logs its key check before it binds the port, so a probe that
        # follows that log line can arrive first; the kubelet counts that as not ready too.
        if isinstance(error.reason, ConnectionRefusedError):
            return 0
        raise


def until(what: str, check: Callable[[], bool], timeout_s: float, gang: launch.Gang) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g}s: {what}\n{gang.logs()}")
        time.sleep(0.2)


def supervised_env(tmp_path: Path, key: bytes | None = KEY) -> dict[str, str]:
    key_file = tmp_path / "control-key"
    if key is not None:
        key_file.write_bytes(key)
    return {
        contract.ENV_CONTROL_PORT: str(contract.DEFAULT_CONTROL_PORT),
        contract.ENV_CONTROL_KEY_FILE: str(key_file),
        contract.ENV_CONTROL_KEY_ID: sv.key_id(KEY),
        contract.ENV_SUPERVISOR_WAIT: str(WAIT_S),
    }


def checkpoint_steps(directory: Path) -> list[int]:
    return checkpoint.saved_steps(directory)


def test_a_failed_attempt_restarts_in_place_on_command(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    args = launch.worker_command(
        "demo",
        "--steps",
        "10000",
        "--log-every",
        "1",
        "--init-timeout",
        "120",
        "--heartbeat-timeout",
        str(HEARTBEAT_S),
        "--step-sleep",
        "0.3",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        "4",
        "--keep-checkpoints",
        "1000",
        "--exit-at-step",
        "7",
        "--exit-processes",
        "1",
        "--fault-attempts",
        "1",
    )
    wirings = launch.wirings(topology="2x4", attempt=1)
    with launch.gang(wirings, tmp_path / "pods", supervised_env(tmp_path)) as gang:
        gang.start(args)
        pods = gang.pods
        supervisors = [p.process.pid for p in pods if p.process is not None]

        # 1. Attempt 1: process 1's training exits 1 before step 7; its peer ends too.
        gang.wait_for_log(pods[1], "test hook: exiting with code 1 before step 7", STARTUP_S)
        until("pod 1 NotReady", lambda: ready(pods[1]) == 503, 30, gang)
        until(
            "both children ended",
            lambda: all(status(p)["state"] == "exited" for p in pods),
            HEARTBEAT_S + 90,
            gang,
        )
        failed = [status(p) for p in pods]
        assert failed[1]["exit_code"] == 1 and failed[1]["exit_reason"] == "Exited"
        assert failed[0]["exit_code"] in (contract.EXIT_RETRYABLE, contract.EXIT_ABORTED_BY_JAX)
        assert all(s["attempt"] == 1 for s in failed)
        assert ready(pods[0]) == 503
        assert 4 in checkpoint_steps(checkpoints)

        # 2. Unsigned, wrongly signed and replayed commands are refused and change nothing.
        start2 = {"attempt": 2, "env": {contract.ENV_RESTART_ATTEMPT: "2"}}
        for kwargs, reason in (
            ({"key": None}, "missing Authorization header"),
            ({"key": b"not the job key"}, "bad signature"),
            ({"header": "Bearer " + KEY.decode()}, "malformed Authorization header"),
        ):
            code, body, _ = call(pods[0], "POST", sv.START_PATH, start2, **kwargs)
            assert (code, body) == (401, {"error": body["error"]}) and reason in str(body)
        code, _, _ = call(pods[0], "GET", sv.STATUS_PATH, key=b"wrong")
        assert code == 401
        # A signed request for /v1/stop is not valid for /v1/start.
        stop_header = sv.sign(
            KEY, "POST", sv.STOP_PATH, json.dumps(start2).encode(), pod=pods[0].uid
        )
        code, _, _ = call(pods[0], "POST", sv.START_PATH, start2, header=stop_header)
        assert code == 401
        assert status(pods[0]) == failed[0], "refused requests changed the supervisor"

        # 3. Stop attempt 1 (already ended: answered at once, idempotent); a replay of a
        # signed request is refused.
        for pod, before in zip(pods, failed, strict=True):
            code, body, header = call(pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 5})
            assert (code, body) == (200, before)
            code, body, _ = call(
                pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 5}, header=header
            )
            assert code == 401 and "replayed nonce" in str(body["error"])
            assert call(pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 5})[0] == 200

        # 4. Start attempt 2 on both: same supervisors, new children, resumed training.
        for pod in pods:
            code, body, _ = call(pod, "POST", sv.START_PATH, start2)
            assert code == 200, body
            assert (body["state"], body["attempt"]) == ("running", 2)
            assert body["exit_code"] is None
        restarted = [status(p) for p in pods]
        for pod, before in zip(pods, failed, strict=True):
            code, body, _ = call(pod, "POST", sv.START_PATH, start2)  # repeated: no-op
            assert code == 200 and body["pid"] == status(pod)["pid"] != before["pid"]
            code, body, _ = call(pod, "POST", sv.START_PATH, {"attempt": 1, "env": {}})
            assert code == 200 and body["attempt"] == 2  # an older start: no-op
            # The guards: never stop a newer attempt; never start over a running one.
            code, body, _ = call(pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 5})
            assert code == 409 and body["state"] == "running"
            code, body, _ = call(pod, "POST", sv.START_PATH, {"attempt": 3, "env": {}})
            assert code == 409 and body["attempt"] == 2
        for pod in pods:
            gang.wait_for_log(pod, "resumed from checkpoint at step", STARTUP_S)
            match = re.search(r"resumed from checkpoint at step (\d+)", pod.log())
            assert match and int(match.group(1)) >= 4, pod.log()
        until("both pods Ready", lambda: all(ready(p) == 200 for p in pods), 30, gang)
        assert [p.process.pid for p in pods if p.process is not None] == supervisors
        assert all(p.poll() is None for p in pods)
        for pod in pods:
            gang.wait_for_log(pod, "step 10 loss", STARTUP_S)
            info = scrape(pod.metrics_url).with_name(wm.BUILD_INFO)
            assert dict(next(iter(info)))[wm.LABEL_ATTEMPT] == "2"
        assert [s["pid"] for s in restarted] == [status(p)["pid"] for p in pods]

        # 5. A checkpoint command: saved at one agreed step, training goes on.
        for pod in pods:
            request = {"attempt": 2, "id": "ckpt-1"}
            code, body, _ = call(pod, "POST", sv.CHECKPOINT_PATH, request)
            assert code == 200 and body["checkpoints"] == ["ckpt-1"], body
            code, body, _ = call(pod, "POST", sv.CHECKPOINT_PATH, request)  # repeated id
            assert code == 200 and body["checkpoints"] == ["ckpt-1"], body
            code, body, _ = call(pod, "POST", sv.CHECKPOINT_PATH, {"attempt": 1, "id": "old"})
            assert code == 409 and body["checkpoints"] == ["ckpt-1"]
        gang.wait_for_log(pods[0], "(requested)", 120)
        saved = re.search(r"checkpoint saved at step (\d+) to \S+ \(requested\)", pods[0].log())
        assert saved, pods[0].log()
        step = int(saved.group(1))
        agreed = f"checkpoint saved at step {step} to {checkpoint.step_path(checkpoints, step)}"
        assert f"{agreed} (requested)" in pods[1].log(), "not agreed"
        assert step in checkpoint_steps(checkpoints)
        for pod in pods:
            gang.wait_for_log(pod, f"step {step + 3} loss", 120)  # training went on
            assert status(pod)["state"] == "running"
            assert scrape(pod.metrics_url).value(wm.CHECKPOINT_REQUESTS_TOTAL) == 1

        # 6. SIGTERM to supervisor 0 (pod deletion): its child saves a checkpoint and
        # exits 75, and so does the supervisor. Its peer's child stops at the same step
        # (JAX's preemption sync); supervisor 1 waits for a start, then exits 75 too.
        pods[0].signal(signal.SIGTERM)
        codes = gang.wait(120, [pods[0]])
        assert codes == {0: contract.EXIT_RETRYABLE}, gang.logs()
        assert "stopping at step" in pods[0].log()
        codes = gang.wait(WAIT_S + 120, [pods[1]])
        assert codes == {1: contract.EXIT_RETRYABLE}, gang.logs()
        assert f"no start command within {WAIT_S:g}s of the failure" in pods[1].log()


def test_without_a_key_every_command_is_refused(tmp_path: Path) -> None:
    env = supervised_env(tmp_path, key=None)
    with launch.gang(launch.wirings(topology="2x4", attempt=1), tmp_path, env) as gang:
        # Only pod 0 exists: its child waits for its peer (rendezvous), so it stays running.
        gang.start(launch.worker_command("check", "--init-timeout", "300"), only=[0])
        pod = gang.pods[0]
        gang.wait_for_log(pod, "no control key in", 60)
        until("pod 0 Ready", lambda: ready(pod) == 200, 60, gang)
        code, body, _ = call(pod, "GET", sv.STATUS_PATH)
        assert (code, body) == (401, {"error": "no control key mounted"})
        code, body, _ = call(pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 1})
        assert code == 401
        assert ready(pod) == 200, "a refused stop stopped the child"
        code, _, _ = call(pod, "POST", "/v1/nothing", {}, key=None)
        assert code == 404
        big = {"attempt": 1, "env": {"X": "y" * (sv.MAX_BODY_BYTES + 1)}}
        assert call(pod, "POST", sv.START_PATH, big, key=None)[0] == 413
        # SIGTERM before training started: the child exits retryable, so does the supervisor.
        pod.signal(signal.SIGTERM)
        assert gang.wait(120, [pod]) == {0: contract.EXIT_RETRYABLE}, gang.logs()


# Loaded by every Python process of the pod through PYTHONPATH: the supervisor's child
# (only it) holds its start-up here, before its worker installs any signal handler, until
# the test opens the gate.
_GATE = f"""
import os, pathlib, time
if os.environ.get({contract.ENV_SUPERVISED_CHILD!r}):
    gate = pathlib.Path(os.environ["TEST_STARTUP_GATE"])
    (gate / "starting").write_text(str(os.getpid()))
    while not (gate / "open").exists():
        time.sleep(0.05)
"""


def test_a_checkpoint_request_to_a_starting_child_is_kept_until_it_can_act(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(_GATE)
    checkpoints = tmp_path / "ckpt"
    args = launch.worker_command(
        "demo",
        "--steps",
        "100000",
        "--log-every",
        "1",
        "--init-timeout",
        "120",
        "--step-sleep",
        "0.3",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        "100000",
    )
    env = {**supervised_env(tmp_path), "PYTHONPATH": str(gate), "TEST_STARTUP_GATE": str(gate)}
    wirings = launch.wirings(topology="2x2", attempt=1)
    assert len(wirings) == 1
    with launch.gang(wirings, tmp_path / "pods", env) as gang:
        gang.start(args)
        pod = gang.pods[0]
        until("the child held in its start-up", (gate / "starting").exists, 120, gang)
        child = status(pod)
        assert (child["state"], child["pid"]) == ("running", int((gate / "starting").read_text()))
        # The answer comes once the supervisor signalled the child (before its handler).
        code, body, _ = call(pod, "POST", sv.CHECKPOINT_PATH, {"attempt": 1, "id": "early"})
        assert code == 200 and body["checkpoints"] == ["early"], body
        assert not (gate / "open").exists()
        assert status(pod)["pid"] == child["pid"], "the early request killed the child"
        (gate / "open").touch()
        gang.wait_for_log(pod, "(requested)", STARTUP_S)
        saved = re.search(r"checkpoint saved at step (\d+) to \S+ \(requested\)", pod.log())
        assert saved, pod.log()
        step = int(saved.group(1))
        assert step in checkpoint_steps(checkpoints)
        gang.wait_for_log(pod, f"step {step + 3} loss", 120)  # training went on
        assert status(pod)["state"] == "running"
        assert scrape(pod.metrics_url).value(wm.CHECKPOINT_REQUESTS_TOTAL) == 1
        assert pod.log().count("(requested)") == 1
