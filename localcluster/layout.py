"""The cluster directory: where every file of one local cluster lives, and its state file.

::

    <dir>/state.json            ports, PIDs (+ start times), command lines, mode, the
                                supervising process, restarts, held components, timings
    <dir>/.lock                 flock held while a launcher starts or stops this cluster
    <dir>/pki/                  CA, serving/client certs, service-account keys
    <dir>/etcd/                 etcd data (throwaway: --unsafe-no-fsync)
    <dir>/kubeconfig            admin kubeconfig (system:masters)
    <dir>/kubeconfigs/          one per component (controller-manager, scheduler, agent)
    <dir>/logs/<component>.log  component logs; supervisor.log: a detached cluster's daemon
    <dir>/pools.yaml            node pools the agent registers
    <dir>/agent.sock            node agent control API (see localcluster.agent.control)
    <dir>/pods/<ns>/<pod>/      per-pod hosts file, <container>.log, pgid records
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.procs import ProcessRecord

# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class Layout:
    """Paths inside one cluster directory."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / "kubeconfigs" / f"{name}.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def pools_file(self) -> Path:
        return self.root / "pools.yaml"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.pods / namespace / name

    @property
    def agent_socket(self) -> Path:
        """The control socket; moved to the temp dir when the cluster path is too long."""
        path = self.root.resolve() / "agent.sock"
        if len(str(path)) <= _MAX_SOCKET_PATH:
            return path
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"localcluster-{digest}.sock"


def read_state(layout: Layout) -> dict[str, Any] | None:
    try:
        return json.loads(layout.state_file.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return {}


def write_state(layout: Layout, state: dict[str, Any]) -> None:
    """Replace the state file atomically (a reader never sees half of it)."""
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(layout.state_file)


def recorded_processes(state: dict[str, Any] | None) -> dict[str, ProcessRecord]:
    """Component name -> process record, from a state file (empty when there is none)."""
    if not state:
        return {}
    return {
        name: ProcessRecord.from_json(record) for name, record in state.get("processes", {}).items()
    }


@contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Hold the cluster directory's lock: one launcher at a time starts or stops it."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
