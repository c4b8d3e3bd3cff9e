"""Run-mode pods: each container's command as a local process, supervised like a kubelet.

How a container is started (as root)::

    setpriv --pdeathsig=KILL -- \\
      unshare --mount --uts --fork --kill-child=KILL -- \\
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \\
          pod-init <pod hosts file> <pod hostname> <command> <args>...

- its own mount namespace, where the pod's hosts file (see :mod:`.hosts`) is bind-mounted
  over ``/etc/hosts`` (private propagation: the machine's file is untouched), and its own
  UTS namespace whose hostname is the pod's hostname, so ``gethostname()`` resolves to the
  pod IP (gloo needs that);
- its own session and process group: deletion signals the whole group;
- ``--pdeathsig``/``--kill-child``: if the agent dies, even by SIGKILL, its processes die.

Without root (or without ``unshare``) containers run directly, with a warning: no
private hostname, and peers' DNS names do not resolve.

Phases and restarts follow the kubelet: ``restartPolicy`` Never/OnFailure/Always with the
kubelet's 10 s doubling back-off (capped at 5 min), init containers in order before the
others, exit code 128+N for a process killed by signal N, reason Completed/Error.
Startup, liveness and readiness probes run as the kubelet runs them (:mod:`.probes`): a
container without a readiness probe is ready once started; a failed liveness or startup
probe kills the container, which is then restarted per ``restartPolicy``. Pod ``Ready``
also waits for the pod's ``readinessGates``. Status is written only when it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.agent import envvars, probes
from localcluster.agent.events import EventRecorder
from localcluster.agent.hosts import HostsFiles, pod_hostname
from localcluster.agent.status import (
    Conditions,
    ContainerStatus,
    now,
    patch,
    pod_phase,
    running_state,
    terminated_state,
    waiting_state,
)
from localcluster.agent.volumes import Mount, VolumeNotReady, Volumes
from localcluster.procs import ProcessRecord

log = logging.getLogger(__name__)

# Runs inside the pod's new mount and UTS namespaces: hosts file, hostname, then N volume
# bind mounts, then exec the command. Arguments: hosts file, hostname, N, N sources, N
# targets, command. The sources are first bound into a private tmpfs at STAGE, so that a
# volume mounted over a directory holding the cluster directory (say an emptyDir at /tmp
# while the cluster lives under /tmp) cannot hide the sources of the volumes after it.
STAGE = "/.localcluster-mounts"
POD_INIT = f"""
mount --bind -- "$1" /etc/hosts && hostname -- "$2" || exit 125
n=$3; shift 3
[ "$n" -eq 0 ] || mount -t tmpfs -o size=1m,mode=0700 localcluster {STAGE} || exit 125
i=0
while [ "$i" -lt "$n" ]; do
  i=$((i + 1))
  if [ -d "$1" ]; then mkdir -- "{STAGE}/$i"; else touch -- "{STAGE}/$i"; fi
  mount --bind -- "$1" "{STAGE}/$i" || exit 125
  shift
done
i=0
while [ "$i" -lt "$n" ]; do
  i=$((i + 1))
  if [ -d "{STAGE}/$i" ]; then mkdir -p -- "$1"
  else mkdir -p -- "$(dirname -- "$1")" && {{ [ -e "$1" ] || touch -- "$1"; }}; fi
  mount --bind -- "{STAGE}/$i" "$1" || exit 125
  shift
done
exec "$@"
"""
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
VOLUME_RETRY_START, VOLUME_RETRY_MAX = 0.2, 5.0


@dataclass(frozen=True)
class Sandbox:
    """How processes are isolated on this machine (decided once at agent start)."""

    setpriv: str | None
    unshare: str | None
    nsenter: str | None = None
    """Enters a container's namespaces for exec probes (only with ``unshare``)."""

    @classmethod
    def detect(cls) -> Sandbox:
        setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
        if unshare and os.geteuid() == 0:
            Path(STAGE).mkdir(exist_ok=True)
            probe = os.system(f"{unshare} --mount --uts --fork true >/dev/null 2>&1")
            if probe != 0:
                unshare = None
        else:
            unshare = None
        if unshare is None:
            log.warning(
                "no private mount/UTS namespaces (needs root and unshare): pod processes run "
                "directly, with the machine's hostname and /etc/hosts; pod DNS names of "
                "headless Services will NOT resolve for them"
            )
        return cls(setpriv, unshare, shutil.which("nsenter") if unshare else None)

    def wrap(self, argv: list[str], hosts: Path, hostname: str, mounts: list[Mount]) -> list[str]:
        wrapped = list(argv)
        if self.unshare:
            sources = [str(m.source) for m in mounts]
            targets = [str(m.target) for m in mounts]
            wrapped = [
                self.unshare, "--mount", "--uts", "--fork", "--kill-child=KILL", "--",
                "sh", "-c", POD_INIT, "pod-init", str(hosts), hostname, str(len(mounts)),
                *sources, *targets, *wrapped,
            ]  # fmt: skip
        elif mounts:
            log.warning("volume mounts ignored (no mount namespaces): %s", mounts)
        if self.setpriv:
            wrapped = [self.setpriv, "--pdeathsig=KILL", "--", *wrapped]
        return wrapped


class StartFailure(Exception):
    def __init__(self, reason: str, message: str, exit_code: int = 128) -> None:
        super().__init__(message)
        self.reason, self.message, self.exit_code = reason, message, exit_code


@dataclass
class Container:
    spec: Mapping[str, Any]
    status: ContainerStatus
    init: bool = False
    process: asyncio.subprocess.Process | None = None
    record: ProcessRecord | None = None
    kill_code: int | None = None
    kill_reason: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    prober: probes.Prober | None = None
    probe_killed: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])


@dataclass
class RunPod:
    """One pod of a run-mode node, from first sight to its terminal status."""

    pod: dict[str, Any]
    host_ip: str
    pod_ip: str
    directory: Path
    sandbox: Sandbox
    hosts: HostsFiles
    volumes: Volumes
    service_env: Mapping[str, str]
    report: Callable[[dict[str, Any]], None]
    events: EventRecorder | None = None
    containers: list[Container] = field(default_factory=list)
    init_containers: list[Container] = field(default_factory=list)
    conditions: Conditions = field(default_factory=Conditions)
    start_time: str = field(default_factory=now)
    terminating: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    message: str | None = None
    disruption: dict[str, Any] | None = None
    phase: str = "Pending"
    last_patch: dict[str, Any] | None = None
    _volume_paths: dict[str, Path] = field(default_factory=dict)
    _volume_error: str | None = None

    def __post_init__(self) -> None:
        spec = self.pod["spec"]
        self.init_containers = [
            Container(
                c,
                ContainerStatus(c["name"], c.get("image", ""), waiting_state("PodInitializing")),
                init=True,
            )
            for c in spec.get("initContainers") or []
        ]
        self.containers = [
            Container(
                c,
                ContainerStatus(c["name"], c.get("image", ""), waiting_state("ContainerCreating")),
            )
            for c in spec.get("containers") or []
        ]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.gates = [g["conditionType"] for g in spec.get("readinessGates") or []]
        self._gate_status: dict[str, str] = {}
        self._probe_warnings: set[str] = set()

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def hosts_file(self) -> Path:
        return self.directory / f"{self.uid}.hosts"

    # Lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.hosts.remove_pod(self.uid)
            self.finished.set()

    async def _run(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hosts.add_pod(self.uid, self.hosts_file, self.pod, self.pod_ip)
        self.conditions.set("PodReadyToStartContainers", True)
        self.conditions.set(
            "Initialized",
            not self.init_containers,
            "ContainersNotInitialized" if self.init_containers else None,
        )
        self.conditions.set("ContainersReady", False, "ContainersNotReady")
        self.conditions.set("Ready", False, "ContainersNotReady")
        self._report("Pending")
        await self._prepare_volumes()
        for container in self.init_containers:
            if self.terminating:
                break
            if not await self._supervise(container):
                self._fail_init(container)
                return
        if not self.terminating:
            self.conditions.set("Initialized", True)
            await asyncio.gather(*(self._supervise(c) for c in self.containers))
        self._report_terminal()

    async def _prepare_volumes(self) -> None:
        """Materialize the volumes; while a source is missing (a ConfigMap not created yet)
        or the apiserver does not answer, stay Pending and try again, as the kubelet does
        (it reports FailedMount and retries); a volume that can never work fails the pod."""
        delay = VOLUME_RETRY_START
        while not self.terminating:
            try:
                self._volume_paths = await self.volumes.prepare(self.pod, self.directory)
                return
            except envvars.UnsupportedEnv as error:
                self._volume_error = str(error)
                return
            except VolumeNotReady as error:
                message = f"MountVolume.SetUp failed: {error}"
                log.info(
                    "pod %s/%s: %s; retrying in %.1f s", self.namespace, self.name, message, delay
                )
                for container in self.init_containers + self.containers:
                    reason = "PodInitializing" if container.init else "ContainerCreating"
                    container.status.state = waiting_state(reason, message)
                self._report("Pending")
                await self._sleep(delay)
                delay = min(delay * 2, VOLUME_RETRY_MAX)

    def _fail_init(self, failed: Container) -> None:
        for container in self.containers:
            container.status.state = waiting_state("PodInitializing")
        self.conditions.set("Initialized", False, "ContainersNotInitialized")
        self._report("Failed")

    async def _supervise(self, container: Container) -> bool:
        """Run one container until it is done for good; True if it ended with exit 0."""
        backoff = BACKOFF_START
        while True:
            if self.terminating:
                if not container.status.terminated:
                    container.status.state = terminated_state(
                        137,
                        "ContainerStatusUnknown",
                        message="The pod was deleted before the container started",
                    )
                return False
            try:
                await self._start(container)
            except StartFailure as failure:
                container.status.state = terminated_state(
                    failure.exit_code, failure.reason, message=failure.message
                )
                self._update_running()
                exit_code = failure.exit_code
            else:
                self._update_running()
                exit_code = await self._wait(container)
            if not self._restarts(container, exit_code):
                self._update_running()
                return exit_code == 0
            container.status.last_state = container.status.state
            container.status.restart_count += 1
            container.status.state = waiting_state(
                "CrashLoopBackOff",
                f"back-off {backoff:g}s restarting failed container={container.name} "
                f"pod={self.name}",
            )
            self._update_running()
            await self._sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _restarts(self, container: Container, exit_code: int) -> bool:
        if self.terminating:
            return False
        if container.init:
            return exit_code != 0 and self.restart_policy != "Never"
        if container.probe_killed:  # the kubelet restarts it whatever the exit code
            return self.restart_policy != "Never"
        return self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and exit_code != 0
        )

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _start(self, container: Container) -> None:
        spec = container.spec
        if self._volume_error:
            raise StartFailure("CreateContainerConfigError", self._volume_error)
        try:
            base = {**envvars.base_env(pod_hostname(self.pod)), **self.service_env}
            env = envvars.container_env(self.pod_with_ips(), spec, base)
            argv = envvars.container_argv(spec, env)
            mounts = self.volumes.mounts(spec, self._volume_paths)
        except envvars.UnsupportedEnv as error:
            raise StartFailure(error.reason, str(error)) from None
        cwd = Path(spec["workingDir"]) if spec.get("workingDir") else self.directory
        if not cwd.is_dir():
            raise StartFailure("StartError", f"workingDir {cwd} does not exist on this machine")
        executable = argv[0]
        if "/" not in executable:
            if shutil.which(executable, path=env.get("PATH")) is None:
                raise StartFailure(
                    "StartError", f'exec: "{executable}": executable file not found in $PATH'
                )
        elif not os.access(cwd / executable, os.X_OK):
            raise StartFailure("StartError", f'exec: "{executable}": not found or not executable')
        log_path = self.directory / f"{container.name}.log"
        # Opening a local log file is quick; the event loop is not held up in practice.
        with open(log_path, "ab") as out:  # noqa: ASYNC230
            process = await asyncio.create_subprocess_exec(
                *self.sandbox.wrap(argv, self.hosts_file, pod_hostname(self.pod), mounts),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        container.process = process
        container.kill_code = container.kill_reason = None
        container.probe_killed = False
        try:
            container.record = ProcessRecord.of(process.pid)
            (self.directory / f"{container.name}.pid").write_text(
                json.dumps(container.record.to_json())
            )
        except ProcessLookupError:
            container.record = None
        container.status.container_id = f"localcluster://{process.pid}"
        container.status.state = running_state(now())
        container.env, container.cwd = env, cwd
        if not container.init:
            self._start_probes(container)
        log.info(
            "pod %s/%s container %s started: pid %d",
            self.namespace,
            self.name,
            container.name,
            process.pid,
        )

    async def _wait(self, container: Container) -> int:
        assert container.process is not None
        code = await container.process.wait()
        self._stop_probes(container)
        exit_code = 128 - code if code < 0 else code
        reason = None
        if container.kill_code is not None:
            exit_code, reason = container.kill_code, container.kill_reason
        started = (container.status.state.get("running") or {}).get("startedAt")
        container.status.state = terminated_state(
            exit_code,
            reason,
            started_at=started,
            container_id=container.status.container_id,
            signal=-code if code < 0 else None,
        )
        container.process = None
        (self.directory / f"{container.name}.pid").unlink(missing_ok=True)
        log.info(
            "pod %s/%s container %s exited: %d",
            self.namespace,
            self.name,
            container.name,
            exit_code,
        )
        return exit_code

    # Status ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    def pod_with_ips(self) -> dict[str, Any]:
        status = {
            **self.pod.get("status", {}),
            "podIP": self.pod_ip,
            "hostIP": self.host_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "hostIPs": [{"ip": self.host_ip}],
        }
        return {**self.pod, "status": status}

    def _update_running(self) -> None:
        ready = all(c.status.ready for c in self.containers) and bool(self.containers)
        self.conditions.set("ContainersReady", ready, None if ready else "ContainersNotReady")
        gates = all(self._gate_status.get(gate) == "True" for gate in self.gates)
        reason = "ContainersNotReady" if not ready else None if gates else "ReadinessGatesNotReady"
        self.conditions.set("Ready", ready and gates, reason)
        started = any(c.status.state.get("running") or c.status.terminated for c in self.containers)
        self._report("Running" if started else "Pending")

    def _report_terminal(self) -> None:
        phase = pod_phase([c.status for c in self.containers]) if self.containers else "Failed"
        if phase == "Running" or self.disruption:
            # Terminated before every container ran, or shut down by the node: the kubelet
            # reports Failed whatever the exit codes.
            phase = "Failed"
        self.conditions.set("ContainersReady", False, "PodCompleted")
        self.conditions.set("Ready", False, "PodCompleted")
        self._report(phase)

    def _report(self, phase: str) -> None:
        self.phase = phase
        body = patch(
            self.pod,
            phase=phase,
            host_ip=self.host_ip,
            pod_ip=self.pod_ip,
            start_time=self.start_time,
            conditions=self.conditions,
            containers=[c.status for c in self.containers],
            init_containers=[c.status for c in self.init_containers],
            reason=self.reason,
            message=self.message,
            extra_conditions=[self.disruption] if self.disruption else None,
        )
        if body == self.last_patch:
            return  # nothing changed: no write (probes re-evaluate status every period)
        self.last_patch = body
        self.report(body)

    def observe(self, pod: Mapping[str, Any]) -> None:
        """A newer pod object from the watch: track its metadata and, for readiness gates,
        the conditions other controllers set (the pod's Ready condition follows them)."""
        self.pod["metadata"] = pod["metadata"]
        if not self.gates:
            return
        conditions = (pod.get("status") or {}).get("conditions") or []
        wanted = set(self.gates)
        status = {c["type"]: c.get("status", "") for c in conditions if c.get("type") in wanted}
        if status == self._gate_status:
            return
        self._gate_status = status
        if self.phase == "Running" and not self.terminating:
            self._update_running()

    # Probes ---------------------------------------------------------------------------

    def _start_probes(self, container: Container) -> None:
        specs, warnings = probes.container_probes(container.spec)
        for warning in warnings:
            if warning not in self._probe_warnings:
                self._probe_warnings.add(warning)
                log.warning("pod %s/%s: %s", self.namespace, self.name, warning)
                self._event(container, "Warning", "ProbeWarning", warning)
        assert container.process is not None
        in_namespaces = self.sandbox.unshare is not None and self.sandbox.nsenter is not None
        target = probes.Target(
            pod_ip=self.pod_ip,
            container=container.spec,
            env=container.env,
            cwd=container.cwd,
            pid=container.process.pid if in_namespaces else None,
            nsenter=self.sandbox.nsenter if in_namespaces else None,
            setpriv=self.sandbox.setpriv,
        )
        prober = probes.Prober(
            specs,
            target,
            changed=lambda: self._probe_changed(container),
            kill=lambda spec, message: self._probe_kill(container, spec, message),
            event=lambda kind, reason, message: self._event(container, kind, reason, message),
        )
        container.prober = prober
        container.status.probe_started, container.status.probe_ready = prober.started, prober.ready
        prober.start(f"{self.name}-{container.name}")

    def _stop_probes(self, container: Container) -> None:
        if container.prober is not None:
            container.prober.stop()
            container.prober = None

    def _probe_changed(self, container: Container) -> None:
        prober = container.prober
        if prober is None:
            return
        container.status.probe_started, container.status.probe_ready = prober.started, prober.ready
        self._update_running()

    def _probe_kill(self, container: Container, spec: probes.ProbeSpec, message: str) -> None:
        """A liveness or startup probe failed for good: stop the container gracefully
        (SIGTERM, grace, SIGKILL); :meth:`_supervise` restarts it per restartPolicy."""
        process = container.process
        if process is None or self.terminating:
            return
        grace = spec.termination_grace
        if grace is None:
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        log.info("pod %s/%s: %s", self.namespace, self.name, message)
        self._event(container, "Normal", "Killing", message)
        container.probe_killed = True
        self._signal(container, signal.SIGTERM)

        def kill() -> None:
            if container.process is process:
                self._signal(container, signal.SIGKILL)

        asyncio.get_running_loop().call_later(max(grace, 0.0), kill)

    def _event(self, container: Container, kind: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.record(
                self.pod, kind=kind, reason=reason, message=message, container=container.name
            )

    # Signals --------------------------------------------------------------------------

    def _live(self) -> list[Container]:
        return [c for c in self.init_containers + self.containers if c.process is not None]

    def _signal(self, container: Container, sig: int) -> None:
        if container.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(container.process.pid, sig)

    async def terminate(self, grace: float) -> None:
        """Graceful stop, as for a deleted pod: SIGTERM, ``grace`` seconds, SIGKILL."""
        self.terminating = True
        self._wake.set()
        for container in self._live():
            if container.prober is not None:
                container.prober.stop_liveness_and_startup()
            self._signal(container, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.finished.wait(), timeout=max(grace, 0.0))
        except TimeoutError:
            for container in self._live():
                self._signal(container, signal.SIGKILL)
            await self.finished.wait()

    def kill_now(self) -> None:
        """The pod object is gone (force-deleted) or its VM vanished: SIGKILL, no status."""
        self.terminating = True
        self.report = lambda _patch: None
        self._wake.set()
        for container in self._live():
            self._stop_probes(container)
            self._signal(container, signal.SIGKILL)

    def kill_container(self, name: str | None, exit_code: int, reason: str | None) -> list[str]:
        """Fault injection: SIGKILL a container's processes and report ``exit_code``."""
        killed = []
        for container in self._live():
            if name is None or container.name == name:
                container.kill_code, container.kill_reason = exit_code, reason
                self._signal(container, signal.SIGKILL)
                killed.append(container.name)
        return killed

    def processes(self) -> dict[str, int]:
        return {c.name: c.process.pid for c in self._live() if c.process is not None}
