"""The control channel's protocol (``tpu_operator.supervision``): signing for one pod,
verification, signed answers, key ids, messages (the start env allow-list), and the
contract constants of the supervisor."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tpu_operator import contract
from tpu_operator import supervision as sv

pytestmark = pytest.mark.unit

KEY = b"k" * 32
NOW = 1_800_000_000.0
BODY = b'{"attempt": 2, "grace_seconds": 10}'
POD = "0b5e2a8c-6d1f-4c3e-9a7b-2f4d6e8a1c3b"
OTHER_POD = "7c1d9e3f-2a4b-4d6c-8e0f-1a3b5c7d9e2f"


def verifier(key: bytes | None = KEY, pod: str = POD, key_id: str | None = None) -> sv.Verifier:
    return sv.Verifier(lambda: key, pod, sv.key_id(KEY) if key_id is None else key_id)


def signed(**overrides: object) -> str:
    args: dict[str, object] = {
        "key": KEY,
        "method": "POST",
        "path": sv.STOP_PATH,
        "body": BODY,
        "now": NOW,
        "pod": POD,
    }
    args.update(overrides)
    return sv.sign(**args)  # type: ignore[arg-type]


def test_header_format() -> None:
    header = signed(nonce="ab" * 16)
    assert re.fullmatch(
        rf"TPU-HMAC pod={POD},ts=1800000000,nonce=(ab){{16}},sig=[0-9a-f]{{64}}", header
    )
    assert signed() != signed(), "every signature gets a fresh nonce"
    assert sv.nonce_of(signed(nonce="cd" * 16)) == "cd" * 16
    with pytest.raises(ValueError, match="UID is missing"):
        signed(pod="")


def test_round_trip() -> None:
    verifier().verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW + 5)


def test_a_get_without_body_round_trips() -> None:
    header = sv.sign(KEY, "GET", sv.STATUS_PATH, b"", pod=POD, now=NOW)
    verifier().verify(header, "GET", sv.STATUS_PATH, b"", now=NOW)


def test_a_request_is_good_for_its_own_pod_only() -> None:
    """A request captured on its way to one pod and replayed on another pod of the job
    (same key, that pod never saw the nonce) is refused there, and the refusal says why."""
    header = signed()
    verifier(pod=POD).verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)
    with pytest.raises(
        sv.AuthError, match=f"signed for another pod \\({POD}; this is {OTHER_POD}\\)"
    ):
        verifier(pod=OTHER_POD).verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)
    # The pod is in the signed text: rewriting the header's pod breaks the signature.
    forged = header.replace(f"pod={POD}", f"pod={OTHER_POD}")
    with pytest.raises(sv.AuthError, match="bad signature"):
        verifier(pod=OTHER_POD).verify(forged, "POST", sv.STOP_PATH, BODY, now=NOW)


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("POST", sv.STOP_PATH, BODY + b" ", "bad signature"),
        ("POST", sv.START_PATH, BODY, "bad signature"),
        ("GET", sv.STOP_PATH, BODY, "bad signature"),
    ],
    ids=["tampered body", "other path", "other method"],
)
def test_tampering_is_refused(method: str, path: str, body: bytes, message: str) -> None:
    with pytest.raises(sv.AuthError, match=message):
        verifier().verify(signed(), method, path, body, now=NOW)


def test_wrong_key_is_refused() -> None:
    with pytest.raises(sv.AuthError, match="bad signature"):
        other = b"x" * 32
        verifier(other, key_id=sv.key_id(other)).verify(
            signed(), "POST", sv.STOP_PATH, BODY, now=NOW
        )


@pytest.mark.parametrize(("offset", "word"), [(-31, "old"), (31, "in the future")])
def test_stale_timestamps_are_refused(offset: float, word: str) -> None:
    with pytest.raises(sv.AuthError, match=f"stale timestamp: 31s {word}"):
        verifier().verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW - offset)


def test_the_skew_window_edges_are_accepted() -> None:
    v = verifier()
    v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW + 30)
    v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW - 30)


def test_a_replay_is_refused() -> None:
    v = verifier()
    header = signed()
    v.verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)
    with pytest.raises(sv.AuthError, match="replayed nonce"):
        v.verify(header, "POST", sv.STOP_PATH, BODY, now=NOW + 1)


def test_a_refused_request_does_not_burn_its_nonce() -> None:
    v = verifier()
    header = signed()
    with pytest.raises(sv.AuthError):
        v.verify(header, "POST", sv.STOP_PATH, BODY + b"x", now=NOW)
    v.verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)


def test_nonce_memory_is_bounded() -> None:
    v = sv.Verifier(lambda: KEY, POD, sv.key_id(KEY), max_nonces=3)
    for _ in range(10):
        v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)
    assert len(v._seen) == 3
    # Nonces older than the window are forgotten (their timestamps are refused anyway).
    v.verify(signed(now=NOW + 100), "POST", sv.STOP_PATH, BODY, now=NOW + 100)
    assert len(v._seen) == 1


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing Authorization header"),
        ("", "missing Authorization header"),
        ("Bearer abc", "malformed"),
        ("TPU-HMAC ts=1,nonce=zz,sig=00", "malformed"),
        ("TPU-HMAC ts=1800000000,nonce=" + "a" * 32, "malformed"),
        # The format without a pod (a request that would be good for every pod).
        ("TPU-HMAC ts=1800000000,nonce=" + "a" * 32 + ",sig=" + "0" * 64, "malformed"),
    ],
)
def test_missing_or_malformed_headers_are_refused(header: str | None, message: str) -> None:
    with pytest.raises(sv.AuthError, match=message):
        verifier().verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)


@pytest.mark.parametrize("key", [None, b""])
def test_without_a_key_everything_is_refused(key: bytes | None) -> None:
    with pytest.raises(sv.AuthError, match="no control key mounted"):
        verifier(key).verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)


def test_the_key_is_loaded_on_every_verify() -> None:
    keys = [b"first"]
    v = sv.Verifier(lambda: keys[0], POD, sv.key_id(KEY))
    with pytest.raises(sv.AuthError, match="not the operator's"):
        v.verify(signed(key=b"first"), "POST", sv.STOP_PATH, BODY, now=NOW)
    keys[0] = KEY
    v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)


def test_a_key_without_the_pods_key_id_is_never_used() -> None:
    """A key Secret someone else made under the job's Secret name: its key (theirs) does
    not have the id the operator put into the pod, so even requests they sign with it are
    refused."""
    planted = b"the planter's own key, 32 bytes!"
    v = sv.Verifier(lambda: planted, POD, sv.key_id(KEY))
    assert "not the operator's" in (v.key_problem() or "")
    with pytest.raises(sv.AuthError, match="the key Secret was not made by the operator"):
        v.verify(signed(key=planted), "POST", sv.STOP_PATH, BODY, now=NOW)
    assert verifier().key_problem() is None


@pytest.mark.parametrize(
    ("pod", "key_id", "message"),
    [
        ("", None, "TPU_OPERATOR_POD_UID is not set"),
        (POD, "", "TPU_OPERATOR_CONTROL_KEY_ID is not set"),
    ],
)
def test_without_the_pods_uid_or_key_id_everything_is_refused(
    pod: str, key_id: str | None, message: str
) -> None:
    with pytest.raises(sv.AuthError, match=message):
        verifier(pod=pod, key_id=key_id).verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)


def test_key_ids_are_public_names_of_keys() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", sv.key_id(KEY))
    assert sv.key_id(KEY) == sv.key_id(bytes(KEY))
    assert sv.key_id(KEY) != sv.key_id(b"x" * 32)
    with pytest.raises(ValueError, match="empty"):
        sv.key_id(b"")


def test_answers_are_signed_for_their_request() -> None:
    header = signed()
    accepted = verifier().verify(header, "POST", sv.STOP_PATH, BODY, now=NOW)
    nonce = sv.nonce_of(header)
    answer = b'{"state": "exited"}'
    signature = accepted.sign_answer(200, answer)
    sv.verify_answer(KEY, POD, nonce, 200, answer, signature)
    for key, pod, other_nonce, code, body in (
        (b"x" * 32, POD, nonce, 200, answer),  # not the job's key
        (KEY, OTHER_POD, nonce, 200, answer),  # another pod's answer
        (KEY, POD, "f" * 32, 200, answer),  # the answer to another request (a replay)
        (KEY, POD, nonce, 409, answer),  # the code changed
        (KEY, POD, nonce, 200, b'{"state": "running"}'),  # the body changed
    ):
        with pytest.raises(sv.AuthError, match="bad answer signature"):
            sv.verify_answer(key, pod, other_nonce, code, body, signature)
    with pytest.raises(sv.AuthError, match="has no TPU-Signature"):
        sv.verify_answer(KEY, POD, nonce, 200, answer, None)
    with pytest.raises(sv.AuthError, match="malformed"):
        sv.verify_answer(KEY, POD, nonce, 200, answer, "sig=nothex")


def test_job_keys_differ_per_job_and_master() -> None:
    a = sv.derive_job_key(b"master", "uid-a")
    assert len(a) == 32
    assert a == sv.derive_job_key(b"master", "uid-a")
    assert a != sv.derive_job_key(b"master", "uid-b")
    assert a != sv.derive_job_key(b"other", "uid-a")
    with pytest.raises(ValueError, match="empty"):
        sv.derive_job_key(b"", "uid-a")


def test_messages_round_trip() -> None:
    messages: list[Any] = [
        sv.StopRequest(attempt=1, grace_seconds=2.5),
        sv.StartRequest(attempt=2, env={contract.ENV_RESTART_ATTEMPT: "2"}),
        sv.CheckpointRequest(attempt=2, id="c-1"),
        sv.SupervisorStatus(
            state="exited",
            attempt=2,
            pid=10,
            started_at=1.5,
            exit_code=75,
            exit_reason="Exited",
            exited_at=3.0,
            checkpoints=["c-1"],
        ),
        sv.SupervisorStatus(state="idle", attempt=0),
    ]
    for message in messages:
        assert type(message).from_json(message.to_json()) == message


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        (sv.StopRequest, b"[1]", "must be a JSON object"),
        (sv.StopRequest, b"{", "not JSON"),
        (sv.StopRequest, {"grace_seconds": 1}, "missing field 'attempt'"),
        (sv.StopRequest, {"attempt": "1", "grace_seconds": 1}, "attempt must be int, got str"),
        (sv.StopRequest, {"attempt": True, "grace_seconds": 1}, "got bool"),
        (sv.StopRequest, {"attempt": -1, "grace_seconds": 1}, "attempt must be >= 0"),
        (sv.StopRequest, {"attempt": 1, "grace_seconds": -1}, "finite number >= 0"),
        (sv.StopRequest, {"attempt": 1, "grace_seconds": 3601}, "at most 3600"),
        (sv.StartRequest, {"attempt": 1, "env": []}, "env must be dict"),
        (
            sv.StartRequest,
            {"attempt": 1, "env": {"TPU_OPERATOR_RESTART_ATTEMPT": 1}},
            "TPU_OPERATOR_RESTART_ATTEMPT must be a string",
        ),
        (sv.CheckpointRequest, {"attempt": 1, "id": ""}, "id must be 1 to 128"),
        (sv.CheckpointRequest, {"attempt": 1, "id": 7}, "id must be str"),
        (
            sv.SupervisorStatus,
            {"state": "dead", "attempt": 1, "checkpoints": []},
            "state must be one of",
        ),
        (
            sv.SupervisorStatus,
            {"state": "running", "attempt": 1, "pid": "1", "checkpoints": []},
            "pid must be int or null",
        ),
    ],
)
def test_bad_messages_are_refused_with_a_clear_message(
    kind: Any, body: object, message: str
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(sv.MessageError, match=message):
        kind.from_json(data)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LD_PRELOAD": "/tmp/evil.so"}, "env 'LD_PRELOAD' is not allowed"),
        ({"PYTHONPATH": "/tmp"}, "env 'PYTHONPATH' is not allowed"),
        ({"PYTHONSTARTUP": "/tmp/x.py"}, "env 'PYTHONSTARTUP' is not allowed"),
        ({contract.ENV_TPU_WORKER_HOSTNAMES: "evil"}, "is not allowed"),
        ({contract.ENV_RESTART_ATTEMPT: "3"}, "is not the attempt 2"),
        ({contract.ENV_RESTART_ATTEMPT: "2\x00"}, "must be a string"),
        ({contract.ENV_RESTART_ATTEMPT: "2" * 2000}, "at most 1024"),
        ({contract.ENV_RESTART_ATTEMPT: ""}, "must be a decimal number"),
        ({contract.ENV_PROCESS_ID: "-1"}, "TPU_OPERATOR_PROCESS_ID='-1' must be a decimal"),
        ({contract.ENV_NUM_PROCESSES: ""}, "must be a decimal number$"),
        ({contract.ENV_JAX_COORDINATOR_ADDRESS: "evil"}, "must be host:port$"),
        ({contract.ENV_JAX_COORDINATOR_ADDRESS: "a:1 --flag"}, "must be host:port"),
        ({contract.ENV_MEGASCALE_NUM_SLICES: "two"}, "a decimal number or empty"),
        ({contract.ENV_MEGASCALE_COORDINATOR_ADDRESS: "a/b"}, "a host, or host:port or empty"),
    ],
)
def test_a_start_sets_only_the_contracts_variables(env: dict[str, str], message: str) -> None:
    body = json.dumps({"attempt": 2, "env": env}).encode()
    with pytest.raises(sv.MessageError, match=message) as refused:
        sv.StartRequest.from_json(body)
    if "not allowed" in message:
        allowed = ", ".join(contract.START_ENV)
        assert f"a start may set only {allowed}" in str(refused.value)


def test_a_start_with_the_attempt_its_world_or_nothing_is_accepted() -> None:
    good = {"attempt": 2, "env": {contract.ENV_RESTART_ATTEMPT: "2"}}
    assert sv.StartRequest.from_json(json.dumps(good)).env == {contract.ENV_RESTART_ATTEMPT: "2"}
    assert sv.StartRequest.from_json(json.dumps({"attempt": 2, "env": {}})).env == {}
    world = {
        contract.ENV_RESTART_ATTEMPT: "2",
        contract.ENV_JAX_COORDINATOR_ADDRESS: "job-1-0.job:8482",
        contract.ENV_PROCESS_ID: "3",
        contract.ENV_NUM_PROCESSES: "4",
        contract.ENV_SLICE_INDEX: "1",
        contract.ENV_NUM_SLICES: "2",
        contract.ENV_MEGASCALE_NUM_SLICES: "2",
        contract.ENV_MEGASCALE_SLICE_ID: "1",
        contract.ENV_MEGASCALE_COORDINATOR_ADDRESS: "job-1-0.job",
        contract.ENV_MEGASCALE_PORT: "8080",
    }
    assert sv.StartRequest.from_json({"attempt": 2, "env": world}).env == world
    single = dict.fromkeys(contract.UNSET_ENV, "")
    assert sv.StartRequest.from_json({"attempt": 2, "env": single}).env == single
    ipv6 = {contract.ENV_JAX_COORDINATOR_ADDRESS: "[fd00::1]:8482"}
    assert sv.StartRequest.from_json({"attempt": 2, "env": ipv6}).env == ipv6
    # Only the attempt and the world: nothing that runs code or moves a pod's own identity.
    assert set(contract.START_ENV) == {contract.ENV_RESTART_ATTEMPT, *contract.WORLD_ENV}
    assert set(contract.UNSET_ENV) < set(contract.WORLD_ENV)
    assert contract.ENV_TPU_WORKER_ID not in contract.START_ENV


def test_the_module_is_standard_library_only() -> None:
    for name in ("kopf", "kubernetes", "jax"):
        assert name not in vars(sv), name
    source = Path(sv.__file__).read_text()
    imported = set(re.findall(r"^(?:from|import) (\w+)", source, re.M))
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "tpu_operator"}, imported
    # From the project, only the contract (standard library only itself).
    assert re.findall(r"^from tpu_operator import (.+)$", source, re.M) == ["contract"]
    contract_source = Path(contract.__file__).read_text()
    assert not re.findall(r"^(?:from|import) tpu_operator", contract_source, re.M)


def test_the_control_port_collides_with_nothing() -> None:
    assert contract.DEFAULT_CONTROL_PORT not in contract.RESERVED_PORTS
    others = {contract.DEFAULT_METRICS_PORT, contract.DEFAULT_COORDINATOR_PORT}
    assert contract.DEFAULT_CONTROL_PORT not in others
