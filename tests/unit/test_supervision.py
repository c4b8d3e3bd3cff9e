"""The control channel's protocol (``tpu_operator.supervision``): signing, verification,
messages, and the contract constants of the supervisor."""

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


def verifier(key: bytes | None = KEY) -> sv.Verifier:
    return sv.Verifier(lambda: key)


def signed(**overrides: object) -> str:
    args: dict[str, object] = {
        "key": KEY,
        "method": "POST",
        "path": sv.STOP_PATH,
        "body": BODY,
        "now": NOW,
    }
    args.update(overrides)
    return sv.sign(**args)  # type: ignore[arg-type]


def test_header_format() -> None:
    header = signed(nonce="ab" * 16)
    assert re.fullmatch(r"TPU-HMAC ts=1800000000,nonce=(ab){16},sig=[0-9a-f]{64}", header)
    assert signed() != signed(), "every signature gets a fresh nonce"


def test_round_trip() -> None:
    verifier().verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW + 5)


def test_a_get_without_body_round_trips() -> None:
    header = sv.sign(KEY, "GET", sv.STATUS_PATH, b"", now=NOW)
    verifier().verify(header, "GET", sv.STATUS_PATH, b"", now=NOW)


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
        verifier(b"x" * 32).verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)


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
    v = sv.Verifier(lambda: KEY, max_nonces=3)
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
    keys = [KEY]
    v = sv.Verifier(lambda: keys[0])
    v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)
    keys[0] = b"rotated"
    with pytest.raises(sv.AuthError, match="bad signature"):
        v.verify(signed(), "POST", sv.STOP_PATH, BODY, now=NOW)
    v.verify(signed(key=b"rotated"), "POST", sv.STOP_PATH, BODY, now=NOW)


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
        (sv.StartRequest, {"attempt": 1, "env": []}, "env must be dict"),
        (sv.StartRequest, {"attempt": 1, "env": {"A": 1}}, "env must map names to strings"),
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


def test_the_module_is_standard_library_only() -> None:
    for name in ("kopf", "kubernetes", "jax"):
        assert name not in vars(sv), name
    source = Path(sv.__file__).read_text()
    imported = set(re.findall(r"^(?:from|import) (\w+)", source, re.M))
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_control_port_collides_with_nothing() -> None:
    assert contract.DEFAULT_CONTROL_PORT not in contract.RESERVED_PORTS
    others = {contract.DEFAULT_METRICS_PORT, contract.DEFAULT_COORDINATOR_PORT}
    assert contract.DEFAULT_CONTROL_PORT not in others
