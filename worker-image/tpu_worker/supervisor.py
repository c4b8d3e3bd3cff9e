"""``tpu-worker`` as a supervisor: run the training command as a child, restart it on command.

When the pod env sets ``contract.ENV_CONTROL_PORT`` (and this process is not itself a
supervised child), ``tpu-worker run|demo|check`` does not train: it serves the control
channel (``tpu_worker.control``) and runs the same command line as a child process
(``python -m tpu_worker <argv>`` with ``contract.ENV_SUPERVISED_CHILD=1``), which is the
ordinary worker. The operator stops the child of a failed attempt and starts the next
attempt in the same pod (in-place gang restart). This process never imports JAX.

In a pod created while its job restarts in place (``contract.ENV_AWAIT_START``) the
supervisor starts no child until the operator's start command: the new attempt's
processes start together, once every process of the previous one stopped.

Exit: the child's exit 0 ends the supervisor with 0. A failed child is kept as "exited"
while the supervisor waits up to ``contract.ENV_SUPERVISOR_WAIT`` seconds for a start
command, then exits with the child's code (the pod fails; the operator recreates pods).
SIGTERM/SIGINT is passed to the child (it checkpoints), and the supervisor exits with the
child's code (``exit_after_stop``: 75 for a child the SIGTERM itself killed).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_worker.control import ControlServer, key_loader

log = logging.getLogger("tpu_worker.supervisor")

# Seconds the supervisor waits for its child beyond the child's termination grace.
STOP_MARGIN_S = 10.0
# Seconds readiness stays up after the operator's stop command while it starts the next
# attempt (in-place restart); past this the pod shows NotReady like any stopped process.
COMMANDED_HOLD_S = 60.0
# Checkpoint request ids remembered (for idempotency) per supervisor.
MAX_CHECKPOINT_IDS = 100
_PR_SET_PDEATHSIG = 1


# -- pure decisions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Child:
    """One training process the supervisor started (``returncode`` None while it runs)."""

    attempt: int
    pid: int
    started_at: float
    returncode: int | None = None
    exited_at: float | None = None
    stopping: bool = False

    @property
    def running(self) -> bool:
        return self.returncode is None


class Action(Enum):
    NOTHING = "nothing"  # answer 200 with the status, change nothing
    CONFLICT = "conflict"  # answer 409 with the status
    ACT = "act"  # do it


def decide_start(child: Child | None, attempt: int) -> Action:
    """A start command for ``attempt``, given the last child."""
    if child is None:
        return Action.ACT
    if child.attempt >= attempt:
        return Action.NOTHING  # that attempt (or a newer one) runs or has run
    if child.running:
        return Action.CONFLICT  # stop the older attempt first
    return Action.ACT


def decide_stop(child: Child | None, attempt: int) -> Action:
    """A stop command for ``attempt`` (or older), given the last child."""
    if child is None or not child.running:
        return Action.NOTHING
    if child.attempt > attempt:
        return Action.CONFLICT  # never stop a newer attempt
    return Action.ACT


def decide_checkpoint(child: Child | None, attempt: int, seen: bool) -> Action:
    """A checkpoint request for ``attempt``; ``seen``: its id was acknowledged before."""
    if seen:
        return Action.NOTHING
    if child is None or not child.running or child.stopping or child.attempt != attempt:
        return Action.CONFLICT
    return Action.ACT


def exit_code(returncode: int) -> int:
    """A process exit code as a shell reports it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def exit_after_stop(returncode: int | None) -> int:
    """The supervisor's exit code once SIGTERM stopped the child (``returncode``: the
    child's, None if there was none). A child that handled SIGTERM exits as it decides
    (75 after a checkpoint). One that died of the SIGTERM itself had not installed its
    handler yet (still importing JAX): that is a stop asked from outside, not a failed
    attempt, so it is retryable too."""
    if returncode is None or returncode == -signal.SIGTERM:
        return contract.EXIT_RETRYABLE
    return exit_code(returncode)


def exit_reason(returncode: int) -> str:
    if returncode >= 0:
        return "Exited"
    try:
        return f"Signaled: {signal.Signals(-returncode).name}"
    except ValueError:
        return f"Signaled: {-returncode}"


def status_of(child: Child | None, checkpoints: Sequence[str] = ()) -> sv.SupervisorStatus:
    if child is None:
        return sv.SupervisorStatus(state="idle", attempt=0, checkpoints=list(checkpoints))
    running: sv.State = "stopping" if child.stopping else "running"
    state: sv.State = running if child.running else "exited"
    code = child.returncode
    return sv.SupervisorStatus(
        state=state,
        attempt=child.attempt,
        pid=child.pid,
        started_at=child.started_at,
        exit_code=None if code is None else exit_code(code),
        exit_reason=None if code is None else exit_reason(code),
        exited_at=child.exited_at,
        checkpoints=list(checkpoints),
    )


def child_env(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The env of a child: the pod's env, the start command's overrides (an empty value
    unsets one of ``contract.UNSET_ENV``: a single-slice world has no Megascale
    variables), the child marker."""
    env = {**base, **overrides, contract.ENV_SUPERVISED_CHILD: "1"}
    for name, value in overrides.items():
        if value == "" and name in contract.UNSET_ENV:
            del env[name]
    return env


def child_argv(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "tpu_worker", *argv]


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={text!r} must be >= 0")
    return value


def key_path(env: Mapping[str, str]) -> Path:
    override = env.get(contract.ENV_CONTROL_KEY_FILE, "").strip()
    return Path(override or f"{contract.CONTROL_KEY_DIR}/{contract.CONTROL_KEY_FILE}")


def is_ready(child: Child | None, held_until: float | None, now: float) -> bool:
    """The readiness the operator's probe reads: the training process runs, or the
    operator itself stopped it (``held_until``: a stop command, until the start of the next
    attempt or the hold runs out). A process that ends on its own turns the pod NotReady,
    which is how the operator learns of it; its own stop -> start does not flip readiness
    (two status writes per pod saved at every in-place restart)."""
    if held_until is not None and now < held_until:
        return True
    return child is not None and child.running and not child.stopping


def awaits_start(env: Mapping[str, str]) -> bool:
    """The pod was created while its job restarts in place: no training process before
    the operator's start command (``contract.ENV_AWAIT_START``)."""
    return env.get(contract.ENV_AWAIT_START, "").strip().lower() == "true"


def attempt_of(env: Mapping[str, str]) -> int:
    try:
        return max(0, int(env.get(contract.ENV_RESTART_ATTEMPT, "0") or 0))
    except ValueError:
        return 0


# -- the supervisor ---------------------------------------------------------------------------


def die_with_parent() -> None:
    """In a supervised child: get SIGKILL when the supervisor dies (no orphaned training)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Supervisor:
    """Owns the child process; the control server's threads call its commands."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], termination_grace_s: float
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._grace_s = termination_grace_s
        self._lock = threading.Condition()
        self._child: Child | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._checkpoints: list[str] = []
        self._terminating = False
        self._pending: tuple[int, dict[str, str]] | None = None  # a start for the main thread
        self._held_until: float | None = None  # readiness held across a commanded stop
        self._kill_at = 0.0  # monotonic time of the stopping child's SIGKILL

    # -- queries (any thread) --

    def ready(self) -> bool:
        with self._lock:
            return is_ready(self._child, self._held_until, time.monotonic())

    def status(self) -> sv.SupervisorStatus:
        with self._lock:
            return status_of(self._child, self._checkpoints)

    # -- commands (control server threads) --

    def start(self, request: sv.StartRequest) -> tuple[int, sv.SupervisorStatus]:
        with self._lock:
            action = decide_start(self._child, request.attempt)
            if action is Action.ACT and (self._terminating or self._pending is not None):
                action = Action.CONFLICT
            if action is Action.ACT:
                # The main thread spawns every child (a child dies with the thread that
                # started it: PR_SET_PDEATHSIG), so hand it over and wait.
                self._pending = (request.attempt, dict(request.env))
                self._lock.notify_all()
                self._lock.wait_for(lambda: self._pending is None, timeout=30)
                if self._pending is not None:  # the supervisor is exiting: not started
                    self._pending = None
                    action = Action.CONFLICT
            elif action is Action.CONFLICT:
                log.warning(
                    "start of attempt %d refused: attempt %d still runs; stop it first",
                    request.attempt,
                    self._child.attempt if self._child else -1,
                )
            code = 409 if action is Action.CONFLICT else 200
            return code, status_of(self._child, self._checkpoints)

    def stop(self, request: sv.StopRequest) -> tuple[int, sv.SupervisorStatus]:
        with self._lock:
            action = decide_stop(self._child, request.attempt)
            if action is Action.CONFLICT:
                log.warning(
                    "stop of attempt %d refused: the running child is attempt %d",
                    request.attempt,
                    self._child.attempt if self._child else -1,
                )
                return 409, status_of(self._child, self._checkpoints)
            if action is Action.NOTHING or self._child is None:
                return 200, status_of(self._child, self._checkpoints)
            self._held_until = time.monotonic() + COMMANDED_HOLD_S
            pid = self._child.pid
            self._signal_stop(request.grace_seconds, f"stop command for attempt {request.attempt}")
            # Answered once the process ended, or after a few seconds with "stopping": a
            # stop never holds the operator (or a connection) for the whole grace period.
            self._lock.wait_for(lambda: self._ended(pid), timeout=sv.STOP_ANSWER_WAIT_S)
            return 200, status_of(self._child, self._checkpoints)

    def checkpoint(self, request: sv.CheckpointRequest) -> tuple[int, sv.SupervisorStatus]:
        with self._lock:
            seen = request.id in self._checkpoints
            action = decide_checkpoint(self._child, request.attempt, seen)
            if action is Action.ACT and self._child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._child.pid, signal.SIGUSR1)
                log.info("checkpoint %r requested of attempt %d", request.id, request.attempt)
                self._checkpoints = [*self._checkpoints, request.id][-MAX_CHECKPOINT_IDS:]
            code = 409 if action is Action.CONFLICT else 200
            return code, status_of(self._child, self._checkpoints)

    # -- child processes --

    def _spawn(self, attempt: int, overrides: Mapping[str, str]) -> None:
        """Start a child (with the lock held)."""
        env = child_env(self._env, overrides)
        popen = subprocess.Popen(child_argv(self._argv), env=env, start_new_session=True)
        self._popen = popen
        self._held_until = None
        self._child = Child(attempt=attempt, pid=popen.pid, started_at=time.time())
        log.info("started the training process of attempt %d: pid %d", attempt, popen.pid)
        threading.Thread(
            target=self._reap, args=(popen,), name=f"tpu-worker-child-{popen.pid}", daemon=True
        ).start()

    def _reap(self, popen: subprocess.Popen[bytes]) -> None:
        returncode = popen.wait()
        with self._lock:
            child = self._child
            if child is not None and child.pid == popen.pid:
                self._child = replace(child, returncode=returncode, exited_at=time.time())
                log.info(
                    "the training process of attempt %d (pid %d) ended: %s, code %d",
                    child.attempt,
                    child.pid,
                    exit_reason(returncode),
                    exit_code(returncode),
                )
            self._lock.notify_all()

    def _signal_stop(self, grace_s: float, why: str) -> None:
        """SIGTERM the running child's process group, SIGKILL after ``grace_s`` (with the
        lock held; does not wait). A child already stopping gets no second SIGTERM; its
        SIGKILL comes no later than ``grace_s`` from now."""
        child = self._child
        if child is None or not child.running:
            return
        kill_at = time.monotonic() + grace_s
        if child.stopping:
            if kill_at < self._kill_at:
                self._kill_at = kill_at
                self._lock.notify_all()
            return
        self._child = replace(child, stopping=True)
        self._kill_at = kill_at
        log.info("%s: SIGTERM to the training process (pid %d)", why, child.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        threading.Thread(
            target=self._kill_after,
            args=(child.pid,),
            name=f"tpu-worker-kill-{child.pid}",
            daemon=True,
        ).start()

    def _kill_after(self, pid: int) -> None:
        """SIGKILL the stopping child ``pid`` once its grace is over, unless it ended."""
        with self._lock:
            while not self._ended(pid):
                left = self._kill_at - time.monotonic()
                if left <= 0:
                    log.warning(
                        "the training process (pid %d) did not end within its grace after "
                        "SIGTERM: SIGKILL",
                        pid,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    return
                self._lock.wait(timeout=left)

    def _stop_child(self, grace_s: float, why: str) -> None:
        """SIGTERM the running child's process group, SIGKILL after ``grace_s``; wait."""
        with self._lock:
            child = self._child
            if child is None or not child.running:
                return
            self._signal_stop(grace_s, why)
            self._lock.wait_for(lambda: self._ended(child.pid), timeout=grace_s + 30)

    def _ended(self, pid: int) -> bool:
        child = self._child
        return child is None or child.pid != pid or not child.running

    # -- main thread --

    def terminate(self) -> None:
        """SIGTERM/SIGINT to the supervisor (signal handler: takes no lock; the main loop
        polls the flag)."""
        self._terminating = True

    def _wake(self, waiting: bool) -> bool:
        child = self._child
        ended = child is not None and not child.running
        return self._terminating or self._pending is not None or (ended and not waiting)

    def run(self, wait_s: float, poll_s: float = 0.2) -> int:
        """Start the first child (or, in a pod created while its job restarts in place,
        wait for the start command) and supervise until the supervisor should exit."""
        with self._lock:
            if awaits_start(self._env):
                log.info("waiting for the operator's start command (%s)", contract.ENV_AWAIT_START)
            else:
                self._spawn(attempt_of(self._env), {})
            deadline: float | None = None  # of the wait for a start after a failure
            while not self._terminating:
                waiting = deadline is not None
                self._lock.wait_for(lambda: self._wake(waiting), timeout=poll_s)  # noqa: B023
                if self._terminating:
                    break
                if self._pending is not None:
                    attempt, overrides = self._pending
                    try:
                        self._spawn(attempt, overrides)
                    finally:
                        self._pending = None
                        self._lock.notify_all()
                    deadline = None
                    continue
                child = self._child
                if child is None or child.returncode is None:
                    continue
                code = exit_code(child.returncode)
                if deadline is None:
                    if code == 0:
                        log.info("training finished (exit 0): the supervisor exits 0")
                        return 0
                    log.warning(
                        "the training process of attempt %d failed (code %d); waiting up to "
                        "%gs (%s) for a start command, else exiting with its code",
                        child.attempt,
                        code,
                        wait_s,
                        contract.ENV_SUPERVISOR_WAIT,
                    )
                    deadline = time.monotonic() + wait_s
                elif time.monotonic() >= deadline:
                    log.error(
                        "no start command within %gs of the failure: exiting with code %d",
                        wait_s,
                        code,
                    )
                    return code
        self._stop_child(self._grace_s + STOP_MARGIN_S, "supervisor got SIGTERM")
        with self._lock:
            last = self._child
        return exit_after_stop(None if last is None else last.returncode)


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("TPU_WORKER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s [supervisor] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def supervising(env: Mapping[str, str]) -> bool:
    """Whether this ``tpu-worker`` runs as a supervisor."""
    return bool(env.get(contract.ENV_CONTROL_PORT, "").strip()) and not env.get(
        contract.ENV_SUPERVISED_CHILD
    )


def main(argv: Sequence[str], termination_grace_s: float | None) -> int:
    """Supervise ``tpu-worker <argv>``; returns the supervisor's exit code."""
    configure_logging()
    env = dict(os.environ)
    port_text = env.get(contract.ENV_CONTROL_PORT, "").strip()
    address = env.get(contract.ENV_POD_IP, "").strip()
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        log.error("%s=%r is not a port number", contract.ENV_CONTROL_PORT, port_text)
        return contract.EXIT_CONFIG_ERROR
    if not address:
        log.error("%s is not set: the control channel needs the pod IP", contract.ENV_POD_IP)
        return contract.EXIT_CONFIG_ERROR
    try:
        wait_s = _float_env(env, contract.ENV_SUPERVISOR_WAIT, contract.DEFAULT_SUPERVISOR_WAIT_S)
        grace_s = termination_grace_s
        if grace_s is None:
            grace_s = _float_env(env, contract.ENV_WORKER_TERMINATION_GRACE, 25.0)
    except ValueError as error:
        log.error("%s", error)
        return contract.EXIT_CONFIG_ERROR
    path = key_path(env)
    load = key_loader(path)
    verifier = sv.Verifier(
        load,
        env.get(contract.ENV_POD_UID, "").strip(),
        env.get(contract.ENV_CONTROL_KEY_ID, "").strip(),
    )
    problem = verifier.key_problem()
    if load() is None:
        log.error(
            "no control key in %s (%s): every control command will be refused with 401; "
            "mount the job's control Secret there",
            path,
            contract.ENV_CONTROL_KEY_FILE,
        )
    elif problem is not None:
        log.error("%s: every control command will be refused with 401", problem)
    # The children inherit SIGUSR1 (checkpoint requests) ignored and blocked, both kept
    # across exec: a request to a child that is still starting neither kills it nor is
    # lost. The kernel keeps a blocked signal pending even while it is ignored, and the
    # worker unblocks it once its handler is installed (``TerminationHandler.install``),
    # which delivers it then. The main thread, which spawns every child, blocks it before
    # any other thread starts.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    supervisor = Supervisor(argv, env, grace_s)
    try:
        server = ControlServer(supervisor, verifier, address, port)
    except OSError as error:
        log.error("cannot serve the control channel on %s:%d: %s", address, port, error)
        return contract.EXIT_CONFIG_ERROR
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.terminate())
    try:
        return supervisor.run(wait_s)
    finally:
        server.close()
