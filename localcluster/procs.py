"""Child processes that never outlive their owner, and PIDs that are safe to signal later.

Two guarantees matter for a test harness that starts half a dozen servers:

- Foreground children (library use, ``up --foreground``) die with the process that started
  them, even when it is SIGKILLed: each is started through ``setpriv --pdeathsig`` (or a
  ``prctl`` pre-exec hook when ``setpriv`` is missing), so the kernel signals it when its
  parent goes away. ``setpriv`` is preferred because ``preexec_fn`` is unsafe in a
  threaded parent (pytest plugins start threads).
- A PID written to a state file is only ever signalled again when it still names the same
  process: :class:`ProcessRecord` keeps the process start time from ``/proc/<pid>/stat``,
  so a PID reused by an unrelated process after a crash is never killed.

Every child gets its own session and process group, so a stop signal reaches the
grandchildren it started too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    """A PID plus its kernel start time: identifies one process across PID reuse."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessRecord:
        start = process_start_time(pid)
        if start is None:
            raise ProcessLookupError(pid)
        return cls(pid, start)

    def alive(self) -> bool:
        """True while the same process (not a reused PID) exists and is not a zombie."""
        return process_start_time(self.pid) == self.start_time and not _is_zombie(self.pid)

    def to_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_json(cls, data: Mapping[str, int]) -> ProcessRecord:
        return cls(int(data["pid"]), int(data["start_time"]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat: starttime


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in ("Z", "X")


def _set_pdeathsig(sig: int) -> None:  # pragma: no cover - runs in the forked child
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: signal.Signals | None = signal.SIGKILL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, output appended to ``log_file``.

    With ``die_with_parent`` the kernel sends that signal to the child when this process
    (strictly: the thread that forked it) exits.
    """
    command = list(argv)
    preexec = None
    if die_with_parent is not None:
        setpriv = shutil.which("setpriv")
        if setpriv:
            command = [setpriv, f"--pdeathsig={die_with_parent.name[3:]}", "--", *command]
        else:
            sig = int(die_with_parent)
            preexec = lambda: _set_pdeathsig(sig)  # noqa: E731
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )


def signal_group(record: ProcessRecord, sig: int) -> bool:
    """Signal the process group led by ``record`` if it is still that process."""
    if not record.alive():
        return False
    try:
        os.killpg(record.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(record.pid, sig)
    return True


def terminate(records: Sequence[ProcessRecord], timeout: float = 10.0) -> None:
    """SIGTERM each group, wait up to ``timeout`` for all, then SIGKILL the survivors."""
    for record in records:
        signal_group(record, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pending = [r for r in records if r.alive()]
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [r for r in pending if r.alive()]
    for record in pending:
        signal_group(record, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(r.alive() for r in pending) and time.monotonic() < deadline:
        time.sleep(0.05)


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Collect an exited child so it does not linger as a zombie."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=0)
