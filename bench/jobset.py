"""JobSet, built from its Go module at a pinned version and run against the local cluster.

Nothing of JobSet is kept in this repository: the module is fetched by ``go mod download``
(the Go module proxy) into the Go module cache, built with ``go build`` into the shared
binary cache (``~/.cache/tpu-operator/bin/jobset-<version>/``, next to the control-plane
binaries), and its CRD is applied at run time from the module cache's ``config/``.

JobSet normally runs in the cluster behind a Service with webhooks whose certificates it
manages itself. Here the controller runs as a local process (admin kubeconfig) with its
internal certificate management off (its own config option), serving its webhooks on
127.0.0.1 with a certificate made here; the webhook configurations are the upstream ones
(``config/components/webhook``, with the pod webhooks' upstream objectSelector patch),
pointed at that address by ``clientConfig.url``. So JobSet's defaulting, validation and
exclusive-placement pod webhooks all run, as in a real install.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import harness
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from localcluster import Cluster, binaries
from tpu_operator import contract

MODULE = "sigs.k8s.io/jobset"
VERSION = "v0.12.0"
"""Pinned: the newest release the Go module proxy serves (its client-go is v0.36, the
local control plane is Kubernetes v1.36)."""
BINARY = "jobset-controller"
EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
API = "/apis/jobset.x-k8s.io/v1alpha2"


def manifest(
    name: str,
    namespace: str,
    pod: dict[str, Any],
    *,
    hosts: int,
    slices: int,
    exclusive: bool,
) -> dict[str, Any]:
    """The JobSet that runs what the operator runs: ``slices`` replicas of one Indexed Job
    of ``hosts`` pods, each with ``pod``'s spec (the operator's worker 0 pod, without its
    per-pod hostname and subdomain: the Job names its pods). ``exclusive``: each slice gets
    a node pool of its own through JobSet's exclusive placement, as JobSet's TPU users do
    (pods that share a pool are pinned to it by their node selector instead)."""
    spec = {k: v for k, v in pod["spec"].items() if k not in ("hostname", "subdomain")}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if exclusive:
        metadata["annotations"] = {EXCLUSIVE_KEY: contract.NODE_LABEL_NODEPOOL}
    job = {
        "parallelism": hosts,
        "completions": hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": spec},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": 1000},
            "replicatedJobs": [{"name": "slice", "replicas": slices, "template": {"spec": job}}],
        },
    }


class JobSetUnavailable(RuntimeError):
    """JobSet could not be fetched, built or started; the message says why."""


def _go_env() -> dict[str, str]:
    # Same policy as localcluster.binaries: modules from the proxy, no checksum database
    # (not reachable from every build machine); the module's own go.sum pins its deps.
    return {**os.environ, "GOSUMDB": "off", "GOFLAGS": "-mod=mod -buildvcs=false"}


def module_dir() -> Path:
    """The module's source in the Go module cache (downloaded through the proxy if needed)."""
    go = shutil.which("go")
    if go is None:
        raise JobSetUnavailable("the Go toolchain is not on PATH")
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        env=_go_env(),
        cwd=binaries.cache_root(),
        check=False,
    )
    if result.returncode != 0:
        raise JobSetUnavailable(
            f"go mod download {MODULE}@{VERSION}: {result.stdout}{result.stderr}"
        )
    return Path(json.loads(result.stdout)["Dir"])


def ensure_binary() -> Path:
    """The controller binary, built once into the binary cache (a few minutes cold)."""
    target = binaries.cache_root() / "bin" / f"jobset-{VERSION}" / BINARY
    if target.is_file():
        return target
    source = module_dir()
    log_file = binaries.cache_root() / "logs" / f"build-jobset-{VERSION}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with binaries.build_lock():
        if target.is_file():
            return target
        staging = target.with_name(BINARY + ".partial")
        harness.say(f"building JobSet {VERSION} from {source} (log: {log_file})")
        started = time.monotonic()
        command = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging), "."]
        with open(log_file, "w") as out:
            code = subprocess.run(
                command,
                cwd=source,
                env={**_go_env(), "CGO_ENABLED": "0"},
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if code != 0:
            raise JobSetUnavailable(f"go build of JobSet {VERSION} failed; log: {log_file}")
        staging.rename(target)
        harness.say(f"built JobSet in {time.monotonic() - started:.0f} s")
    return target


def _serving_cert(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (tls.crt, tls.key); returns the CA PEM."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jobset-bench-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca.public_bytes(serialization.Encoding.PEM)


def webhook_configurations(source: Path, port: int, ca: bytes) -> list[dict[str, Any]]:
    """The upstream webhook configurations, served at https://127.0.0.1:<port>."""
    import yaml

    documents = list(
        yaml.safe_load_all((source / "config/components/webhook/manifests.yaml").read_text())
    )
    bundle = __import__("base64").b64encode(ca).decode()
    pods_only = {
        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
    }
    for document in documents:
        document["metadata"]["name"] = "jobset-bench-" + document["metadata"]["name"]
        for hook in document["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                hook["objectSelector"] = pods_only  # upstream patches/*-patch.yaml
    return documents


class JobSetController:
    """The JobSet controller manager as a local process, webhooks included."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.binary = ensure_binary()
        self.source = module_dir()
        self.workdir = cluster.directory / "jobset"
        self.log_path = cluster.logs_dir / "jobset.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.health_port = harness.free_port()
        self.webhook_port = harness.free_port()

    def start(self) -> None:
        crd = self.source / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        harness.wait_crd(self.cluster, "jobsets.jobset.x-k8s.io", "jobsets.jobset.x-k8s.io")
        ca = _serving_cert(self.workdir / "certs")
        config = self.workdir / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {
                        "port": self.webhook_port,
                        "host": "127.0.0.1",
                        "certDir": str(self.workdir / "certs"),
                    },
                    "metrics": {"bindAddress": "0"},
                    "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
                }
            )
        )
        self._launch()
        for document in webhook_configurations(self.source, self.webhook_port, ca):
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(document))
        harness.say(f"JobSet {VERSION} controller running (pid {self.process.pid})")

    def _launch(self) -> None:
        config = self.workdir / "config.yaml"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), f"--config={config}", "--zap-devel=false"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
                start_new_session=True,
            )
        self._wait_ready()

    def kill_and_start(self) -> None:
        """SIGKILL the controller and start it again (same configuration and certificate,
        so the webhook configurations still point at it); returns once it is ready."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(15)
        self._launch()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise JobSetUnavailable(f"the JobSet controller exited; log: {self.log_path}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise JobSetUnavailable(f"the JobSet controller was not ready; log: {self.log_path}")

    def stop(self) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            name = f"jobset-bench-{kind.replace('webhookconfiguration', '')}-webhook-configuration"
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def cpu(self) -> float:
        assert self.process is not None
        return harness.cpu_seconds(self.process.pid)
