"""Helpers for the operator's integration tests: the operator process, manifests, waits."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localcluster import Cluster
from localcluster.helm import Helm
from localcluster.pools import cube
from localcluster.testing import wait_until
from tpu_operator import contract, crdgen

JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{{ns}}/{contract.JOB_PLURAL}"
SLICES = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{{ns}}/{contract.SLICE_PLURAL}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@functools.lru_cache(maxsize=8)
def _serves_auth(python: str) -> bool:
    """Whether the operator this interpreter runs checks its scrapers (and so takes
    ``--no-metrics-auth``): a benchmark's A/B may run an earlier commit that does not."""
    found = subprocess.run(
        [python, "-m", "tpu_operator", "run", "--help"], capture_output=True, text=True, check=False
    )
    return "--no-metrics-auth" in found.stdout


class OperatorProcess:
    """``tpu-operator run`` as a real subprocess against the test cluster.

    With ``metrics_token`` its metrics are served as in a cluster, over HTTPS to
    authorized scrapers only, and ``metrics()`` reads them with that token; without
    one the process runs with ``--no-metrics-auth`` (plain HTTP, as for local use)."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        python: str | None = None,
        metrics_token: str | None = None,
    ):
        self.kubeconfig = kubeconfig
        self.metrics_token = metrics_token
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.env = env or {}
        """Extra environment (a benchmark's memory profile: ``PYTHONPATH`` of its hook)."""
        self.python = python or sys.executable
        """The interpreter: the tests' own, or that of a virtualenv the operator is
        installed in as its image installs it (the benchmarks)."""
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            self.python,
            "-m",
            "tpu_operator",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-port={self.metrics_port}",
            f"--health-port={self.health_port}",
            *([] if self.metrics_token or not _serves_auth(self.python) else ["--no-metrics-auth"]),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        log.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        log.close()
        wait_until(
            self._healthy,
            timeout=60,
            message=f"the operator to answer /healthz (log: {self.log_path})",
        )

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(
                f"the operator exited with {self.process.returncode}; log:\n{self.tail()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", self.health_port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no clean-up, no final writes, as when a node dies under it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the process neither renews nor acts, as when its node is cut off."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: the partition heals."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def health(self) -> dict[str, Any]:
        """The /healthz answer: kopf's probes (work queue depths, leadership)."""
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.health_port}/healthz", timeout=5
        ) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def metrics_url(self) -> str:
        scheme = "https" if self.metrics_token else "http"
        return f"{scheme}://127.0.0.1:{self.metrics_port}/metrics"

    def metrics(self, token: str | None = None) -> str:
        """The metrics text, read with ``token`` (default: the process's scraper token)."""
        return read_metrics(self.metrics_url, token or self.metrics_token)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def read_metrics(url: str, token: str | None) -> str:
    """GET a metrics endpoint, with a bearer token when given; the operator's certificate
    is self-signed, so it is not verified. HTTP errors raise ``urllib.error.HTTPError``."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        return response.read().decode()


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CLUSTER_KINDS = ("ClusterRole", "ClusterRoleBinding")


class ChartIdentity:
    """The operator's identity exactly as the chart makes it.

    The chart is rendered with helm (``values`` over its defaults, for release
    ``release`` in ``namespace``); its ServiceAccount and every Role, ClusterRole and
    binding are applied as rendered, and ``kubeconfig`` authenticates as that
    ServiceAccount with a token from the TokenRequest API, as a pod's would. An operator
    run with it may do what the chart grants and nothing else: a verb the chart lacks
    makes the test that needs it fail. The chart's user-facing aggregated roles are left
    out (they grant users, not the operator, and would widen every namespace's ``edit``).

    ``scraper_token`` belongs to a ServiceAccount the chart binds to its metrics reader
    role (``metrics.auth.readers``): what a Prometheus would present.
    Release names must differ between identities alive at once (their ClusterRoles are
    named after the release); ``delete`` removes the cluster-wide objects.
    """

    def __init__(
        self,
        cluster: Cluster,
        directory: Path,
        *,
        release: str,
        namespace: str,
        values: dict[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.release = release
        self.namespace = namespace
        self.scraper = f"{release}-scraper"
        self.kubeconfig = directory / f"{release}.kubeconfig"
        reader = {"namespace": namespace, "name": self.scraper}
        self.values = {
            **(values or {}),
            "rbac": {"create": True, "aggregateToDefaultRoles": False},
            "metrics": {"auth": {"enabled": True, "readers": [reader]}},
        }
        documents = Helm(cluster.kubeconfig).template(
            self.values, release=release, namespace=namespace
        )
        self.objects = [d for d in documents if d["kind"] in RBAC_KINDS]
        accounts = [d for d in self.objects if d["kind"] == "ServiceAccount"]
        assert len(accounts) == 1, [a["metadata"]["name"] for a in accounts]
        self.service_account = accounts[0]["metadata"]["name"]
        self.scraper_token = ""
        self._made_namespace = False

    def create(self) -> ChartIdentity:
        api = self.cluster.api()
        status, _ = api.request("GET", f"/api/v1/namespaces/{self.namespace}")
        if status == 404:
            api.call("POST", "/api/v1/namespaces", {"metadata": {"name": self.namespace}})
            self._made_namespace = True
        scraper = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": self.scraper, "namespace": self.namespace},
        }
        stream = "\n---\n".join(json.dumps(d) for d in [*self.objects, scraper])
        self.cluster.kubectl("apply", "-f", "-", input=stream)
        self.cluster.service_account_kubeconfig(
            self.namespace, self.service_account, self.kubeconfig
        )
        self.scraper_token = self.cluster.service_account_token(self.namespace, self.scraper)
        return self

    def operator(self, log_path: Path, extra_args: list[str] | None = None) -> OperatorProcess:
        """An operator process that acts as this identity (metrics behind authorization,
        read with the scraper's token)."""
        return OperatorProcess(
            self.kubeconfig, log_path, extra_args, metrics_token=self.scraper_token
        )

    def delete(self) -> None:
        for d in self.objects:
            if d["kind"] in CLUSTER_KINDS:
                self.cluster.kubectl(
                    "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"
                )
        if self._made_namespace:
            self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false")


def worker_template(command: str, grace: int = 2, **container: Any) -> dict[str, Any]:
    """A pod template whose worker runs ``command`` with sh."""
    return {
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "worker",
                    "image": "unused.local/worker",
                    "command": ["sh", "-c", command],
                    **container,
                }
            ],
        }
    }


def job_manifest(name: str, namespace: str, shape: dict[str, Any], command: str, **spec: Any):
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"slice": shape, "template": worker_template(command), **spec},
    }


class Api:
    """Thin helpers over the cluster's admin JSON client for TPUJobs, slices and pods."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.raw = cluster.api()

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.raw.get(f"{JOBS.format(ns=namespace)}/{name}")

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return self.job(namespace, name).get("status") or {}

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.raw.call(
            "PATCH",
            f"{JOBS.format(ns=namespace)}/{name}",
            patch,
            content_type="application/merge-patch+json",
        )

    def slices(self, namespace: str) -> list[dict[str, Any]]:
        return self.raw.get(SLICES.format(ns=namespace))["items"]

    def patch_slice(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.raw.call(
            "PATCH",
            f"{SLICES.format(ns=namespace)}/{name}",
            patch,
            content_type="application/merge-patch+json",
        )

    def pods(self, namespace: str, selector: str = contract.LABEL_SLICE_NAME) -> list[dict]:
        return self.raw.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")[
            "items"
        ]

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items = self.raw.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]

    def wait_events(
        self, namespace: str, name: str, *reasons: str, timeout: float = 30
    ) -> list[str]:
        """Wait until events with all ``reasons`` exist for ``name``; the operator posts
        events in the background after the status write they belong to."""
        wanted = set(reasons)

        def seen() -> list[str] | None:
            found = [e["reason"] for e in self.events(namespace, name)]
            return found if wanted <= set(found) else None

        return wait_until(
            seen,
            timeout=timeout,
            message=lambda: (
                f"events {sorted(wanted)} for {name}; seen "
                f"{sorted({e['reason'] for e in self.events(namespace, name)})}"
            ),
        )

    def wait_phase(
        self, namespace: str, name: str, phases: str | tuple[str, ...], timeout: float = 90
    ) -> dict[str, Any]:
        wanted = (phases,) if isinstance(phases, str) else phases

        def reached() -> dict[str, Any] | None:
            status = self.status(namespace, name)
            return status if status.get("phase") in wanted else None

        def describe() -> str:
            status = self.status(namespace, name)
            return (
                f"TPUJob {namespace}/{name} to be {' or '.join(wanted)}; it is "
                f"{status.get('phase')}: {status.get('message')}"
            )

        return wait_until(reached, timeout=timeout, message=describe)


class PodAttemptRecorder:
    """Watches a namespace's worker pods and records which attempts were alive at once."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.overlaps: list[tuple[float, dict[str, str]]] = []
        self.attempts_seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodAttemptRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = {}
            for pod in self.api.pods(self.namespace):
                labels = pod["metadata"]["labels"]
                alive[pod["metadata"]["name"]] = labels[contract.LABEL_RESTART_ATTEMPT]
            self.attempts_seen.update(alive.values())
            if len(set(alive.values())) > 1:
                self.overlaps.append((time.monotonic(), alive))
            time.sleep(0.05)


def scratch_namespace(api: Api, name: str) -> Iterator[str]:
    """A namespace of its own for one test (as a fixture body): created, its default
    ServiceAccount waited for (pods need it), deleted afterwards."""
    api.raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait_until(
        lambda: (
            api.raw.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200
        ),
        timeout=30,
        message=f"the default ServiceAccount of {name}",
    )
    yield name
    api.raw.request("DELETE", f"/api/v1/namespaces/{name}")


def install_crds(cluster: Cluster) -> None:
    """Apply the generated CRDs; return once every one of them is established and served."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crdgen.OUTPUT_DIRS[0]))
    for crd in crdgen.crds().values():
        wait_crd(cluster, crd["metadata"]["name"], crd["spec"]["names"]["plural"])


def wait_crd(cluster: Cluster, name: str, plural: str, timeout: float = 60) -> None:
    """Wait until CRD ``name`` is established and its resource can be listed (``kubectl
    wait`` fails while the CRD has no conditions yet, and the apiserver answers 429
    "storage is (re)initializing" for a moment after it is established)."""

    def succeeds(*args: str) -> bool:
        return cluster.kubectl(*args, check=False).returncode == 0

    established = ("wait", "--for=condition=Established", f"crd/{name}", "--timeout=10s")
    wait_until(lambda: succeeds(*established), timeout=timeout, message=f"CRD {name} established")
    listing = ("get", plural, "--all-namespaces")
    wait_until(lambda: succeeds(*listing), timeout=timeout, message=f"{plural} to be served")


GKE_SLICES = f"/apis/{contract.SLICE_API_VERSION}/{contract.SLICE_CRD_PLURAL}"


@contextlib.contextmanager
def simulated_cubes(cluster: Any, prefix: str, count: int = 3) -> Iterator[list[str]]:
    """``count`` simulated Ironwood cubes (``localcluster.pools.cube``), named
    ``<prefix><tag>-a``, ``-b``, ...; waits until the slice controller stand-in serves the
    Slice CRD, and removes them afterwards."""
    tag = uuid.uuid4().hex[:4]
    names = [f"{prefix}{tag}-{chr(ord('a') + i)}" for i in range(count)]
    for name in names:
        cluster.agent.add_pool(cube(name))
    api = cluster.api()
    wait_until(
        lambda: api.request("GET", GKE_SLICES)[0] == 200,
        timeout=60,
        message="the slice controller stand-in to serve the Slice CRD",
    )
    try:
        yield names
    finally:
        for name in names:
            cluster.agent.remove_pool(name)
