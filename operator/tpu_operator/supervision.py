"""The supervisor's control channel: request signing, verification and message shapes.

Shared by the operator (which signs commands to a worker pod's supervisor) and the
worker (whose supervisor verifies them). Standard library only: every worker process
loads it, and it must not pull in kopf, kubernetes or jax.

Authentication: every request on an authenticated path carries

    Authorization: TPU-HMAC ts=<unix seconds>,nonce=<32 hex>,sig=<hex>

with ``sig = HMAC-SHA256(key, METHOD \\n path \\n ts \\n nonce \\n sha256hex(body))``. The
key is per job (``derive_job_key`` of the operator's master key and the job's uid) and is
mounted into the job's pods from a Secret; it never crosses the network. The verifier
accepts a timestamp within ``MAX_SKEW_S`` of its clock and each nonce once within that
window, so a captured request cannot be replayed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, cast, get_args

# Paths of the supervisor's control server.
READY_PATH: Final = "/readyz"  # unauthenticated: 200 while the training process runs
STATUS_PATH: Final = "/v1/status"  # GET
STOP_PATH: Final = "/v1/stop"  # POST StopRequest
START_PATH: Final = "/v1/start"  # POST StartRequest
CHECKPOINT_PATH: Final = "/v1/checkpoint"  # POST CheckpointRequest
AUTHENTICATED_PATHS: Final = (STATUS_PATH, STOP_PATH, START_PATH, CHECKPOINT_PATH)

SCHEME: Final = "TPU-HMAC"
MAX_SKEW_S: Final = 30.0
# Nonces remembered at most (a bound on memory; older ones leave the window anyway).
MAX_NONCES: Final = 10_000
NONCE_HEX: Final = 32
MAX_BODY_BYTES: Final = 64 * 1024

_HEADER = re.compile(r"^TPU-HMAC ts=(\d{1,12}),nonce=([0-9a-f]{32}),sig=([0-9a-f]{64})$")
_JOB_KEY_CONTEXT: Final = b"tpu-operator/job/"


class AuthError(Exception):
    """A request's Authorization is missing or wrong; the message says what is wrong."""


class MessageError(ValueError):
    """A control message body does not have the expected shape."""


def derive_job_key(master: bytes, job_uid: str) -> bytes:
    """The control key of one job: HMAC-SHA256(master, "tpu-operator/job/" + uid)."""
    if not master:
        raise ValueError("the master key is empty")
    return hmac.new(master, _JOB_KEY_CONTEXT + job_uid.encode(), hashlib.sha256).digest()


def _string_to_sign(method: str, path: str, ts: str, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([method.upper(), path, ts, nonce, digest]).encode()


def _signature(key: bytes, method: str, path: str, ts: str, nonce: str, body: bytes) -> str:
    return hmac.new(key, _string_to_sign(method, path, ts, nonce, body), hashlib.sha256).hexdigest()


def sign(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
    nonce: str | None = None,
) -> str:
    """The ``Authorization`` header value for one request."""
    if not key:
        raise ValueError("cannot sign with an empty key")
    ts = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(NONCE_HEX // 2) if nonce is None else nonce
    sig = _signature(key, method, path, ts, nonce, body)
    return f"{SCHEME} ts={ts},nonce={nonce},sig={sig}"


class Verifier:
    """Checks signed requests; remembers the nonces it accepted within the skew window.

    ``load_key`` is called on every ``verify`` (the key file may be replaced in place): it
    returns the key, or None when no key is available (every request is then refused).
    Thread-safe.
    """

    def __init__(
        self,
        load_key: Callable[[], bytes | None],
        max_skew_s: float = MAX_SKEW_S,
        max_nonces: int = MAX_NONCES,
    ) -> None:
        self._load_key = load_key
        self._max_skew_s = max_skew_s
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> ts, oldest first
        self._lock = threading.Lock()

    def verify(
        self,
        header: str | None,
        method: str,
        path: str,
        body: bytes,
        now: float | None = None,
    ) -> None:
        """Return if the request is authentic and fresh; raise AuthError otherwise."""
        key = self._load_key()
        if not key:
            raise AuthError("no control key mounted")
        if not header:
            raise AuthError(f"missing Authorization header (want {SCHEME} ts=,nonce=,sig=)")
        match = _HEADER.match(header.strip())
        if match is None:
            raise AuthError(
                f"malformed Authorization header (want {SCHEME} ts=<unix seconds>,"
                f"nonce=<{NONCE_HEX} hex>,sig=<64 hex>)"
            )
        ts_text, nonce, sig = match.groups()
        now = time.time() if now is None else now
        skew = int(ts_text) - now
        if abs(skew) > self._max_skew_s:
            direction = "in the future" if skew > 0 else "old"
            raise AuthError(
                f"stale timestamp: {abs(skew):.0f}s {direction} (at most "
                f"{self._max_skew_s:g}s accepted; check the clocks)"
            )
        expected = _signature(key, method, path, ts_text, nonce, body)
        if not hmac.compare_digest(expected, sig):
            raise AuthError("bad signature (wrong key, or method, path or body changed)")
        with self._lock:
            self._forget(now)
            if nonce in self._seen:
                raise AuthError("replayed nonce")
            self._seen[nonce] = float(ts_text)
            while len(self._seen) > self._max_nonces:
                self._seen.popitem(last=False)

    def _forget(self, now: float) -> None:
        horizon = now - 2 * self._max_skew_s
        stale = [n for n, ts in self._seen.items() if ts < horizon]
        for nonce in stale:
            del self._seen[nonce]


# -- messages --------------------------------------------------------------------------

State = Literal["running", "exited", "stopping", "idle"]
STATES: Final[tuple[str, ...]] = get_args(State)


def _object(data: bytes | str | Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise MessageError(f"{kind}: body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise MessageError(f"{kind}: body must be a JSON object, got {type(value).__name__}")
    return value


def _field(obj: Mapping[str, Any], kind: str, name: str, types: tuple[type, ...]) -> Any:
    if name not in obj:
        raise MessageError(f"{kind}: missing field {name!r}")
    value = obj[name]
    # bool is an int in Python; never accept it for a number.
    if isinstance(value, bool) and bool not in types:
        raise MessageError(f"{kind}: {name} must be {_names(types)}, got bool")
    if not isinstance(value, types):
        raise MessageError(f"{kind}: {name} must be {_names(types)}, got {type(value).__name__}")
    return value


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _attempt(obj: Mapping[str, Any], kind: str) -> int:
    attempt = cast(int, _field(obj, kind, "attempt", (int,)))
    if attempt < 0:
        raise MessageError(f"{kind}: attempt must be >= 0, got {attempt}")
    return attempt


def _number(obj: Mapping[str, Any], kind: str, name: str) -> float:
    value = float(_field(obj, kind, name, (int, float)))
    if not math.isfinite(value) or value < 0:
        raise MessageError(f"{kind}: {name} must be a finite number >= 0, got {value}")
    return value


def _optional(obj: Mapping[str, Any], kind: str, name: str, typ: type) -> Any:
    types = (int, float, type(None)) if typ is float else (typ, type(None))
    value = _field(obj, kind, name, types)
    return float(value) if typ is float and value is not None else value


class _Message:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()


@dataclass(frozen=True)
class StopRequest(_Message):
    """Stop the training process of ``attempt`` (or older): SIGTERM, then SIGKILL after
    ``grace_seconds``."""

    attempt: int
    grace_seconds: float

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> StopRequest:
        obj = _object(data, "stop request")
        return cls(_attempt(obj, "stop request"), _number(obj, "stop request", "grace_seconds"))


@dataclass(frozen=True)
class StartRequest(_Message):
    """Start the training process of ``attempt`` with ``env`` on top of the pod's env."""

    attempt: int
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> StartRequest:
        kind = "start request"
        obj = _object(data, kind)
        env = _field(obj, kind, "env", (dict,))
        for name, value in env.items():
            if not isinstance(value, str) or not name:
                raise MessageError(f"{kind}: env must map names to strings; {name!r} does not")
        return cls(_attempt(obj, kind), dict(env))


@dataclass(frozen=True)
class CheckpointRequest(_Message):
    """Ask the running training process to save a checkpoint at its next step; ``id`` makes
    a repeated request a no-op."""

    attempt: int
    id: str

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> CheckpointRequest:
        kind = "checkpoint request"
        obj = _object(data, kind)
        ident = cast(str, _field(obj, kind, "id", (str,)))
        if not ident or len(ident) > 128:
            raise MessageError(f"{kind}: id must be 1 to 128 characters")
        return cls(_attempt(obj, kind), ident)


@dataclass(frozen=True)
class SupervisorStatus(_Message):
    """What the supervisor reports: its training process's state and last exit."""

    state: State
    attempt: int
    pid: int | None = None
    started_at: float | None = None
    exit_code: int | None = None
    exit_reason: str | None = None
    exited_at: float | None = None
    checkpoints: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> SupervisorStatus:
        kind = "supervisor status"
        obj = _object(data, kind)
        state = _field(obj, kind, "state", (str,))
        if state not in STATES:
            raise MessageError(f"{kind}: state must be one of {', '.join(STATES)}, got {state!r}")
        checkpoints = _field(obj, kind, "checkpoints", (list,))
        if not all(isinstance(c, str) for c in checkpoints):
            raise MessageError(f"{kind}: checkpoints must be a list of strings")
        return cls(
            state=cast(State, state),
            attempt=_attempt(obj, kind),
            pid=_optional(obj, kind, "pid", int),
            started_at=_optional(obj, kind, "started_at", float),
            exit_code=_optional(obj, kind, "exit_code", int),
            exit_reason=_optional(obj, kind, "exit_reason", str),
            exited_at=_optional(obj, kind, "exited_at", float),
            checkpoints=list(checkpoints),
        )
