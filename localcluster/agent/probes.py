"""Container probes as the kubelet runs them: startup, liveness and readiness.

One asyncio task per started container that has probes (:class:`Prober`), created when the
container starts and cancelled when it exits or its pod object vanishes, so a restarted
container begins with fresh probe state as with the kubelet (its probe workers reset on a
new container ID). While a pod terminates only its readiness probes go on, as with the
kubelet (``StopLivenessAndStartup``). No threads: HTTP and TCP probes are asyncio
connections, exec probes are subprocesses.

Semantics (``pkg/kubelet/prober``):

- ``startupProbe`` runs first; until it succeeds the container is not ``started``, not
  ready, and liveness and readiness probes do not run. ``failureThreshold`` failures kill
  the container (restarted per ``restartPolicy``), as a liveness failure does. Once it
  succeeded it never runs again for that container.
- ``readinessProbe`` starts as failed: the container is ready only after
  ``successThreshold`` consecutive successes, and unready after ``failureThreshold``
  consecutive failures. Without a readiness probe a container is ready once started.
- ``livenessProbe`` starts as succeeded; ``failureThreshold`` consecutive failures kill
  the container (SIGTERM, the probe's ``terminationGracePeriodSeconds`` or else the pod's,
  then SIGKILL) with a ``Killing`` event, and the runtime restarts it per ``restartPolicy``.
- Timing: the first probe runs ``initialDelaySeconds`` after the container started, then
  every ``periodSeconds`` (default 10, minimum 1); each attempt is bounded by
  ``timeoutSeconds`` (default 1). Right after the startup probe succeeds, readiness is
  probed at once (the kubelet's manual trigger).
- Every failed attempt is a ``Warning`` ``Unhealthy`` event ("Readiness probe failed:
  ..."); an attempt that could not be made (a named port the container does not declare)
  is "... probe errored ..." and does not count towards a threshold.

Handlers: ``httpGet`` (host defaults to the pod IP; ``port`` by number or by the
container's port name; ``scheme`` HTTP or HTTPS without certificate verification;
``httpHeaders``; 200-399 is success; redirects are not followed: a 3xx is a success),
``tcpSocket`` (a connection that opens is success) and ``exec`` (the command runs in the
container's mount and UTS namespaces via ``nsenter``, with the container's environment and
working directory; exit 0 is success). ``grpc`` probes are not supported: the container
gets a ``ProbeWarning`` event and the probe is ignored (treated as absent).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

Kind = Literal["startup", "liveness", "readiness"]
KINDS: tuple[Kind, ...] = ("startup", "liveness", "readiness")
FIELDS: dict[Kind, str] = {
    "startup": "startupProbe",
    "liveness": "livenessProbe",
    "readiness": "readinessProbe",
}
USER_AGENT = "kube-probe/1.36"
MAX_OUTPUT = 10 * 1024


class ProbeError(Exception):
    """The probe could not be attempted (its result is thrown away, as the kubelet does)."""


class Unsupported(Exception):
    """A probe handler this agent cannot run."""


# Specification ------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpGet:
    port: int | str
    path: str = "/"
    host: str | None = None
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TcpSocket:
    port: int | str
    host: str | None = None


@dataclass(frozen=True)
class Exec:
    command: tuple[str, ...]


Handler = HttpGet | TcpSocket | Exec


@dataclass(frozen=True)
class ProbeSpec:
    kind: Kind
    handler: Handler
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace: float | None = None

    @property
    def title(self) -> str:
        return self.kind.capitalize()


def parse_handler(raw: Mapping[str, Any]) -> Handler:
    """The probe's handler; :class:`Unsupported` for gRPC or a probe without one."""
    if "httpGet" in raw:
        http = raw["httpGet"]
        headers = tuple(
            (str(h["name"]), str(h.get("value", ""))) for h in http.get("httpHeaders") or []
        )
        return HttpGet(
            port=http["port"],
            path=http.get("path") or "/",
            host=http.get("host") or None,
            scheme=str(http.get("scheme") or "HTTP").upper(),
            headers=headers,
        )
    if "tcpSocket" in raw:
        tcp = raw["tcpSocket"]
        return TcpSocket(port=tcp["port"], host=tcp.get("host") or None)
    if "exec" in raw:
        command = tuple(str(part) for part in raw["exec"].get("command") or [])
        if not command:
            raise Unsupported("exec probe without a command")
        return Exec(command)
    if "grpc" in raw:
        raise Unsupported("gRPC probes are not supported by the localcluster node agent")
    raise Unsupported("probe without a handler (httpGet, tcpSocket, exec or grpc)")


def parse_probe(kind: Kind, raw: Mapping[str, Any]) -> ProbeSpec:
    """A probe with the API server's defaults; periods and thresholds at least 1."""

    def number(name: str, default: float, minimum: float) -> float:
        value = raw.get(name)
        return max(float(default if value is None else value), minimum)

    grace = raw.get("terminationGracePeriodSeconds")
    success = int(number("successThreshold", 1, 1))
    return ProbeSpec(
        kind=kind,
        handler=parse_handler(raw),
        initial_delay=number("initialDelaySeconds", 0, 0),
        period=number("periodSeconds", 10, 1),
        timeout=number("timeoutSeconds", 1, 1),
        # Liveness and startup probes must have successThreshold 1 (API validation).
        success_threshold=success if kind == "readiness" else 1,
        failure_threshold=int(number("failureThreshold", 3, 1)),
        termination_grace=None if grace is None or kind == "readiness" else float(grace),
    )


def container_probes(container: Mapping[str, Any]) -> tuple[list[ProbeSpec], list[str]]:
    """The container's probes, and a warning per probe that is ignored (unsupported)."""
    specs, warnings = [], []
    for kind in KINDS:
        raw = container.get(FIELDS[kind])
        if not raw:
            continue
        try:
            specs.append(parse_probe(kind, raw))
        except Unsupported as error:
            warnings.append(
                f"{kind.capitalize()} probe of container {container.get('name')} is not run: "
                f"{error}; the container is treated as having no {FIELDS[kind]}"
            )
    return specs, warnings


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe port: a number, or the name of one of the container's ports (the kubelet
    also accepts a numeric string)."""
    if isinstance(port, str):
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        if not port.isdigit():
            names = [p.get("name") for p in container.get("ports") or [] if p.get("name")]
            raise ProbeError(f"couldn't find port: {port} in container ports {names}")
        port = int(port)
    if not 0 < port < 65536:
        raise ProbeError(f"invalid port number: {port}")
    return port


# Threshold counting ---------------------------------------------------------------------


@dataclass
class Threshold:
    """The kubelet's result smoothing: the result changes only after ``successThreshold``
    consecutive successes or ``failureThreshold`` consecutive failures."""

    result: bool
    last: bool | None = None
    run: int = 0

    @classmethod
    def initial(cls, kind: Kind) -> Threshold:
        # Readiness starts failed, liveness succeeded, startup not yet succeeded.
        return cls(result=kind == "liveness")

    def observe(self, success: bool, spec: ProbeSpec) -> bool:
        """Count one attempt; True if the result changed."""
        if success == self.last:
            self.run += 1
        else:
            self.last, self.run = success, 1
        needed = spec.success_threshold if success else spec.failure_threshold
        if self.run < needed or success == self.result:
            return False
        self.result = success
        return True


# Handlers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where and how a container's probes reach it."""

    pod_ip: str
    container: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    pid: int | None = None
    """A process inside the container's namespaces (exec probes enter them), or None."""
    nsenter: str | None = None
    setpriv: str | None = None


def http_request(handler: HttpGet, host: str, port: int) -> bytes:
    """The HTTP/1.1 request the kubelet's prober sends (User-Agent, Accept, user headers;
    a ``Host`` header overrides the host)."""
    names = {name.lower() for name, _ in handler.headers}
    lines = [f"GET {handler.path if handler.path.startswith('/') else '/' + handler.path} HTTP/1.1"]
    if "host" not in names:
        lines.append(f"Host: {host}:{port}")
    if "user-agent" not in names:
        lines.append(f"User-Agent: {USER_AGENT}")
    if "accept" not in names:
        lines.append("Accept: */*")
    lines += [f"{name}: {value}" for name, value in handler.headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def http_outcome(status_line: bytes) -> tuple[bool, str]:
    """Success for 200-399, as the kubelet decides from the status line."""
    parts = status_line.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        return False, f"HTTP probe failed: malformed response {status_line[:100]!r}"
    code = int(parts[1])
    if 200 <= code < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {code}"


@functools.cache
def _insecure() -> ssl.SSLContext:
    """HTTPS probes do not verify certificates (as the kubelet's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def probe_http(handler: HttpGet, target: Target, limit: float) -> tuple[bool, str]:
    port = resolve_port(handler.port, target.container)
    host = handler.host or target.pod_ip
    url = f"{handler.scheme.lower()}://{host}:{port}{handler.path}"
    writer = None
    try:
        async with asyncio.timeout(limit):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=_insecure() if handler.scheme == "HTTPS" else None
            )
            writer.write(http_request(handler, host, port))
            await writer.drain()
            status_line = await reader.readline()
    except TimeoutError:
        return False, (
            f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting '
            "headers)"
        )
    except OSError as error:
        if writer is None:
            return False, f'Get "{url}": dial tcp {host}:{port}: connect: {_reason(error)}'
        return False, f'Get "{url}": read tcp {host}:{port}: {_reason(error)}'
    finally:
        if writer is not None:
            writer.close()
    return http_outcome(status_line)


async def probe_tcp(handler: TcpSocket, target: Target, limit: float) -> tuple[bool, str]:
    port = resolve_port(handler.port, target.container)
    host = handler.host or target.pod_ip
    try:
        async with asyncio.timeout(limit):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return False, f"dial tcp {host}:{port}: i/o timeout"
    except OSError as error:
        return False, f"dial tcp {host}:{port}: connect: {_reason(error)}"
    writer.close()
    return True, ""


def exec_argv(handler: Exec, target: Target) -> list[str]:
    """The exec probe's command line: entering the container's namespaces when it has
    them (``nsenter -w``: the container's working directory), tied to the agent's life."""
    argv = list(handler.command)
    if target.nsenter and target.pid is not None:
        argv = [target.nsenter, "-t", str(target.pid), "--mount", "--uts", "-w", "--", *argv]
    if target.setpriv:
        argv = [target.setpriv, "--pdeathsig=KILL", "--", *argv]
    return argv


async def probe_exec(handler: Exec, target: Target, limit: float) -> tuple[bool, str]:
    argv = exec_argv(handler, target)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(target.env),
            cwd=target.cwd,
            start_new_session=True,
        )
    except OSError as error:
        return False, f"exec: {error}"
    try:
        async with asyncio.timeout(limit):
            output, _ = await process.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return False, f"command {' '.join(handler.command)!r} timed out"
    except asyncio.CancelledError:  # the container stopped: leave no probe process behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    text = output[:MAX_OUTPUT].decode(errors="replace")
    return process.returncode == 0, text


async def attempt(spec: ProbeSpec, target: Target) -> tuple[bool, str]:
    """One probe attempt: (success, output); :class:`ProbeError` if it could not be made."""
    handler = spec.handler
    if isinstance(handler, HttpGet):
        return await probe_http(handler, target, spec.timeout)
    if isinstance(handler, TcpSocket):
        return await probe_tcp(handler, target, spec.timeout)
    return await probe_exec(handler, target, spec.timeout)


def _reason(error: OSError) -> str:
    """Go's wording (``connection refused``) rather than asyncio's ``Connect call failed``."""
    return (os.strerror(error.errno) if error.errno else str(error)).lower()


# The per-container task -----------------------------------------------------------------


Event = Callable[[str, str, str], None]
"""``(type, reason, message)``: a Warning/Normal event about the container."""


class Prober:
    """Runs a started container's probes; ``started`` and ``ready`` are None for a probe
    the container does not have (then the runtime uses "running" for both)."""

    def __init__(
        self,
        specs: Sequence[ProbeSpec],
        target: Target,
        *,
        changed: Callable[[], None],
        kill: Callable[[ProbeSpec, str], None],
        event: Event,
    ) -> None:
        self.specs = {spec.kind: spec for spec in specs}
        self.target = target
        self.changed, self.kill, self.event = changed, kill, event
        self.states = {kind: Threshold.initial(kind) for kind in self.specs}
        self.task: asyncio.Task[None] | None = None
        self.terminating = False

    @property
    def started(self) -> bool | None:
        return self.states["startup"].result if "startup" in self.states else None

    @property
    def ready(self) -> bool | None:
        return self.states["readiness"].result if "readiness" in self.states else None

    def start(self, name: str) -> None:
        if self.specs:
            self.task = asyncio.create_task(self._run(), name=f"probe-{name}")

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def stop_liveness_and_startup(self) -> None:
        """The pod is terminating: as the kubelet, only readiness probes go on."""
        self.terminating = True

    def _active(self) -> list[ProbeSpec]:
        if self.started is False:
            return [] if self.terminating else [self.specs["startup"]]
        kinds = ("readiness",) if self.terminating else ("readiness", "liveness")
        return [spec for kind, spec in self.specs.items() if kind in kinds]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        due = {kind: began + spec.initial_delay for kind, spec in self.specs.items()}
        while True:
            active = self._active()
            if not active:
                return
            wake = min(due[spec.kind] for spec in active)
            await asyncio.sleep(max(0.0, wake - loop.time()))
            moment = loop.time()
            batch = [spec for spec in active if due[spec.kind] <= moment]
            outcomes = await asyncio.gather(*(self._attempt(spec) for spec in batch))
            for spec, outcome in zip(batch, outcomes, strict=True):
                due[spec.kind] = moment + spec.period
                if outcome is None:
                    continue
                was_started = self.started
                if self._apply(spec, *outcome):
                    return
                if was_started is False and self.started:
                    # Probe readiness (and liveness) at once once started, not a period later.
                    for kind, other in self.specs.items():
                        if kind != "startup":
                            due[kind] = max(began + other.initial_delay, loop.time())

    async def _attempt(self, spec: ProbeSpec) -> tuple[bool, str] | None:
        try:
            return await attempt(spec, self.target)
        except ProbeError as error:
            problem = str(error)
        except Exception as error:  # a bug here must not end the container's probing
            log.exception(
                "%s probe of container %s could not run",
                spec.title,
                self.target.container.get("name"),
            )
            problem = repr(error)
        self.event(
            "Warning",
            "Unhealthy",
            f"{spec.title} probe errored and resulted in unknown state: {problem}",
        )
        return None

    def _apply(self, spec: ProbeSpec, success: bool, output: str) -> bool:
        """Count one result; True if the container is being killed (probing ends)."""
        if not success:
            self.event("Warning", "Unhealthy", f"{spec.title} probe failed: {output}".rstrip())
        if not self.states[spec.kind].observe(success, spec):
            return False
        if spec.kind == "readiness" or success:
            self.changed()
            return False
        what = "liveness" if spec.kind == "liveness" else "startup"
        self.kill(
            spec,
            f"Container {self.target.container.get('name')} failed {what} probe, will be restarted",
        )
        return True
