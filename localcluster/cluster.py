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

Supervision: the process that started the components is their parent and restarts
each one that exits, with a back-off as a kubelet's CrashLoopBackOff
(:mod:`localcluster.supervision`), from start-up until :meth:`Cluster.stop`.

Control-plane faults: ``kill_component(name)`` SIGKILLs a component and keeps it down
(supervision leaves it alone) until ``start_component(name)``; ``restart_apiserver``
(``kill_apiserver`` and ``start_apiserver``) does that to the kube-apiserver.

Two modes: *foreground* (the library default) ties every child to this process with
``PR_SET_PDEATHSIG``, so even a SIGKILLed test run leaves no process behind, and
supervises from a thread of it; *detached* (``python -m localcluster up``) starts
:mod:`localcluster.daemon`, a process of its own that starts, supervises and on ``down``
stops the components, and returns once the cluster is ready. ``state.json`` records the
PIDs (with start times), command lines and the supervising process. A directory whose
recorded processes are gone (a crashed run) is detected on the next start: survivors are
killed and the runtime state (etcd data, pods) is wiped; certificates are kept.
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
from localcluster.supervision import Supervisor, describe_exit

DEFAULT_DIR = Path(".localcluster") / "default"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")
BIND_CONFLICT = "address already in use"
CONTROLLERS = ("kube-controller-manager", "kube-scheduler")
"""Components that start-up starts again when they exit before the cluster is ready."""
STARTUP_RESTARTS = 5
"""How often start-up starts a controller again that exited before the cluster was ready."""
PROGRESS_SECONDS = 15.0
"""A start that takes longer (thousands of simulated nodes to register) logs what it is
waiting for this often, with the number of nodes registered so far."""
DAEMON_STOP_SECONDS = 90.0
"""How long ``stop`` waits for a detached cluster's daemon to stop its components (the
agent, controllers, apiserver and etcd get 15 + 10 + 10 + 10 s at most) before it kills
the daemon and stops them itself."""
DAEMON_ERROR = "localcluster-daemon-error: "
"""Prefix of the line in which the daemon reports why the cluster did not start."""


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
    _supervisor: Supervisor | None = field(default=None, repr=False)
    _commands: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _spawned: dict[str, float] = field(default_factory=dict, repr=False)
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

    def service_account_token(self, namespace: str, name: str, seconds: int = 24 * 3600) -> str:
        """A token of ServiceAccount ``namespace/name`` from the TokenRequest API, as the
        kubelet gets one for a pod (valid ``seconds``)."""
        answer = self.api().call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return str(answer["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig that acts as ServiceAccount ``namespace/name`` (a TokenRequest
        token): a process run with it has exactly that account's permissions."""
        token = self.service_account_token(namespace, name)
        user = f"system:serviceaccount:{namespace}:{name}"
        return kubeconfig.write_token(path, self.server, self.layout.pki, token, user)

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
        pod_addresses: str = "loopback",
    ) -> Cluster:
        """Build what is missing, start a cluster in ``directory`` and wait until it is usable.

        ``pools``: node pools (default: ``localcluster/pools.yaml``). ``fresh``: wipe the
        etcd data of an earlier, cleanly stopped run (a crashed run's data is always
        wiped). ``component_args``: extra flags per component name (``kube-apiserver``,
        ...). ``autoprovisioning``: turn on the simulated GKE cluster autoscaler and node
        auto-provisioner (:mod:`localcluster.agent.provisioner`; off by default).
        ``pod_addresses``: ``loopback`` (127.B.0.0/16) or ``routed`` (100.B.0.0/16, made
        local by a route: the endpoint controllers publish them, as on GKE; needs
        CAP_NET_ADMIN; :mod:`localcluster.agent.ipam`). Raises :class:`ClusterError` if a
        cluster is already running there.

        ``detach``: the cluster outlives this process; :mod:`localcluster.daemon` starts
        and supervises it, and what is returned is attached to it. Otherwise the
        components are children of this process (they die with it) and a thread of it
        supervises them.
        """
        extra = {k: list(v) for k, v in (component_args or {}).items()}
        if autoprovisioning is not None:
            flag = f"--autoprovisioning={json.dumps(autoprovisioning.to_json())}"
            extra["node-agent"] = [*extra.get("node-agent", []), flag]
        if pod_addresses != "loopback":
            extra["node-agent"] = [*extra.get("node-agent", []), f"--pod-addresses={pod_addresses}"]
        layout = Layout(Path(directory or DEFAULT_DIR).absolute())
        pool_list = list(default_pools() if pools is None else pools)
        check_unique(pool_list)
        if detach:
            spec = {
                "directory": str(layout.root),
                "pools": [pool.to_dict() for pool in pool_list],
                "node_monitor_grace_period": node_monitor_grace_period,
                "fresh": fresh,
                "timeout": timeout,
                "component_args": extra,
            }
            return _start_daemon(layout, spec)
        cluster = cls._start_here(
            layout, pool_list, node_monitor_grace_period, False, fresh, timeout, extra
        )
        cluster._supervisor = cluster._new_supervisor()
        cluster._supervisor.start_thread()
        return cluster

    @classmethod
    def _start_here(
        cls,
        layout: Layout,
        pool_list: Sequence[Pool],
        node_monitor_grace_period: float,
        detach: bool,
        fresh: bool,
        timeout: float,
        extra: Mapping[str, Sequence[str]],
    ) -> Cluster:
        """Start the components as children of this process (``detach``: without a death
        signal) and wait until the cluster is usable; supervision is the caller's."""
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
            self._commands[name] = [*argv, *extra.get(name, ())]
            self._spawn(name, self._commands[name])

    def _spawn(self, name: str, argv: Sequence[str], note: str = "") -> subprocess.Popen[bytes]:
        """Start component ``name`` with ``argv`` as a child of this process (in the
        foreground: one that dies with the calling thread) and record it."""
        log_file = self.layout.log(name)
        with open(log_file, "a") as out:
            out.write(f"\n==== {dt.datetime.now().isoformat()} {note}{' '.join(argv)}\n")
        if self.detached:
            death = None
        else:
            death = signal.SIGTERM if name == "node-agent" else signal.SIGKILL
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()}
        child = spawn(argv, log_file=log_file, env=env, cwd=self.layout.root, die_with_parent=death)
        self._children[name] = child
        self._records[name] = ProcessRecord(child.pid, process_start_time(child.pid) or 0)
        self._spawned[name] = time.monotonic()
        return child

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
            if name in CONTROLLERS and name in self._commands and restarts < STARTUP_RESTARTS:
                # They give up when the apiserver does not serve them in time (on a loaded
                # machine, RBAC bootstrap can take longer than their wait); a kubelet
                # would start them again, and so does the launcher.
                self._startup_restarts[name] = restarts + 1
                log(f"{name} {describe_exit(code)} during start-up; starting it again")
                self._spawn(name, self._commands[name], "restart: ")
                continue
            raise ClusterError(
                f"{name} {describe_exit(code)} during start-up; "
                f"log: {self.layout.log(name)}\n{tail}"
            )

    def _save_state(self, ports: controlplane.Ports, grace: float) -> None:
        write_state(
            self.layout,
            {
                "status": "running",
                "mode": "detached" if self.detached else "foreground",
                "launcher_pid": os.getpid(),
                "supervisor": ProcessRecord.of(os.getpid()).to_json(),
                "server": self.server,
                "ports": ports.to_json(),
                "kubectl": str(self.kubectl_path),
                "processes": {n: r.to_json() for n, r in self._records.items()},
                "commands": self._commands,
                "held": [],
                "restarts": {},
                "node_monitor_grace_period": grace,
                "agent_socket": str(self.layout.agent_socket),
                "started_at": dt.datetime.now(dt.UTC).isoformat(),
                "startup_seconds": round(self.startup_seconds or 0, 2),
            },
        )

    # Supervision ----------------------------------------------------------------------

    def _new_supervisor(self) -> Supervisor:
        return Supervisor(
            self.layout, lambda: self._children, self._respawn, log, started=self._spawned
        )

    def _supervise_here(self, until: threading.Event) -> None:
        """Supervise from the calling thread until ``until`` is set or the cluster is
        stopped (the daemon of a detached cluster)."""
        self._supervisor = self._new_supervisor()
        self._supervisor.run(until)

    def _respawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start component ``name`` again with ``argv`` and record it in ``state.json``
        (the caller holds the lock)."""
        child = self._spawn(name, argv, "restart: ")
        state = read_state(self.layout) or {}
        state.setdefault("processes", {})[name] = self._records[name].to_json()
        state.setdefault("killed", {}).pop(name, None)
        restarts = state.setdefault("restarts", {})
        restarts[name] = restarts.get(name, 0) + 1
        write_state(self.layout, state)
        return child

    # Attach and stop ------------------------------------------------------------------

    @classmethod
    def attach(cls, directory: Path | str | None = None) -> Cluster:
        """The cluster running in ``directory`` (started detached or by another process)."""
        layout = Layout(Path(directory or DEFAULT_DIR).absolute())
        state = read_state(layout)
        if not state or state.get("status") != "running":
            raise ClusterError(f"no cluster is running in {layout.root}")
        records = recorded_processes(state)
        held = set(state.get("held") or ())
        dead = [n for n, record in records.items() if not record.alive() and n not in held]
        supervisor = _supervisor(state)
        if dead and not (supervisor and supervisor.alive()):
            raise ClusterError(
                f"the cluster in {layout.root} is broken: {', '.join(dead)} not running "
                f"and nothing restarts them (logs in {layout.logs}); stop it with "
                "`python -m localcluster down`"
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
        """Stop every component (the agent first, so pod processes end gracefully).

        The process that supervises them does it: this one, or the daemon of a detached
        cluster (asked with SIGTERM; if it does not finish in time, it is killed and the
        recorded processes are stopped from here)."""
        if self._stopped:
            return
        supervisor = self._supervisor
        if supervisor is not None:
            supervisor.closing.set()  # no restarts while the components stop
        else:
            self._stop_daemon()
        with locked(self.layout):
            state = read_state(self.layout) or {}
            if supervisor is None:  # the recorded processes may be newer than ours
                self._records.update(recorded_processes(state))
            self._shutdown()
            state.update(status="stopped", processes={}, held=[])
            write_state(self.layout, state)
        if supervisor is not None:
            supervisor.finish()
        self._stopped = True
        log(f"cluster in {self.directory} stopped")

    def _stop_daemon(self) -> None:
        state = read_state(self.layout) or {}
        daemon = _supervisor(state)
        if state.get("mode") != "detached" or daemon is None or daemon.pid == os.getpid():
            return
        if not signal_group(daemon, signal.SIGTERM):
            return
        deadline = time.monotonic() + DAEMON_STOP_SECONDS
        while daemon.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if daemon.alive():
            log(
                f"the cluster's daemon (pid {daemon.pid}) did not stop it in "
                f"{DAEMON_STOP_SECONDS:g} s; killing it and stopping the components from here"
            )
            signal_group(daemon, signal.SIGKILL)

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

    def kill_component(self, name: str) -> list[str]:
        """SIGKILL component ``name`` (``kube-scheduler``, ``kube-apiserver``, ...) and keep
        it down: supervision does not restart it until :meth:`start_component`. Returns
        its command line. Works from any process (the supervisor reads ``state.json``)."""
        if name not in COMPONENTS:
            raise ClusterError(f"unknown component {name!r}; one of: {', '.join(COMPONENTS)}")
        with locked(self.layout):
            state = self._running_state()
            # Held before the kill: the supervisor that sees the exit sees the hold too.
            state["held"] = sorted({*(state.get("held") or ()), name})
            record = recorded_processes(state).get(name)
            if record is not None:
                # Marks this exit as deliberate even if start_component comes first.
                state.setdefault("killed", {})[name] = record.pid
            write_state(self.layout, state)
            if record is not None and signal_group(record, signal.SIGKILL):
                deadline = time.monotonic() + 10
                while record.alive() and time.monotonic() < deadline:
                    time.sleep(0.02)
                child = self._children.get(name)
                if child is not None and child.pid == record.pid:
                    child.wait(5)
                log(f"{name} killed (pid {record.pid}); kept down until started again")
        return list(state["commands"][name])

    def start_component(
        self, name: str, argv: Sequence[str] | None = None, timeout: float = 60.0
    ) -> float:
        """Let supervision start component ``name`` again, at once (with ``argv`` if
        given, else its recorded command line); return the seconds until it runs (the
        kube-apiserver: until it answers ``/readyz``)."""
        started = time.monotonic()
        with locked(self.layout):
            state = self._running_state()
            if name not in (state.get("held") or ()):
                raise ClusterError(f"{name} was not stopped with kill_component")
            if argv is not None:
                state["commands"][name] = list(argv)
            state["held"] = [n for n in state["held"] if n != name]
            write_state(self.layout, state)
            before = recorded_processes(state).get(name)
        daemon = _supervisor(state)
        if daemon is None or not daemon.alive():
            raise ClusterError(
                f"nothing supervises the cluster in {self.directory} (its supervising "
                "process is gone), so nothing starts it; stop it with `python -m localcluster "
                "down` and start it again"
            )

        def started_again() -> ProcessRecord | None:
            record = recorded_processes(read_state(self.layout)).get(name)
            return record if record is not None and record != before and record.alive() else None

        api = self.api()
        while time.monotonic() < started + timeout:
            record = started_again()
            if record is not None and name != "kube-apiserver":
                return time.monotonic() - started
            if record is not None:
                with contextlib.suppress(OSError):
                    if api.request("GET", "/readyz")[0] == 200:
                        ready = time.monotonic() - started
                        log(f"{name} started again: ready in {ready:.1f} s")
                        return ready
            time.sleep(0.05)
        raise ClusterError(
            f"{name} was not running again after {timeout:g} s; "
            f"log: {self.layout.log(name)}\n{_tail(self.layout.log(name))}"
        )

    def _running_state(self) -> dict[str, Any]:
        state = read_state(self.layout) or {}
        if state.get("status") != "running":
            raise ClusterError(f"no cluster is running in {self.directory}")
        return state

    def kill_apiserver(self) -> list[str]:
        """SIGKILL the kube-apiserver (as a crash or a control-plane upgrade does) and keep
        it down until :meth:`start_apiserver`; return its command line. Every client sees
        its connections reset and then refused; etcd keeps the data."""
        return self.kill_component("kube-apiserver")

    def start_apiserver(self, argv: Sequence[str] | None = None, timeout: float = 60.0) -> float:
        """Start the kube-apiserver again (same flags, port, certificates and etcd, or
        ``argv``); return the seconds until it answered ``/readyz``."""
        return self.start_component("kube-apiserver", argv, timeout)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0) -> float:
        """SIGKILL the kube-apiserver, keep it down ``down_seconds``, start it again with
        the same command line; return the seconds from the kill until ``/readyz``."""
        killed = time.monotonic()
        self.kill_apiserver()
        time.sleep(down_seconds)
        self.start_apiserver(timeout=timeout)
        return time.monotonic() - killed

    def status(self) -> dict[str, Any]:
        """Components (PID, alive, restarts, held) and the supervising process, as
        ``state.json`` records them now."""
        state = read_state(self.layout) or {}
        records = recorded_processes(state) or self._records
        restarts, held = state.get("restarts") or {}, set(state.get("held") or ())
        supervisor = _supervisor(state)
        return {
            "directory": str(self.directory),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "supervisor": (
                {"pid": supervisor.pid, "alive": supervisor.alive(), "mode": state.get("mode")}
                if supervisor
                else None
            ),
            "processes": {
                n: {
                    "pid": r.pid,
                    "alive": r.alive(),
                    "restarts": restarts.get(n, 0),
                    "held": n in held,
                }
                for n, r in records.items()
            },
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
    supervisor = _supervisor(state)
    supervised = supervisor is not None and supervisor.alive()
    complete = bool(alive) and len(alive) == len(records)
    if state.get("status") == "running" and (complete or supervised):
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
        if supervisor is not None and supervised and state.get("mode") == "detached":
            signal_group(supervisor, signal.SIGKILL)  # a daemon would start them again
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


def _supervisor(state: Mapping[str, Any] | None) -> ProcessRecord | None:
    """The process that supervises the cluster of ``state`` (launcher or daemon)."""
    record = (state or {}).get("supervisor")
    return ProcessRecord.from_json(record) if record else None


def _start_daemon(layout: Layout, spec: Mapping[str, Any]) -> Cluster:
    """Start a detached cluster through :mod:`localcluster.daemon`; return it attached.

    The daemon's stderr comes here (and is copied to ours) until the cluster is ready,
    then goes to ``logs/supervisor.log``: the end of the pipe means ready, or failed if
    the daemon says so or exits."""
    layout.root.mkdir(parents=True, exist_ok=True)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "localcluster.daemon"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=layout.root,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()},
        start_new_session=True,
        text=True,
    )
    assert daemon.stdin is not None and daemon.stderr is not None
    error = ""
    try:
        daemon.stdin.write(json.dumps(spec))
        daemon.stdin.close()
        for line in daemon.stderr:
            if line.startswith(DAEMON_ERROR):
                error = line[len(DAEMON_ERROR) :].rstrip("\n").replace("\\n", "\n")
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        daemon.stderr.close()
        state = read_state(layout) or {}
        record = _supervisor(state)
        if state.get("status") == "running" and record is not None and record.pid == daemon.pid:
            return Cluster.attach(layout.root)
        code = daemon.wait(30)
    except BaseException:
        if daemon.poll() is None:  # interrupted: the daemon stops what it started
            daemon.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(DAEMON_STOP_SECONDS)
        raise
    raise ClusterError(
        error
        or f"the cluster's daemon exited with code {code} before the cluster was ready; "
        f"log: {layout.log('supervisor')}"
    )


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
