"""The supervisor's control channel: request and answer signing, verification, messages.

Shared by the operator (which signs commands to a worker pod's supervisor and checks its
answers) and the worker (whose supervisor verifies the commands and signs its answers).
Standard library only, besides ``tpu_operator.contract`` (which is too): every worker
process loads it, and it must not pull in kopf, kubernetes or jax.

Requests. Every request on an authenticated path carries

    Authorization: TPU-HMAC pod=<pod uid>,ts=<unix seconds>,nonce=<32 hex>,sig=<64 hex>

with ``sig = HMAC-SHA256(key, "TPU-HMAC request" \n METHOD \n path \n pod uid \n ts \n
nonce \n sha256hex(body))``. The key is per job (``derive_job_key`` of the operator's
master key and the job's uid) and is mounted into the job's pods from a Secret; it never
crosses the network. A supervisor accepts only requests signed for its own pod's UID, with
a timestamp within ``MAX_SKEW_S`` of its clock, each nonce once within that window: a
captured request is good for one pod, once.

Answers. The supervisor's answer to an accepted request carries

    TPU-Signature: sig=<64 hex>

with ``sig = HMAC-SHA256(key, "TPU-HMAC answer" \n pod uid \n request nonce \n HTTP code \n
sha256hex(body))``: bound to the request it answers, so neither another process on the
pod's address nor a replayed answer can tell the operator a process stopped.

Keys. A supervisor uses a mounted key only if its ``key_id`` equals the id the operator
wrote into the pod's env (``contract.ENV_CONTROL_KEY_ID``): a Secret that someone else
created under the key Secret's name cannot hold a key with that id without knowing the
job's key.
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

from tpu_operator import contract

# Paths of the supervisor's control server.
READY_PATH: Final = "/readyz"  # unauthenticated: 200 while the training process runs
STATUS_PATH: Final = "/v1/status"  # GET
STOP_PATH: Final = "/v1/stop"  # POST StopRequest
START_PATH: Final = "/v1/start"  # POST StartRequest
CHECKPOINT_PATH: Final = "/v1/checkpoint"  # POST CheckpointRequest
AUTHENTICATED_PATHS: Final = (STATUS_PATH, STOP_PATH, START_PATH, CHECKPOINT_PATH)

SCHEME: Final = "TPU-HMAC"
ANSWER_HEADER: Final = "TPU-Signature"
MAX_SKEW_S: Final = 30.0
# Nonces remembered at most (a bound on memory; older ones leave the window anyway).
MAX_NONCES: Final = 10_000
NONCE_HEX: Final = 32
KEY_ID_HEX: Final = 32
MAX_BODY_BYTES: Final = 64 * 1024
"""Largest request body a supervisor reads (413 above) and largest answer the operator
reads (the rest is cut)."""
STOP_ANSWER_WAIT_S: Final = 3.0
"""A stop is answered once the process ended, or after this long with state
``stopping`` (SIGKILL still follows after the grace); the operator asks again."""
MAX_GRACE_S: Final = 3600.0
"""The largest ``grace_seconds`` a stop request may carry."""
MAX_ENV_VALUE: Final = 1024

_HEADER = re.compile(
    r"^TPU-HMAC pod=([0-9A-Za-z-]{1,64}),ts=(\d{1,12}),nonce=([0-9a-f]{32}),sig=([0-9a-f]{64})$"
)
_ANSWER = re.compile(r"^sig=([0-9a-f]{64})$")
_JOB_KEY_CONTEXT: Final = b"tpu-operator/job/"
_KEY_ID_CONTEXT: Final = b"tpu-operator/key-id"
_REQUEST: Final = "TPU-HMAC request"
_ANSWER_CONTEXT: Final = "TPU-HMAC answer"


class AuthError(Exception):
    """A request's Authorization (or an answer's signature) is missing or wrong; the
    message says what is wrong."""


class MessageError(ValueError):
    """A control message body does not have the expected shape."""


def derive_job_key(master: bytes, job_uid: str) -> bytes:
    """The control key of one job: HMAC-SHA256(master, "tpu-operator/job/" + uid)."""
    if not master:
        raise ValueError("the master key is empty")
    return hmac.new(master, _JOB_KEY_CONTEXT + job_uid.encode(), hashlib.sha256).digest()


def key_id(key: bytes) -> str:
    """A key's public id: HMAC-SHA256(key, "tpu-operator/key-id"), first 32 hex digits.
    It names the job's key Secret and goes into its pods' env; it reveals nothing of the
    key, and only the key's holder can make a key with a given id."""
    if not key:
        raise ValueError("an empty key has no id")
    return hmac.new(key, _KEY_ID_CONTEXT, hashlib.sha256).hexdigest()[:KEY_ID_HEX]


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _signature(
    key: bytes, method: str, path: str, pod: str, ts: str, nonce: str, body: bytes
) -> str:
    text = "\n".join([_REQUEST, method.upper(), path, pod, ts, nonce, _digest(body)])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _answer_signature(key: bytes, pod: str, nonce: str, code: int, body: bytes) -> str:
    text = "\n".join([_ANSWER_CONTEXT, pod, nonce, str(code), _digest(body)])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX // 2)


def sign(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    *,
    pod: str,
    now: float | None = None,
    nonce: str | None = None,
) -> str:
    """The ``Authorization`` header value for one request to the supervisor of ``pod``
    (its UID)."""
    if not key:
        raise ValueError("cannot sign with an empty key")
    if not pod:
        raise ValueError("a request is signed for one pod: its UID is missing")
    ts = str(int(time.time() if now is None else now))
    nonce = new_nonce() if nonce is None else nonce
    sig = _signature(key, method, path, pod, ts, nonce, body)
    return f"{SCHEME} pod={pod},ts={ts},nonce={nonce},sig={sig}"


def nonce_of(header: str) -> str:
    """The nonce of a request's ``Authorization`` header (to check the answer)."""
    match = _HEADER.match(header.strip())
    if match is None:
        raise ValueError("not a TPU-HMAC header")
    return match.group(3)


@dataclass(frozen=True)
class Accepted:
    """A request the verifier accepted: what its answer is signed with."""

    key: bytes = field(repr=False)
    pod: str
    nonce: str

    def sign_answer(self, code: int, body: bytes) -> str:
        """The ``TPU-Signature`` header value of the answer."""
        return f"sig={_answer_signature(self.key, self.pod, self.nonce, code, body)}"


def verify_answer(
    key: bytes, pod: str, nonce: str, code: int, body: bytes, header: str | None
) -> None:
    """Return if ``header`` signs this answer to the request with ``nonce`` sent to
    ``pod``; raise AuthError otherwise."""
    if not header:
        raise AuthError(f"the answer has no {ANSWER_HEADER} header")
    match = _ANSWER.match(header.strip())
    if match is None:
        raise AuthError(f"malformed {ANSWER_HEADER} header (want sig=<64 hex>)")
    expected = _answer_signature(key, pod, nonce, code, body)
    if not hmac.compare_digest(expected, match.group(1)):
        raise AuthError("bad answer signature (not the pod's supervisor, or not this request's)")


class Verifier:
    """Checks signed requests for one pod; remembers the nonces it accepted within the
    skew window.

    ``load_key`` is called on every ``verify`` (the key file may be replaced in place): it
    returns the key, or None when no key is available (every request is then refused).
    ``pod_uid`` is this pod's UID, ``expected_key_id`` the id of the key the operator gave
    the pod; without either every request is refused. Thread-safe.
    """

    def __init__(
        self,
        load_key: Callable[[], bytes | None],
        pod_uid: str,
        expected_key_id: str,
        max_skew_s: float = MAX_SKEW_S,
        max_nonces: int = MAX_NONCES,
    ) -> None:
        self._load_key = load_key
        self._pod = pod_uid
        self._key_id = expected_key_id
        self._max_skew_s = max_skew_s
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> ts, oldest first
        self._lock = threading.Lock()

    def key_problem(self) -> str | None:
        """Why no request can be accepted now (no key, no pod UID, a key that is not the
        operator's), or None."""
        return self._problem(self._load_key())

    def _problem(self, key: bytes | None) -> str | None:
        if not key:
            return "no control key mounted"
        if not self._pod:
            return f"the pod's UID is unknown ({contract.ENV_POD_UID} is not set)"
        if not self._key_id:
            return f"the pod has no key id ({contract.ENV_CONTROL_KEY_ID} is not set)"
        if not hmac.compare_digest(key_id(key), self._key_id):
            return (
                f"the mounted control key is not the operator's: its id does not match "
                f"{contract.ENV_CONTROL_KEY_ID} (the key Secret was not made by the operator)"
            )
        return None

    def verify(
        self,
        header: str | None,
        method: str,
        path: str,
        body: bytes,
        now: float | None = None,
    ) -> Accepted:
        """Return what the answer is signed with if the request is authentic, fresh and
        for this pod; raise AuthError otherwise."""
        key = self._load_key()
        problem = self._problem(key)
        if problem is not None or key is None:
            raise AuthError(problem or "no control key mounted")
        if not header:
            raise AuthError(f"missing Authorization header (want {SCHEME} pod=,ts=,nonce=,sig=)")
        match = _HEADER.match(header.strip())
        if match is None:
            raise AuthError(
                f"malformed Authorization header (want {SCHEME} pod=<pod uid>,ts=<unix "
                f"seconds>,nonce=<{NONCE_HEX} hex>,sig=<64 hex>)"
            )
        pod, ts_text, nonce, sig = match.groups()
        if pod != self._pod:
            raise AuthError(f"signed for another pod ({pod}; this is {self._pod})")
        now = time.time() if now is None else now
        skew = int(ts_text) - now
        if abs(skew) > self._max_skew_s:
            direction = "in the future" if skew > 0 else "old"
            raise AuthError(
                f"stale timestamp: {abs(skew):.0f}s {direction} (at most "
                f"{self._max_skew_s:g}s accepted; check the clocks)"
            )
        expected = _signature(key, method, path, pod, ts_text, nonce, body)
        if not hmac.compare_digest(expected, sig):
            raise AuthError("bad signature (wrong key, or method, path or body changed)")
        with self._lock:
            self._forget(now)
            if nonce in self._seen:
                raise AuthError("replayed nonce")
            self._seen[nonce] = float(ts_text)
            while len(self._seen) > self._max_nonces:
                self._seen.popitem(last=False)
        return Accepted(key, pod, nonce)

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
        kind = "stop request"
        obj = _object(data, kind)
        grace = _number(obj, kind, "grace_seconds")
        if grace > MAX_GRACE_S:
            raise MessageError(
                f"{kind}: grace_seconds must be at most {MAX_GRACE_S:g}, got {grace:g}"
            )
        return cls(_attempt(obj, kind), grace)


@dataclass(frozen=True)
class StartRequest(_Message):
    """Start the training process of ``attempt`` with ``env`` on top of the pod's env.

    ``env`` may name only ``contract.START_ENV``: the attempt number and the variables that
    place the process in its job's world (``contract.WORLD_ENV``: process id and count,
    slice id and count, coordinators), each with a value of its kind; an empty value unsets
    one of ``contract.UNSET_ENV``. A start command cannot put LD_PRELOAD, PYTHONPATH or any
    other variable into a training process."""

    attempt: int
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> StartRequest:
        kind = "start request"
        obj = _object(data, kind)
        attempt = _attempt(obj, kind)
        env = _field(obj, kind, "env", (dict,))
        return cls(attempt, check_start_env(env, attempt, kind))


# What a start command's values may look like, by name: counts and ids are decimal
# numbers, coordinators a host name or IP address, with a port where the contract has one.
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])"
_NUMBER = (re.compile(r"\d{1,6}"), "a decimal number")
_HOST_PORT = (re.compile(rf"{_HOST}:\d{{1,5}}"), "host:port")
_START_VALUES: Final[dict[str, tuple[re.Pattern[str], str]]] = {
    contract.ENV_RESTART_ATTEMPT: _NUMBER,
    contract.ENV_JAX_COORDINATOR_ADDRESS: _HOST_PORT,
    contract.ENV_PROCESS_ID: _NUMBER,
    contract.ENV_NUM_PROCESSES: _NUMBER,
    contract.ENV_SLICE_INDEX: _NUMBER,
    contract.ENV_NUM_SLICES: _NUMBER,
    contract.ENV_MEGASCALE_NUM_SLICES: _NUMBER,
    contract.ENV_MEGASCALE_SLICE_ID: _NUMBER,
    contract.ENV_MEGASCALE_COORDINATOR_ADDRESS: (
        re.compile(rf"{_HOST}(?::\d{{1,5}})?"),
        "a host, or host:port",
    ),
    contract.ENV_MEGASCALE_PORT: _NUMBER,
}


def check_start_env(
    env: Mapping[str, Any], attempt: int, kind: str = "start request"
) -> dict[str, str]:
    """``env`` of a start command for ``attempt`` if the contract allows it, else
    MessageError naming the variable and what is allowed."""
    allowed = ", ".join(contract.START_ENV)
    for name, value in env.items():
        if name not in contract.START_ENV:
            raise MessageError(
                f"{kind}: env {str(name)[:64]!r} is not allowed (a start may set only {allowed})"
            )
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\0" in value:
            raise MessageError(
                f"{kind}: env {name} must be a string of at most {MAX_ENV_VALUE} characters"
            )
        if value == "" and name in contract.UNSET_ENV:
            continue  # unset in the child's env
        pattern, what = _START_VALUES[name]
        if not pattern.fullmatch(value):
            unset = " or empty (unset)" if name in contract.UNSET_ENV else ""
            raise MessageError(f"{kind}: env {name}={value[:64]!r} must be {what}{unset}")
    given = env.get(contract.ENV_RESTART_ATTEMPT)
    if given is not None and given != str(attempt):
        raise MessageError(
            f"{kind}: env {contract.ENV_RESTART_ATTEMPT}={given!r} is not the attempt {attempt}"
        )
    return dict(env)


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
