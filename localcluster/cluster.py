"""The launcher: start, attach to and stop one local cluster in a directory.

::

    with Cluster.start(".localcluster/dev") as cluster:      # foreground: dies with us
        cluster.kubectl("get", "nodes")
        cluster.agent.kill_pod("default", "worker-0", exit_code=42)

Start-up runs every component at once (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, node agent; each retries until its dependencies answer), then waits for
``/readyz``, for the ``default`` ServiceAccount (proof that the controller-manager's
token and ServiceAccount controllers work) and for the agent's nodes. Ports are picked
free and a start whose etcd or apiserver lost a bind race is retried with new ports; a
controller that gives up before the apiserver serves it (a loaded machine) is started
again.

Control-plane faults: ``restart_apiserver(down_seconds)`` (or ``kill_apiserver`` and
``start_apiserver``) SIGKILLs the kube-apiserver and starts it again with the same command
line; ``supervise`` (started by those) restarts kube-scheduler and kube-controller-manager
whenever they exit afterwards, as a kubelet restarts static pods.

Two modes: *foreground* (the library default) ties every child to this process with
``PR_SET_PDEATHSIG``, so even a SIGKILLed test run leaves no process behind; *detached*
(``python -m localcluster up``) leaves the cluster running and ``down`` stops it from the
PIDs (with start times) in ``state.json``. A directory whose recorded processes are gone
(a crashed run) is detected on the next start: survivors are killed and the runtime state
(etcd data, pods) is wiped; certificates are kept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from localcluster import binaries, controlplane, kubeconfig, pki
from localcluster.agent.client import AgentClient
from localcluster.agent.provisioner import Autoprovisioning
from localcluster.api import SyncApi
from localcluster.layout import Layout, locked, read_state, recorded_processes, write_state
from localcluster.pools import Pool, check_unique, default_pools, dump_pools
from localcluster.procs import (
    ProcessRecord,
    process_start_time,
    reap,
    signal_group,
    spawn,
    terminate,
)

DEFAULT_DIR = Path(".localcluster") / "default"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")
BIND_CONFLICT = "address already in use"
SUPERVISED = ("kube-controller-manager", "kube-scheduler")
"""Components :meth:`Cluster.supervise` restarts when they exit."""
STARTUP_RESTARTS = 5
"""How often start-up starts a controller again that exited before the cluster was ready."""
PROGRESS_SECONDS = 15.0
"""A start that takes longer (thousands of simulated nodes to register) logs what it is
waiting for this often, with the number of nodes registered so far."""


class ClusterError(RuntimeError):
    """The cluster could not be started, attached to or stopped; the message says why."""


class _PortConflict(Exception):
    pass


def log(message: str) -> None:
    binaries.log(message)


@dataclass
class Cluster:
    """A running local cluster (started here, or attached to)."""

    directory: Path
    server: str
    kubectl_path: Path
    detached: bool
    startup_seconds: float | None = None
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _records: dict[str, ProcessRecord] = field(default_factory=dict, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _watchdog: tuple[threading.Thread, threading.Event] | None = field(default=None, repr=False)
    _argv: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _startup_restarts: dict[str, int] = field(default_factory=dict, repr=False)

    # Paths and clients ----------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        return Layout(self.directory)

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs

    @property
    def pods_dir(self) -> Path:
        return self.layout.pods

    @property
    def agent(self) -> AgentClient:
        return AgentClient(self.layout.agent_socket)

    def api(self) -> SyncApi:
        """A JSON client authenticated as the cluster admin."""
        pki_dir = self.layout.pki
        return SyncApi(
            self.server, pki_dir / "ca.crt", pki_dir / "admin.crt", pki_dir / "admin.key"
        )

    def env(self) -> dict[str, str]:
        """The environment for tools that should talk to this cluster (KUBECONFIG set)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def pod_log(self, namespace: str, pod: str, container: str) -> Path:
        return self.layout.pod_dir(namespace, pod) / f"{container}.log"

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises with stderr on failure when ``check``."""
        result = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed (exit {result.returncode}): "
                f"{result.stderr.strip()}"
            )
        return result

    # Start ----------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path | str | None = None,
        *,
        pools: Sequence[Pool] | None = None,
        node_monitor_grace_period: float = 20.0,
        detach: bool = False,
        fresh: bool = False,
        timeout: float = 120.0,
        component_args: Mapping[str, Sequence[str]] | None = None,
        autoprovisioning: Autoprovisioning | None = None,
    ) -> Cluster:
        """Build what is missing, start a cluster in ``directory`` and wait until it is usable.

        ``pools``: node pools (default: ``localcluster/pools.yaml``). ``fresh``: wipe the
        etcd data of an earlier, cleanly stopped run (a crashed run's data is always
        wiped). ``component_args``: extra flags per component name (``kube-apiserver``,
        ...). ``autoprovisioning``: turn on the simulated GKE cluster autoscaler and node
        auto-provisioner (:mod:`localcluster.agent.provisioner`; off by default). Raises
        :class:`ClusterError` if a cluster is already running there.
        """
        extra = {k: list(v) for k, v in (component_args or {}).items()}
        if autoprovisioning is not None:
            flag = f"--autoprovisioning={json.dumps(autoprovisioning.to_json())}"
            extra["node-agent"] = [*extra.get("node-agent", []), flag]
        layout = Layout(Path(directory or DEFAULT_DIR).absolute())
        pool_list = list(default_pools() if pools is None else pools)
        check_unique(pool_list)
        with locked(layout):
            _recover(layout, fresh)
            paths = binaries.ensure_all()
            started = time.monotonic()
            pki.generate(layout.pki)
            layout.pools_file.write_text(dump_pools(pool_list))
            for directory_path in (layout.logs, layout.pods, layout.etcd_data):
                directory_path.mkdir(parents=True, exist_ok=True)
            layout.etcd_data.chmod(0o700)
            error: Exception | None = None
            for attempt in range(1, 4):
                ports = controlplane.pick_ports()
                cluster = cls(layout.root, ports.server, paths["kubectl"], detach)
                try:
                    cluster._launch(paths, ports, node_monitor_grace_period, extra)
                    cluster._wait_ready(started, timeout)
                except _PortConflict as conflict:
                    cluster._shutdown()
                    error = conflict
                    log(f"{conflict}; retrying with other ports (attempt {attempt})")
                    continue
                except BaseException:
                    cluster._shutdown()
                    raise
                cluster.startup_seconds = time.monotonic() - started
                cluster._save_state(ports, node_monitor_grace_period)
                nodes = sum(p.vms for p in pool_list)
                log(
                    f"cluster up in {cluster.startup_seconds:.1f} s: {cluster.server}, {nodes} "
                    f"node(s); KUBECONFIG={layout.kubeconfig}"
                )
                return cluster
            raise ClusterError(f"could not start the control plane after 3 attempts: {error}")

    def _launch(
        self,
        paths: Mapping[str, Path],
        ports: controlplane.Ports,
        grace: float,
        extra: Mapping[str, Sequence[str]],
    ) -> None:
        layout = self.layout
        kubeconfig.write(layout.kubeconfig, self.server, layout.pki, "admin")
        for stem in ("controller-manager", "scheduler", "node-agent"):
            kubeconfig.write(layout.component_kubeconfig(stem), self.server, layout.pki, stem)
        commands = {
            "etcd": controlplane.etcd(paths["etcd"], layout, ports),
            "kube-apiserver": controlplane.apiserver(paths["kube-apiserver"], layout, ports),
            "kube-controller-manager": controlplane.controller_manager(
                paths["kube-controller-manager"], layout, grace
            ),
            "kube-scheduler": controlplane.scheduler(paths["kube-scheduler"], layout),
            "node-agent": [
                sys.executable, "-m", "localcluster.agent",
                f"--cluster-dir={layout.root}", f"--server={self.server}",
                f"--node-monitor-grace-period={grace:g}",
            ],
        }  # fmt: skip
        for name, argv in commands.items():
            argv = [*argv, *extra.get(name, ())]
            self._argv[name] = argv
            log_file = layout.log(name)
            with open(log_file, "a") as out:
                out.write(f"\n==== {dt.datetime.now().isoformat()} {' '.join(argv)}\n")
            if self.detached:
                death = None
            else:
                death = signal.SIGTERM if name == "node-agent" else signal.SIGKILL
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()}
            child = spawn(argv, log_file=log_file, env=env, cwd=layout.root, die_with_parent=death)
            self._children[name] = child
            self._records[name] = ProcessRecord(child.pid, process_start_time(child.pid) or 0)

    def _wait_ready(self, started: float, timeout: float) -> None:
        api = self.api()
        agent = self.agent
        deadline = started + timeout
        stage = "kube-apiserver /readyz"
        report = time.monotonic() + PROGRESS_SECONDS
        while time.monotonic() < deadline:
            self._check_children()
            try:
                if stage == "kube-apiserver /readyz":
                    status, _ = api.request("GET", "/readyz")
                    if status == 200:
                        stage = "the default ServiceAccount"
                if stage == "the default ServiceAccount":
                    status, _ = api.request(
                        "GET", "/api/v1/namespaces/default/serviceaccounts/default"
                    )
                    if status == 200:
                        stage = "the node agent"
                if stage == "the node agent" and agent.ready():
                    return
                if time.monotonic() >= report:
                    report = time.monotonic() + PROGRESS_SECONDS
                    nodes = _registered(api) if stage == "the node agent" else ""
                    log(f"still starting after {time.monotonic() - started:.0f} s: waiting for "
                        f"{stage}{nodes}")  # fmt: skip
            except OSError:
                pass
            time.sleep(0.1)
        raise ClusterError(
            f"the cluster was not ready after {timeout:g} s: still waiting for {stage}; "
            f"logs in {self.logs_dir}"
        )

    def _check_children(self) -> None:
        for name, child in list(self._children.items()):
            code = child.poll()
            if code is None:
                continue
            tail = _tail(self.layout.log(name))
            if name in ("etcd", "kube-apiserver") and BIND_CONFLICT in tail:
                raise _PortConflict(f"{name} could not bind its port")
            restarts = self._startup_restarts.get(name, 0)
            if name in SUPERVISED and name in self._argv and restarts < STARTUP_RESTARTS:
                # They give up when the apiserver does not serve them in time (on a loaded
                # machine, RBAC bootstrap can take longer than their wait); a kubelet
                # would start them again, and so does the launcher.
                self._startup_restarts[name] = restarts + 1
                log(f"{name} exited with code {code} during start-up; starting it again")
                self._respawn(name, self._argv[name], save=False)
                continue
            raise ClusterError(
                f"{name} exited with code {code} during start-up; "
                f"log: {self.layout.log(name)}\n{tail}"
            )

    def _save_state(self, ports: controlplane.Ports, grace: float) -> None:
        write_state(
            self.layout,
            {
                "status": "running",
                "mode": "detached" if self.detached else "foreground",
                "launcher_pid": os.getpid(),
                "server": self.server,
                "ports": ports.to_json(),
                "kubectl": str(self.kubectl_path),
                "processes": {n: r.to_json() for n, r in self._records.items()},
                "node_monitor_grace_period": grace,
                "agent_socket": str(self.layout.agent_socket),
                "started_at": dt.datetime.now(dt.UTC).isoformat(),
                "startup_seconds": round(self.startup_seconds or 0, 2),
            },
        )

    # Attach and stop ------------------------------------------------------------------

    @classmethod
    def attach(cls, directory: Path | str | None = None) -> Cluster:
        """The cluster running in ``directory`` (started detached or by another process)."""
        layout = Layout(Path(directory or DEFAULT_DIR).absolute())
        state = read_state(layout)
        if not state or state.get("status") != "running":
            raise ClusterError(f"no cluster is running in {layout.root}")
        records = recorded_processes(state)
        dead = [name for name, record in records.items() if not record.alive()]
        if dead:
            raise ClusterError(
                f"the cluster in {layout.root} is broken: {', '.join(dead)} not running "
                f"(logs in {layout.logs}); stop it with `python -m localcluster down`"
            )
        return cls(
            layout.root,
            state["server"],
            Path(state["kubectl"]),
            detached=True,
            startup_seconds=state.get("startup_seconds"),
            _records=records,
        )

    def stop(self) -> None:
        """Stop every component (the agent first, so pod processes end gracefully)."""
        if self._stopped:
            return
        if self._watchdog is not None:
            thread, stopping = self._watchdog
            stopping.set()
            thread.join(10)
        with locked(self.layout):
            self._shutdown()
            state = read_state(self.layout) or {}
            state.update(status="stopped", processes={})
            write_state(self.layout, state)
        self._stopped = True
        log(f"cluster in {self.directory} stopped")

    def _shutdown(self) -> None:
        # Dependents first: the agent (its pods get SIGTERM), then the controllers, then
        # the apiserver, then etcd, so nothing logs errors about a vanished dependency.
        for group, timeout in (
            (("node-agent",), 15.0),
            (("kube-scheduler", "kube-controller-manager"), 10.0),
            (("kube-apiserver",), 10.0),
            (("etcd",), 10.0),
        ):
            terminate([self._records[n] for n in group if n in self._records], timeout=timeout)
        for child in self._children.values():
            reap(child)
        _kill_pod_groups(self.layout)
        self.layout.agent_socket.unlink(missing_ok=True)

    # Faults of the control plane -------------------------------------------------------

    def kill_apiserver(self) -> list[str]:
        """SIGKILL the kube-apiserver (as a crash or a control-plane upgrade does); return
        its command line for :meth:`start_apiserver`. Every client sees its connections
        reset and then refused; etcd keeps the data."""
        self.supervise()
        with locked(self.layout):
            record = self._records.get("kube-apiserver")
            if record is None or not record.alive():
                raise ClusterError("the kube-apiserver is not running")
            argv = _cmdline(record.pid)
            signal_group(record, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while record.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            child = self._children.get("kube-apiserver")
            if child is not None:
                child.wait(5)
        log(f"kube-apiserver killed (pid {record.pid})")
        return argv

    def start_apiserver(self, argv: Sequence[str], timeout: float = 60.0) -> float:
        """Start the kube-apiserver again with ``argv`` (same flags, port, certificates and
        etcd); return the seconds until it answered ``/readyz``. In the foreground the new
        process dies with the calling thread (``PR_SET_PDEATHSIG``): call it from the
        thread that owns the cluster."""
        started = time.monotonic()
        with locked(self.layout):
            child = self._respawn("kube-apiserver", argv)
        api = self.api()
        while time.monotonic() < started + timeout:
            if child.poll() is not None:
                raise ClusterError(
                    f"kube-apiserver exited with {child.returncode} on restart:\n"
                    f"{_tail(self.layout.log('kube-apiserver'))}"
                )
            with contextlib.suppress(OSError):
                if api.request("GET", "/readyz")[0] == 200:
                    ready = time.monotonic() - started
                    log(f"kube-apiserver restarted: ready in {ready:.1f} s")
                    return ready
            time.sleep(0.1)
        raise ClusterError(f"the restarted kube-apiserver was not ready after {timeout:g} s")

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0) -> float:
        """SIGKILL the kube-apiserver, keep it down ``down_seconds``, start it again with
        the same command line; return the seconds from the kill until ``/readyz``. Also
        starts :meth:`supervise`, which brings back the controllers that exit after it."""
        killed = time.monotonic()
        argv = self.kill_apiserver()
        time.sleep(down_seconds)
        self.start_apiserver(argv, timeout)
        return time.monotonic() - killed

    def supervise(self, interval: float = 0.5) -> None:
        """Restart kube-scheduler and kube-controller-manager whenever they exit, as the
        kubelet restarts a control plane's static pods, until :meth:`stop`.

        Both exit on purpose when they find their caches inconsistent, which an apiserver
        restart can cause (kube-scheduler: "Scheduler cache is corrupted", seconds after
        the apiserver is back); a real control plane has them back within seconds, so the
        local one does too. A daemon thread of this process (started once) checks every
        ``interval`` and relaunches with the command line each had when supervision began.
        """
        if self._watchdog is not None:
            return
        commands = {}
        for name in SUPERVISED:
            record = self._records.get(name)
            if record is not None and record.alive():
                commands[name] = _cmdline(record.pid)
        stopping = threading.Event()
        thread = threading.Thread(
            target=self._watch_controllers,
            args=(commands, stopping, interval),
            name="localcluster-watchdog",
            daemon=True,
        )
        self._watchdog = (thread, stopping)
        thread.start()

    def _watch_controllers(
        self, commands: Mapping[str, list[str]], stopping: threading.Event, interval: float
    ) -> None:
        while not stopping.wait(interval):
            for name, argv in commands.items():
                record = self._records.get(name)
                if record is None or record.alive():
                    continue
                with locked(self.layout):
                    state = read_state(self.layout) or {}
                    if stopping.is_set() or state.get("status") != "running":
                        return  # stopped here or by another process
                    child = self._children.get(name)
                    code = child.poll() if child is not None else None
                    self._respawn(name, argv)
                log(f"{name} exited (code {code}); restarted it (see {self.layout.log(name)})")

    def _respawn(
        self, name: str, argv: Sequence[str], save: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start component ``name`` again with ``argv``; record it, in ``state.json`` too
        when ``save`` (the caller holds the lock)."""
        log_file = self.layout.log(name)
        with open(log_file, "a") as out:
            out.write(f"\n==== {dt.datetime.now().isoformat()} restart: {' '.join(argv)}\n")
        child = spawn(
            argv,
            log_file=log_file,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=self.layout.root,
            die_with_parent=None if self.detached else signal.SIGKILL,
        )
        self._children[name] = child
        record = ProcessRecord(child.pid, process_start_time(child.pid) or 0)
        self._records[name] = record
        if save:
            state = read_state(self.layout) or {}
            state.setdefault("processes", {})[name] = record.to_json()
            write_state(self.layout, state)
        return child

    def status(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "processes": {n: {"pid": r.pid, "alive": r.alive()} for n, r in self._records.items()},
        }

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _recover(layout: Layout, fresh: bool) -> None:
    """Make ``layout`` safe to start in: refuse a live cluster, clean a crashed one."""
    state = read_state(layout)
    if state is None:
        if fresh:
            _wipe_runtime(layout)
        return
    records = recorded_processes(state)
    alive = {name: record for name, record in records.items() if record.alive()}
    if alive and len(alive) == len(records) and state.get("status") == "running":
        raise ClusterError(
            f"a cluster is already running in {layout.root} (server {state.get('server')}); "
            "use Cluster.attach() or stop it with `python -m localcluster down`"
        )
    crashed = state.get("status") == "running" or bool(alive) or state == {}
    if crashed:
        log(
            f"{layout.root} holds a crashed cluster ({len(alive)} of {len(records)} processes "
            "left): stopping the survivors and wiping its runtime state"
        )
        terminate(list(alive.values()), timeout=5)
    _kill_pod_groups(layout)
    if crashed or fresh:
        _wipe_runtime(layout)
    layout.state_file.unlink(missing_ok=True)


def _wipe_runtime(layout: Layout) -> None:
    for path in (layout.etcd_data, layout.pods):
        shutil.rmtree(path, ignore_errors=True)
    layout.agent_socket.unlink(missing_ok=True)


def _kill_pod_groups(layout: Layout) -> None:
    """SIGKILL process groups of pods recorded by an agent that did not clean up."""
    if not layout.pods.is_dir():
        return
    for record_file in layout.pods.glob("*/*/*.pid"):
        try:
            record = ProcessRecord.from_json(json.loads(record_file.read_text()))
        except (OSError, ValueError, KeyError):
            continue
        current = process_start_time(record.pid)
        if current is not None and current != record.start_time:
            continue  # the PID belongs to another process now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
        record_file.unlink(missing_ok=True)


def _registered(api: SyncApi) -> str:
    """``: N nodes registered`` (one cheap paged LIST: its ``remainingItemCount``)."""
    status, body = api.request("GET", "/api/v1/nodes?limit=1")
    if status != 200 or not isinstance(body, dict):
        return ""
    count = len(body.get("items") or []) + int(body["metadata"].get("remainingItemCount") or 0)
    return f": {count} nodes registered"


def _cmdline(pid: int) -> list[str]:
    """The command line of a running process (what ``spawn`` exec'd, without setpriv)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


def _pythonpath() -> str:
    """The agent imports localcluster from this checkout, whatever its working directory."""
    root = str(Path(__file__).resolve().parent.parent)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return os.pathsep.join([root, *rest])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
