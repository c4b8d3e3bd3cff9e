"""Pure parts of the supervisor: its decisions and status, the control server's HTTP and
authentication layer, the key loader, and the checkpoint-request agreement."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tpu_operator import catalog, contract
from tpu_operator import supervision as sv
from tpu_operator.builders.wiring import PodWiring, resolved_env, world_env
from tpu_worker.control import ControlServer, key_loader
from tpu_worker.reporting import CHECKPOINT_LEAD_STEPS, Reporter, agreed_step
from tpu_worker.supervisor import (
    Action,
    Child,
    Supervisor,
    awaits_start,
    child_env,
    decide_checkpoint,
    decide_start,
    decide_stop,
    exit_after_stop,
    exit_code,
    exit_reason,
    is_ready,
    status_of,
    supervising,
)

pytestmark = pytest.mark.unit

RUNNING_2 = Child(attempt=2, pid=10, started_at=1.0)
EXITED_2 = Child(attempt=2, pid=10, started_at=1.0, returncode=1, exited_at=2.0)


@pytest.mark.parametrize(
    ("child", "attempt", "action"),
    [
        (None, 0, Action.ACT),
        (RUNNING_2, 2, Action.NOTHING),  # repeated start
        (RUNNING_2, 1, Action.NOTHING),  # an older attempt's start
        (EXITED_2, 2, Action.NOTHING),  # that attempt ran already
        (RUNNING_2, 3, Action.CONFLICT),  # stop attempt 2 first
        (EXITED_2, 3, Action.ACT),
    ],
)
def test_start_decisions(child: Child | None, attempt: int, action: Action) -> None:
    assert decide_start(child, attempt) is action


@pytest.mark.parametrize(
    ("child", "attempt", "action"),
    [
        (None, 1, Action.NOTHING),
        (EXITED_2, 2, Action.NOTHING),  # already ended: answered at once
        (EXITED_2, 1, Action.NOTHING),
        (RUNNING_2, 2, Action.ACT),
        (RUNNING_2, 5, Action.ACT),
        (RUNNING_2, 1, Action.CONFLICT),  # never stop a newer attempt
    ],
)
def test_stop_decisions(child: Child | None, attempt: int, action: Action) -> None:
    assert decide_stop(child, attempt) is action


def test_checkpoint_decisions() -> None:
    assert decide_checkpoint(RUNNING_2, 2, seen=False) is Action.ACT
    assert decide_checkpoint(RUNNING_2, 2, seen=True) is Action.NOTHING
    assert decide_checkpoint(RUNNING_2, 1, seen=False) is Action.CONFLICT
    assert decide_checkpoint(EXITED_2, 2, seen=False) is Action.CONFLICT
    assert decide_checkpoint(None, 2, seen=False) is Action.CONFLICT
    stopping = Child(attempt=2, pid=10, started_at=1.0, stopping=True)
    assert decide_checkpoint(stopping, 2, seen=False) is Action.CONFLICT


def test_status_follows_the_child() -> None:
    assert status_of(None).state == "idle"
    assert status_of(RUNNING_2).state == "running"
    stopping = Child(attempt=2, pid=10, started_at=1.0, stopping=True)
    assert status_of(stopping).state == "stopping"
    killed = Child(attempt=2, pid=10, started_at=1.0, returncode=-9, exited_at=3.0)
    status = status_of(killed, ["c"])
    assert (status.state, status.exit_code, status.exit_reason) == (
        "exited",
        137,
        "Signaled: SIGKILL",
    )
    assert (status.exited_at, status.checkpoints) == (3.0, ["c"])
    assert sv.SupervisorStatus.from_json(status.to_json()) == status


def test_exit_codes_and_reasons() -> None:
    assert (exit_code(0), exit_reason(0)) == (0, "Exited")
    assert (exit_code(75), exit_reason(75)) == (75, "Exited")
    assert (exit_code(-signal.SIGTERM), exit_reason(-signal.SIGTERM)) == (143, "Signaled: SIGTERM")


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        (None, contract.EXIT_RETRYABLE),  # no child ran
        (contract.EXIT_RETRYABLE, contract.EXIT_RETRYABLE),  # checkpointed and exited 75
        (-signal.SIGTERM, contract.EXIT_RETRYABLE),  # died of SIGTERM before its handler
        (1, 1),  # failed on its own while stopping: the failure stands
        (-signal.SIGKILL, 137),  # did not end within its grace
    ],
)
def test_exit_code_after_sigterm(returncode: int | None, expected: int) -> None:
    assert exit_after_stop(returncode) == expected


def test_child_env_and_who_supervises() -> None:
    env = child_env({"A": "1", contract.ENV_RESTART_ATTEMPT: "1"}, {"A": "2"})
    assert env == {"A": "2", contract.ENV_RESTART_ATTEMPT: "1", contract.ENV_SUPERVISED_CHILD: "1"}
    megascale = {contract.ENV_MEGASCALE_NUM_SLICES: "2", "B": "1"}
    unset = child_env(megascale, {contract.ENV_MEGASCALE_NUM_SLICES: "", "B": ""})
    assert unset == {"B": "", contract.ENV_SUPERVISED_CHILD: "1"}  # only the Megascale names
    assert supervising({contract.ENV_CONTROL_PORT: "9432"})
    assert not supervising({})
    assert not supervising(env | {contract.ENV_CONTROL_PORT: "9432"})


def test_the_key_loader_rereads_a_changed_file(tmp_path: Path) -> None:
    path = tmp_path / "key"
    load = key_loader(path)
    assert load() is None
    path.write_bytes(b"")
    assert load() is None
    path.write_bytes(b"first")
    assert load() == b"first"
    replacement = tmp_path / "new"
    replacement.write_bytes(b"second")
    replacement.replace(path)  # how a Secret volume is updated: a new file
    assert load() == b"second"


# -- checkpoint-request agreement ---------------------------------------------------------


class SharedStore:
    """The coordination service's key-value store, for processes in one test."""

    def __init__(self, processes: int) -> None:
        self.data: dict[int, dict[int, int]] = {}
        self.processes = processes

    def view(self, process: int) -> _View:
        return _View(self, process)


class _View:
    def __init__(self, store: SharedStore, process: int) -> None:
        self._store, self._process = store, process
        self.processes = store.processes

    def propose(self, sequence: int, step: int) -> None:
        self._store.data.setdefault(sequence, {})[self._process] = step

    def proposals(self, sequence: int) -> list[int]:
        return list(self._store.data.get(sequence, {}).values())


def test_agreed_step_needs_every_process() -> None:
    assert agreed_step([5], 2) is None
    assert agreed_step([5, 7], 2) == 7


def test_a_single_process_saves_at_the_next_step() -> None:
    reporter = Reporter()
    assert not reporter.checkpoint_requested(1)
    reporter.request_checkpoint()
    assert reporter.checkpoint_requested(2)
    assert not reporter.checkpoint_requested(3), "one request, one checkpoint"
    assert reporter.metrics.checkpoint_requests._value.get() == 1


def test_processes_a_step_apart_agree_on_one_step() -> None:
    store = SharedStore(2)
    reporters = [Reporter(), Reporter()]
    for index, reporter in enumerate(reporters):
        reporter.use_checkpoint_exchange(store.view(index))
    reporters[0].request_checkpoint()
    saved: dict[int, list[int]] = {0: [], 1: []}
    # Process 0 checks at step 5 first; process 1 gets the request a step later.
    for step in range(5, 20):
        for index, reporter in enumerate(reporters):
            if index == 1 and step == 6:
                reporter.request_checkpoint()
            if reporter.checkpoint_requested(step):
                saved[index].append(step)
    assert saved[0] == saved[1] == [6 + CHECKPOINT_LEAD_STEPS]


# -- the control server over HTTP -----------------------------------------------------------

KEY = b"test-key"
POD = "3f2b1c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"


def sign(key: bytes, method: str, path: str, body: bytes, pod: str = POD) -> str:
    return sv.sign(key, method, path, body, pod=pod)


class RecordingController:
    """Answers every command with a fixed status and records what reached it."""

    def __init__(self) -> None:
        self.calls: list[object] = []
        self.status_value = sv.SupervisorStatus(state="running", attempt=1, pid=5)

    def ready(self) -> bool:
        return self.status_value.state == "running"

    def status(self) -> sv.SupervisorStatus:
        return self.status_value

    def stop(self, request: sv.StopRequest) -> tuple[int, sv.SupervisorStatus]:
        self.calls.append(request)
        return 200, self.status_value

    def start(self, request: sv.StartRequest) -> tuple[int, sv.SupervisorStatus]:
        self.calls.append(request)
        return 409, self.status_value

    def checkpoint(self, request: sv.CheckpointRequest) -> tuple[int, sv.SupervisorStatus]:
        self.calls.append(request)
        return 200, self.status_value


@pytest.fixture
def served() -> Iterator[tuple[RecordingController, str]]:
    controller = RecordingController()
    server = ControlServer(
        controller, sv.Verifier(lambda: KEY, POD, sv.key_id(KEY)), "127.0.0.1", 0
    )
    try:
        yield controller, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def _exchange(
    url: str, path: str, body: bytes, header: str | None
) -> tuple[int, bytes, str | None]:
    """(code, body, the answer's signature header)."""
    request = urllib.request.Request(url + path, data=body, method="POST")
    if header:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers.get(sv.ANSWER_HEADER)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get(sv.ANSWER_HEADER)


def _post(url: str, path: str, body: bytes, header: str | None) -> tuple[int, bytes]:
    code, answer, _ = _exchange(url, path, body, header)
    return code, answer


def test_the_server_passes_on_only_authentic_well_formed_commands(
    served: tuple[RecordingController, str],
) -> None:
    controller, url = served
    stop = json.dumps({"attempt": 1, "grace_seconds": 2}).encode()
    header = sign(KEY, "POST", sv.STOP_PATH, stop)
    code, body, signature = _exchange(url, sv.STOP_PATH, stop, header)
    assert (code, json.loads(body)["state"]) == (200, "running")
    assert controller.calls == [sv.StopRequest(1, 2.0)]
    # The answer is signed for this request: the operator checks it.
    sv.verify_answer(KEY, POD, sv.nonce_of(header), 200, body, signature)
    code, body, signature = _exchange(
        url, sv.STOP_PATH, stop, sign(b"other", "POST", sv.STOP_PATH, stop)
    )
    assert signature is None  # a refusal is not signed
    assert (code, json.loads(body)) == (
        401,
        {"error": "bad signature (wrong key, or method, path or body changed)"},
    )
    bad = b'{"attempt": "x", "grace_seconds": 1}'
    code, body = _post(url, sv.STOP_PATH, bad, sign(KEY, "POST", sv.STOP_PATH, bad))
    assert code == 400 and b"attempt must be int" in body
    start = json.dumps({"attempt": 2, "env": {}}).encode()
    code, _ = _post(url, sv.START_PATH, start, sign(KEY, "POST", sv.START_PATH, start))
    assert code == 409  # the controller's answer, passed through
    assert len(controller.calls) == 2
    # A start that would set anything but the contract's variables never reaches it.
    evil = json.dumps({"attempt": 2, "env": {"LD_PRELOAD": "/tmp/x.so"}}).encode()
    code, body = _post(url, sv.START_PATH, evil, sign(KEY, "POST", sv.START_PATH, evil))
    assert code == 400 and b"env 'LD_PRELOAD' is not allowed" in body
    # Signed for another pod of the job: refused here.
    other = sign(KEY, "POST", sv.STOP_PATH, stop, pod="another-pod-uid")
    code, body = _post(url, sv.STOP_PATH, stop, other)
    assert code == 401 and b"signed for another pod" in body
    assert len(controller.calls) == 2
    assert _post(url, "/v1/other", b"{}", None)[0] == 404
    assert _post(url, sv.START_PATH, b"x" * (sv.MAX_BODY_BYTES + 1), None)[0] == 413
    assert len(controller.calls) == 2


def test_readiness_is_open_and_says_nothing_more(served: tuple[RecordingController, str]) -> None:
    controller, url = served
    with urllib.request.urlopen(url + sv.READY_PATH, timeout=30) as response:
        assert (response.status, response.read()) == (200, b"ok")
    controller.status_value = sv.SupervisorStatus(state="exited", attempt=1, exit_code=1)
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url + sv.READY_PATH, timeout=30)
    assert (error.value.code, error.value.read()) == (503, b"not running")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url + sv.STATUS_PATH, timeout=30)
    assert error.value.code == 401


def test_readiness_holds_across_the_operators_own_stop_only() -> None:
    running = Child(attempt=1, pid=10, started_at=0.0)
    ended = Child(attempt=1, pid=10, started_at=0.0, returncode=1, exited_at=5.0)
    assert is_ready(running, None, 1.0)
    assert not is_ready(ended, None, 6.0)  # ended on its own: the operator must notice
    assert not is_ready(replace(running, stopping=True), None, 6.0)
    assert is_ready(ended, 65.0, 6.0)  # stopped on command, the next start is coming
    assert not is_ready(ended, 65.0, 66.0)  # no start came: NotReady after all
    assert not is_ready(None, None, 0.0)


def test_half_sent_requests_cannot_crowd_out_readiness() -> None:
    """More connections than the cap, each with half a request: the oldest are closed as
    new ones come, and a whole request (the kubelet's probe) is answered every time."""
    controller = RecordingController()
    verifier = sv.Verifier(lambda: KEY, POD, sv.key_id(KEY))
    server = ControlServer(controller, verifier, "127.0.0.1", 0, max_connections=8)
    flood: list[socket.socket] = []
    threads = threading.active_count()
    try:
        for index in range(40):
            conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            conn.sendall(b"POST /v1/stop HTTP/1.1\r\nHost: x\r\nContent-Length: 10")
            flood.append(conn)
            if index % 10 == 9:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}{sv.READY_PATH}", timeout=30
                ) as response:
                    assert (response.status, response.read()) == (200, b"ok")
        assert server._server.evicted >= 40 - 8
        # A thread per connection, at most 8 of them held (the closed ones' threads end).
        deadline = time.monotonic() + 30
        while threading.active_count() - threads > 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() - threads <= 8
        # The closed ones see the end of their connection.
        flood[0].settimeout(30)
        assert flood[0].recv(100) == b""
    finally:
        for conn in flood:
            conn.close()
        server.close()


def test_a_request_sent_too_slowly_is_cut_at_the_deadline() -> None:
    controller = RecordingController()
    verifier = sv.Verifier(lambda: KEY, POD, sv.key_id(KEY))
    server = ControlServer(controller, verifier, "127.0.0.1", 0, deadline_s=1.0)
    try:
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        conn.sendall(b"GET /readyz HTTP/1.1\r\n")
        conn.settimeout(30)
        assert conn.recv(100) == b""  # closed by the server, the request never finished
        assert server._server.evicted == 1
        conn.close()
    finally:
        server.close()


def _pod(num_slices: int, slice_index: int, attempt: int, names: tuple[str, ...]) -> PodWiring:
    """Worker 0 of the slice named ``names[slice_index]`` in a job of ``num_slices``."""
    return PodWiring(
        job_name="elastic",
        service="elastic",
        slice_name=names[slice_index],
        shape=catalog.shape("tpu-v5p-slice", "2x2x2", 4),
        num_slices=num_slices,
        slice_index=slice_index,
        worker_index=1,
        attempt=attempt,
        slice_names=names,
    )


ALL = ("elastic-0", "elastic-1", "elastic-2")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # slice 1 of 3 lost: slice 2 becomes slice 1 of 2
        (_pod(3, 2, 1, ALL), _pod(2, 1, 2, ("elastic-0", "elastic-2"))),
        # slice 0 lost: another coordinator, every id moves
        (_pod(3, 2, 1, ALL), _pod(2, 1, 2, ("elastic-1", "elastic-2"))),
        # down to one slice: the Megascale variables go
        (_pod(2, 1, 1, ALL[:2]), _pod(1, 0, 2, ("elastic-1",))),
        # grown back from one slice to three: they come back
        (_pod(1, 0, 3, ("elastic-1",)), _pod(3, 1, 4, ALL)),
    ],
)
def test_a_start_moves_a_kept_pods_process_into_a_changed_world(
    before: PodWiring, after: PodWiring
) -> None:
    """The env a start command may carry (``world_env``, accepted by the control channel's
    check) turns the pod's env into exactly the env of a pod built for the new world."""
    pod_env = resolved_env(before, "10.0.0.7")
    start = sv.StartRequest.from_json({"attempt": after.attempt, "env": world_env(after)})
    env = child_env(pod_env, start.env)
    assert env.pop(contract.ENV_SUPERVISED_CHILD) == "1"
    assert env == resolved_env(after, "10.0.0.7")
    assert env != pod_env


@pytest.mark.parametrize(
    ("value", "waits"),
    [(None, False), ("", False), ("false", False), ("true", True), ("True", True)],
)
def test_a_pod_created_mid_restart_waits_for_the_start(value: str | None, waits: bool) -> None:
    env = {} if value is None else {contract.ENV_AWAIT_START: value}
    assert awaits_start(env) is waits


def test_a_waiting_supervisor_starts_nothing_until_told() -> None:
    """No child (it would be ``python -m tpu_worker``) until a start command; SIGTERM
    while waiting ends the supervisor as a stop asked from outside."""
    supervisor = Supervisor(["demo"], {contract.ENV_AWAIT_START: "true"}, 5.0)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisor.run(60.0, poll_s=0.05)))
    thread.start()
    time.sleep(0.3)
    status = supervisor.status()
    assert (status.state, status.attempt, supervisor.ready()) == ("idle", 0, False)
    supervisor.terminate()
    thread.join(5)
    assert codes == [contract.EXIT_RETRYABLE]
