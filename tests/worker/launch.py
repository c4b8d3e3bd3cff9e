"""Run worker processes the way a kubelet runs worker pods, on this machine (test helper).

Each process gets what a pod gets: the env the operator's builder produces
(``resolved_env``), its own loopback IP as pod IP, its own UTS namespace with
hostname = pod name, and its own /etc/hosts (bind-mounted in a private mount namespace)
that maps its own name and its peers' ``<pod>.<service>`` names to their pod IPs. gloo
resolves gethostname(), so without this CPU collectives fail at start-up.

Needs root (``unshare --mount --uts``). Every gang picks a random 127.x.y.0/24 block so
concurrent test runs on one machine do not collide on coordinator or metrics ports.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpu_operator import catalog, contract
from tpu_operator.builders.wiring import PodWiring, Ports, resolved_env

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# Runs as argv of `sh -c`: $0 = hosts file, $1 = hostname, the rest = the command.
_POD_SHELL = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'


def worker_command(*args: str) -> list[str]:
    """argv of the ``tpu-worker`` console script of this venv."""
    script = VENV_BIN / "tpu-worker"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "tpu_worker", *args]


def can_isolate() -> bool:
    """Whether this machine can give processes their own hostname and /etc/hosts."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "true"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


def wirings(
    accelerator: str = "tpu-v5-lite-podslice",
    topology: str = "2x4",
    *,
    chips_per_host: int | None = 4,
    num_slices: int = 1,
    job: str = "demo",
    attempt: int = 0,
) -> list[PodWiring]:
    """Every pod of a job, ordered by global process id, as the operator wires them."""
    shape = catalog.shape(accelerator, topology, chips_per_host)
    service = job
    return [
        PodWiring(
            job_name=job,
            service=service,
            slice_name=contract.slice_name(job, s),
            shape=shape,
            num_slices=num_slices,
            slice_index=s,
            worker_index=w,
            attempt=attempt,
            ports=Ports(),
        )
        for s in range(num_slices)
        for w in range(shape.hosts)
    ]


def _free_block(ports: Sequence[int]) -> str:
    """A 127.x.y block whose .1 address has the given ports free."""
    for _ in range(50):
        block = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind((f"{block}.1", port))
        except OSError:
            continue
        return block
    raise RuntimeError("no free 127.x.y block for a local gang")


@dataclass
class Pod:
    """One running (or finished) worker process."""

    wiring: PodWiring
    ip: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None

    @property
    def name(self) -> str:
        return self.wiring.pod_name

    @property
    def process_id(self) -> int:
        return self.wiring.process_id

    @property
    def metrics_url(self) -> str:
        return f"http://{self.ip}:{self.wiring.ports.metrics}/metrics"

    @property
    def uid(self) -> str:
        """The pod's UID (what control requests are signed for)."""
        return self.env[contract.ENV_POD_UID]

    @property
    def control_url(self) -> str:
        """Base URL of the supervisor's control channel (when the pod runs one)."""
        return f"http://{self.ip}:{contract.DEFAULT_CONTROL_PORT}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def poll(self) -> int | None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


@dataclass
class Gang:
    """The worker pods of one job attempt, run as local processes."""

    workdir: Path
    pods: list[Pod] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        all_wirings: Sequence[PodWiring],
        workdir: Path,
        extra_env: Mapping[str, str] | None = None,
    ) -> Gang:
        ports = (
            all_wirings[0].ports.coordinator,
            all_wirings[0].ports.metrics,
            contract.DEFAULT_CONTROL_PORT,
        )
        block = _free_block(ports)
        workdir.mkdir(parents=True, exist_ok=True)
        pods = []
        for index, wiring in enumerate(all_wirings):
            ip = f"{block}.{index + 1}"
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": os.environ.get("HOME", "/root"),
                "PYTHONUNBUFFERED": "1",
                "JAX_PLATFORMS": "cpu",
                **resolved_env(wiring, ip),
                # The downward API's metadata.uid of a supervised pod.
                contract.ENV_POD_UID: str(uuid.uuid4()),
                **(extra_env or {}),
            }
            pods.append(Pod(wiring, ip, env, workdir / f"{wiring.pod_name}.log"))
        return cls(workdir, pods)

    def _hosts_file(self, pod: Pod, present: Sequence[Pod]) -> Path:
        service = pod.wiring.service
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for peer in present:
            fqdn = contract.pod_dns_name(peer.name, service)
            names = f"{fqdn} {peer.name}" if peer is pod else fqdn
            lines.append(f"{peer.ip}\t{names}")
        path = self.workdir / f"{pod.name}.hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(
        self,
        argv: Sequence[str],
        *,
        only: Sequence[int] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> list[Pod]:
        """Start the pods with global process ids in ``only`` (default all).

        Pods left out do not exist: their DNS names resolve nowhere, as in Kubernetes.
        """
        chosen = [p for p in self.pods if only is None or p.process_id in only]
        for pod in chosen:
            hosts = self._hosts_file(pod, chosen)
            command = ["unshare", "--mount", "--uts", "sh", "-c", _POD_SHELL, str(hosts)]
            command += [pod.name, *argv]
            with open(pod.log_path, "ab") as log:
                pod.process = subprocess.Popen(
                    command,
                    env={**pod.env, **(env or {})},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    start_new_session=True,
                )
            pod.started = time.monotonic()
            pod.ended = None
        return chosen

    def running(self) -> list[Pod]:
        return [p for p in self.pods if p.process is not None and p.poll() is None]

    def wait(self, timeout_s: float, pods: Sequence[Pod] | None = None) -> dict[int, int]:
        """Exit codes by process id; raise TimeoutError naming the pods still running."""
        pods = [p for p in (pods or self.pods) if p.process is not None]
        deadline = time.monotonic() + timeout_s
        while True:
            codes = {p.process_id: p.poll() for p in pods}
            if all(code is not None for code in codes.values()):
                return {k: v for k, v in codes.items() if v is not None}
            if time.monotonic() > deadline:
                still = [p.name for p in pods if p.poll() is None]
                raise TimeoutError(f"pods still running after {timeout_s:g}s: {still}")
            time.sleep(0.1)

    def wait_for_log(self, pod: Pod, text: str, timeout_s: float) -> None:
        """Block until ``text`` appears in the pod's log (or it exits, or time runs out)."""
        deadline = time.monotonic() + timeout_s
        while text not in pod.log():
            if pod.poll() is not None:
                raise AssertionError(
                    f"{pod.name} exited {pod.poll()} before logging {text!r}:\n{pod.log()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pod.name} did not log {text!r} in {timeout_s:g}s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill every process still running and reap it (fixture teardown)."""
        for pod in self.pods:
            pod.signal(signal.SIGKILL)
        for pod in self.pods:
            if pod.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.process.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()}" for p in self.pods)


@contextlib.contextmanager
def gang(
    all_wirings: Sequence[PodWiring],
    workdir: Path,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Gang]:
    """A gang that is always torn down, whatever the test did."""
    created = Gang.create(all_wirings, workdir, extra_env)
    try:
        yield created
    finally:
        created.stop()
