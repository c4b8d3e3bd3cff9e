"""The control channel under attack, with real processes on this machine.

Supervisors run as pods would (``launch``: own IP, hostname, the env the operator gives),
their children a ``tpu-worker check`` that waits for its rendezvous (so it keeps running,
without training). The attacker is this test: it replays a request captured for one pod on
another, floods a supervisor with half-sent requests, plants a key of its own, and plays
supervisors that never answer or answer a gigabyte to the operator's control channel
(``tpu_operator.runtime.control``, as the operator runs it).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.worker import launch
from tests.worker.test_supervisor import KEY, call, ready, supervised_env, until
from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator.runtime.control import MAX_ANSWER_BYTES, PER_JOB, ControlChannel, ControlError
from tpu_worker.control import MAX_CONNECTIONS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not launch.can_isolate(), reason="needs root and unshare (pod isolation)"),
]

CHECK = launch.worker_command("check", "--init-timeout", "600")


def running(gang: launch.Gang, pods: list[launch.Pod]) -> None:
    for pod in pods:
        until(f"{pod.name} Ready", lambda p=pod: ready(p) == 200, 120, gang)  # type: ignore[misc]


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_a_request_captured_for_one_pod_is_refused_on_another(tmp_path: Path) -> None:
    """Both pods belong to one job (same key). A stop signed for pod 0, captured on the
    wire, replayed on pod 1 within its window: refused, and pod 1's process runs on."""
    with launch.gang(
        launch.wirings(attempt=1), tmp_path / "pods", supervised_env(tmp_path)
    ) as gang:
        pods = gang.pods
        gang.start(CHECK, only=[0])
        gang.start(CHECK, only=[1])
        running(gang, pods)
        stop = {"attempt": 1, "grace_seconds": 5}
        code, body, captured = call(pods[0], "POST", sv.STOP_PATH, stop)
        assert code == 200 and body["state"] in ("stopping", "exited"), body
        assert captured is not None
        code, body, _ = call(pods[1], "POST", sv.STOP_PATH, stop, header=captured)
        assert code == 401
        assert body == {"error": f"signed for another pod ({pods[0].uid}; this is {pods[1].uid})"}
        code, body, _ = call(pods[0], "POST", sv.STOP_PATH, stop, header=captured)
        assert (code, body) == (401, {"error": "replayed nonce"})
        time.sleep(1.5)  # a probe period: a stop that had gone through would show
        assert ready(pods[1]) == 200
        code, status, _ = call(pods[1], "GET", sv.STATUS_PATH)
        assert (code, status["state"], status["attempt"]) == (200, "running", 1)
        assert "signed for another pod" in pods[1].log()  # the refusal is logged


def test_a_planted_key_is_never_used(tmp_path: Path) -> None:
    """The pod's key Secret was made by someone else: the mounted key is theirs. Their
    own signed requests are refused (its id is not the one the pod was given), and the
    supervisor says why at start."""
    planted = b"the attackers own key, 32 bytes."
    env = supervised_env(tmp_path, key=planted)
    env[contract.ENV_CONTROL_KEY_ID] = sv.key_id(KEY)  # what the operator put in the pod
    with launch.gang(launch.wirings(attempt=1), tmp_path / "pods", env) as gang:
        pod = gang.pods[0]
        gang.start(CHECK, only=[0])
        running(gang, [pod])
        for method, path, message in (
            ("POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 1}),
            ("POST", sv.START_PATH, {"attempt": 2, "env": {}}),
            ("GET", sv.STATUS_PATH, None),
        ):
            code, body, _ = call(pod, method, path, message, key=planted)
            assert code == 401
            assert "the mounted control key is not the operator's" in str(body["error"])
        assert ready(pod) == 200
        assert "the key Secret was not made by the operator" in pod.log()


def test_a_start_cannot_inject_environment(tmp_path: Path) -> None:
    with launch.gang(
        launch.wirings(attempt=1), tmp_path / "pods", supervised_env(tmp_path)
    ) as gang:
        pod = gang.pods[0]
        gang.start(CHECK, only=[0])
        running(gang, [pod])
        call(pod, "POST", sv.STOP_PATH, {"attempt": 1, "grace_seconds": 5})
        until(
            "the child stopped",
            lambda: call(pod, "GET", sv.STATUS_PATH)[1]["state"] == "exited",
            60,
            gang,
        )
        for env in ({"LD_PRELOAD": "/tmp/evil.so"}, {"PYTHONSTARTUP": "/tmp/evil.py"}):
            code, body, _ = call(pod, "POST", sv.START_PATH, {"attempt": 2, "env": env})
            assert code == 400 and "is not allowed" in str(body["error"]), body
        code, status, _ = call(pod, "GET", sv.STATUS_PATH)
        assert (status["state"], status["attempt"]) == ("exited", 1)  # nothing was started


def test_a_slow_loris_flood_does_not_silence_readiness(tmp_path: Path) -> None:
    """150 connections that each send half a request and then nothing: the supervisor
    holds at most its cap of them (a thread each), closes the oldest as new ones come,
    and its readiness probe and the operator's commands are answered all along."""
    with launch.gang(
        launch.wirings(attempt=1), tmp_path / "pods", supervised_env(tmp_path)
    ) as gang:
        pod = gang.pods[0]
        gang.start(CHECK, only=[0])
        running(gang, [pod])
        assert pod.process is not None
        before = threads_of(pod.process.pid)
        flood: list[socket.socket] = []
        closed = 0
        try:
            for index in range(150):
                conn = socket.create_connection((pod.ip, contract.DEFAULT_CONTROL_PORT), timeout=30)
                conn.sendall(b"POST /v1/stop HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{")
                flood.append(conn)
                if index % 25 == 24:
                    assert ready(pod) == 200, f"readiness silenced after {index + 1} connections"
                    code, _, _ = call(pod, "GET", sv.STATUS_PATH)
                    assert code == 200
            peak = threads_of(pod.process.pid)
            assert peak - before <= MAX_CONNECTIONS + 2, (before, peak)
            for conn in flood[:50]:  # the oldest were closed to make room
                conn.settimeout(30)
                try:
                    closed += conn.recv(100) == b""
                except ConnectionResetError:
                    closed += 1
            assert closed == 50
            assert ready(pod) == 200
        finally:
            for conn in flood:
                conn.close()
        assert pod.poll() is None


# -- the operator's channel against hostile supervisors ------------------------------------

HOSTILE = textwrap.dedent(
    """
    import socket, sys, threading
    mode, host, port, report = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    server = socket.create_server((host, port), backlog=512)
    print("listening", flush=True)
    def serve(conn):
        sent = 0
        try:
            conn.recv(65536)
            if mode == "silent":
                threading.Event().wait()
            # No Content-Length: the body runs until the connection closes (1 GiB).
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nConnection: close\\r\\n\\r\\n")
            chunk = b"{" * 1048576
            for _ in range(1024):  # 1 GiB
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            with open(report, "a") as out:
                out.write(f"{sent}\\n")
            conn.close()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    """
)


def hostile(mode: str, host: str, report: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOSTILE,
            mode,
            host,
            str(contract.DEFAULT_CONTROL_PORT),
            str(report),
        ],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline() == b"listening\n"
    return process


def test_supervisors_that_stall_or_flood_leave_the_other_jobs_control_traffic_alone(
    tmp_path: Path,
) -> None:
    """Job A's pods: a supervisor that takes requests and never answers; job A2's: one
    that answers a gigabyte. The operator's channel sends their requests as a reconcile
    would (many at once), and job B's to a real supervisor meanwhile: B's are answered
    before any of A's ends, the gigabyte is cut at the cap, and A's requests end in
    their timeout."""
    wirings = launch.wirings(attempt=1)
    with launch.gang(wirings, tmp_path / "pods", supervised_env(tmp_path)) as gang:
        honest = gang.pods[0]
        gang.start(CHECK, only=[0])
        running(gang, [honest])
        block = honest.ip.rsplit(".", 1)[0]
        silent_ip, flood_ip = f"{block}.101", f"{block}.102"
        reports = tmp_path / "silent.txt", tmp_path / "flood.txt"
        servers = [hostile("silent", silent_ip, reports[0]), hostile("flood", flood_ip, reports[1])]
        try:
            outcome = asyncio.run(_attack(honest, silent_ip, flood_ip))
        finally:
            for server in servers:
                server.kill()
                server.wait()
    answered_while_stuck, silent_errors, flood_errors = outcome
    assert answered_while_stuck == 10
    assert silent_errors and all("no answer within 5 s" in e for e in silent_errors)
    cut = f"passed the {MAX_ANSWER_BYTES}-byte cap; cut there"
    assert flood_errors and all(cut in e for e in flood_errors), flood_errors
    sent = [int(line) for line in reports[1].read_text().split()]
    assert sent and max(sent) < 256 * 1024 * 1024, sent  # far from the gigabyte


async def _attack(
    honest: launch.Pod, silent_ip: str, flood_ip: str
) -> tuple[int, list[str], list[str]]:
    # The job whose key the honest supervisor has: derive_job_key(master, uid) == KEY is
    # not something a test can choose, so the channel's key derivation is bypassed.
    channel = ControlChannel(b"master-key-of-the-attack-test")
    channel.key_for = lambda job_uid: KEY  # type: ignore[method-assign]
    try:
        stuck = [
            asyncio.create_task(channel.status("job-a", f"pod-{i}", silent_ip))
            for i in range(PER_JOB + 20)
        ]
        flooded = [
            asyncio.create_task(channel.status("job-a2", f"pod-{i}", flood_ip)) for i in range(4)
        ]
        await asyncio.sleep(0.5)  # A's requests are sent and waiting
        answered = 0
        for _ in range(10):
            state = await channel.status("job-b", honest.uid, honest.ip)
            answered += state.state == "running" and not any(t.done() for t in stuck)
        results = await asyncio.gather(*stuck, *flooded, return_exceptions=True)
    finally:
        await channel.close()
    errors = [str(r) for r in results]
    assert all(isinstance(r, ControlError) for r in results), results
    return answered, errors[: len(stuck)], errors[len(stuck) :]
