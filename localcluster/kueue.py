"""Kueue on the local control plane, on demand: built from its Go module, run as a process.

::

    kueue = Kueue.start(cluster)            # CRDs, webhooks, then the manager process
    kueue.apply(tpu_queues(cluster))        # ResourceFlavors, ClusterQueue, LocalQueue ...
    kueue.stop()

The version is pinned once, in ``gobuild/kueue/go.mod`` (``sigs.k8s.io/kueue``); the
manager (``sigs.k8s.io/kueue/cmd/kueue``) is built and cached like the control plane
(``binaries.KUEUE``). The manifests come from the same module: ``config/default``
rendered with ``kubectl kustomize`` (CRDs with their conversion webhooks, webhook
configurations, namespace, the webhook Secret), cached next to the binary. Of them the
launcher applies the CRDs, the ``kueue-system`` namespace and Secret, and only the
webhooks for Kueue's own kinds (Workloads, ClusterQueues, ResourceFlavors, Cohorts): the
ones for pods, Jobs, Deployments ... would make every pod of the test session depend on
this Kueue process being up.

Kueue runs as a local process with the admin kubeconfig (like the controller-manager).
Its internal certificate management creates the serving certificate for
``kueue-webhook-service.kueue-system.svc`` in the Secret and injects the CA into the
webhook configurations and CRDs; the launcher plays the kubelet's Secret volume (a thread
copies the Secret into the manager's certificate directory, which Kueue waits for); the
apiserver reaches the webhook through that Service,
which has no selector and one EndpointSlice pointing at this machine
(``--enable-aggregator-routing``, ``controlplane.apiserver``). The configuration
registers TPUJob as an external framework (``integrations.externalFrameworks``).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster import binaries
from localcluster.procs import reap, spawn

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
VISIBILITY_SERVICE = "kueue-visibility-server"
VISIBILITY_APISERVICES = (
    "v1beta1.visibility.kueue.x-k8s.io",
    "v1beta2.visibility.kueue.x-k8s.io",
)
EXTERNAL_FRAMEWORKS = ("TPUJob.v1alpha1.tpu-operator.dev",)
KUEUE_KINDS = frozenset({"workloads", "clusterqueues", "resourceflavors", "cohorts"})
"""Kueue webhooks that are kept: those of Kueue's own kinds."""
TPU_RESOURCE = "google.com/tpu"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"


def log(message: str) -> None:
    binaries.log(f"kueue: {message}")


def module_dir(version: str) -> Path:
    """The Kueue module's source in the Go module cache (downloaded if missing)."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOSUMDB": "off"}
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{version}"],
        cwd=binaries.KUEUE.module_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(out)["Dir"])


AUTOSCALER_APIS = "k8s.io/autoscaler/cluster-autoscaler/apis"
"""The Go module of the ProvisioningRequest API (``autoscaling.x-k8s.io``), at the version
Kueue's module requires (``gobuild/kueue/go.mod``): its ``config/crd`` holds the CRD."""


def provisioning_request_crd() -> dict[str, Any]:
    """The ProvisioningRequest CRD from the cluster autoscaler's API module (downloaded
    through the Go module proxy into the module cache, outside the repository)."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOSUMDB": "off"}
    out = subprocess.run(
        ["go", "mod", "download", "-json", AUTOSCALER_APIS],
        cwd=binaries.KUEUE.module_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(json.loads(out)["Dir"]) / "config" / "crd"
    (crd,) = (
        doc
        for file in sorted(path.glob("*provisioningrequests*.yaml"))
        for doc in yaml.safe_load_all(file.read_text())
        if doc
    )
    return dict(crd)


def install_provisioning_requests(cluster: Any) -> None:
    """Install the ProvisioningRequest CRD (before Kueue starts, whose ProvisioningRequest
    admission check controller runs only when the API is served)."""
    crd = provisioning_request_crd()
    _apply(cluster, [crd])
    cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s"
    )


def provisioning_check(
    name: str = "dws-prov", max_run_duration_seconds: int | None = None
) -> list[dict[str, Any]]:
    """An AdmissionCheck of Kueue's ProvisioningRequest controller and its
    ProvisioningRequestConfig, as GKE documents them for queued provisioning of TPUs."""
    config: dict[str, Any] = {
        "provisioningClassName": "queued-provisioning.gke.io",
        "managedResources": [TPU_RESOURCE],
        # Kueue's default backoff starts at 60 s: a test sees a retry sooner.
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5, "backoffMaxSeconds": 30},
    }
    if max_run_duration_seconds:
        config["parameters"] = {"maxRunDurationSeconds": str(max_run_duration_seconds)}
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ProvisioningRequestConfig",
            "metadata": {"name": f"{name}-config"},
            "spec": config,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {
                "controllerName": "kueue.x-k8s.io/provisioning-request",
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "ProvisioningRequestConfig",
                    "name": f"{name}-config",
                },
            },
        },
    ]


IRONWOOD_LEVELS = (
    "cloud.google.com/gce-topology-block",
    *(
        f"cloud.google.com/gke-tpu-partition-{shape}-id"
        for shape in ("4x4x4", "2x4x4", "2x2x4", "2x2x2", "2x2x1")
    ),
    "kubernetes.io/hostname",
)
"""The levels of an Ironwood Topology for super-slices and sub-slices: reservation block,
cube, each sub-slice partition, VM (xpk's super-slicing Topology has the block, cube and
hostname levels; GKE's dynamic-slicing guide lists the sub-slice levels between)."""


def ironwood_queues(
    *,
    cluster_queue: str,
    namespaces: Iterable[str],
    chips: int,
    check: str = "ss-kueue-operator",
    flavor: str = "tpu7x-dynamic",
) -> list[dict[str, Any]]:
    """Kueue's objects for Ironwood dynamic slicing, as xpk creates them: a Topology over
    the cubes' partitions (``IRONWOOD_LEVELS``), a ResourceFlavor of the accelerator alone
    using it, an AdmissionCheck of GKE's slice controller (``accelerator.gke.io/slice``), a
    ClusterQueue with ``chips`` of ``google.com/tpu`` and that check, and a LocalQueue
    ``tpu`` in each namespace."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": "ironwood"},
            "spec": {"levels": [{"nodeLabel": label} for label in IRONWOOD_LEVELS]},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {
                "nodeLabels": {"cloud.google.com/gke-tpu-accelerator": "tpu7x"},
                "topologyName": "ironwood",
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {"controllerName": "accelerator.gke.io/slice"},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [TPU_RESOURCE],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [{"name": TPU_RESOURCE, "nominalQuota": chips}],
                            }
                        ],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
            },
        },
    ]
    for namespace in namespaces:
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "tpu", "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            }
        )
    return docs


def manifests(kubectl: Path) -> list[dict[str, Any]]:
    """Kueue's ``config/default``, rendered once per pinned version and cached."""
    target = binaries.component_dir(binaries.KUEUE) / "manifests.yaml"
    if not target.is_file():
        source = module_dir(binaries.KUEUE.version) / "config" / "default"
        log(f"rendering {source} (kubectl kustomize)")
        rendered = subprocess.run(
            [str(kubectl), "kustomize", str(source)], check=True, capture_output=True, text=True
        ).stdout
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered)
    return [doc for doc in yaml.safe_load_all(target.read_text()) if doc]


def select(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the launcher applies of Kueue's manifests (see the module docstring)."""
    keep: list[dict[str, Any]] = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("CustomResourceDefinition", "Namespace") or (
            kind == "Secret" and name == WEBHOOK_SECRET
        ):
            keep.append(doc)
        elif kind == "APIService":
            keep.append(doc)  # the visibility API (insecureSkipTLSVerify in Kueue's own)
        elif kind == "Service" and name in (WEBHOOK_SERVICE, VISIBILITY_SERVICE):
            doc = json.loads(json.dumps(doc))
            doc["spec"].pop("selector", None)
            keep.append(doc)
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            doc = json.loads(json.dumps(doc))
            doc["webhooks"] = [
                hook
                for hook in doc["webhooks"]
                if all(
                    resource.split("/")[0] in KUEUE_KINDS
                    for rule in hook.get("rules") or []
                    for resource in rule.get("resources") or []
                )
            ]
            keep.append(doc)
    return keep


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_address() -> str:
    """An address of this machine the apiserver can dial and an EndpointSlice may hold
    (not loopback): the one the default route leaves from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.254", 9))  # no packet is sent (UDP connect)
            address = str(sock.getsockname()[0])
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        address = socket.gethostbyname(socket.gethostname())
    return address


def configuration(
    webhook_port: int, health_port: int, cert_dir: Path, visibility_port: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "integrations": {
            "frameworks": ["batch/job"],
            "externalFrameworks": list(EXTERNAL_FRAMEWORKS),
        },
        "featureGates": {"VisibilityOnDemand": bool(visibility_port)},
        **({"visibilityServer": {"bindPort": visibility_port}} if visibility_port else {}),
        "clientConnection": {"qps": 100, "burst": 200},
    }


@dataclass
class Kueue:
    """A running Kueue manager for one local cluster."""

    cluster: Any
    process: subprocess.Popen[bytes]
    log_path: Path
    health_port: int
    started_seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, cluster: Any, timeout: float = 180.0) -> Kueue:
        """Build (cached), install and start Kueue; return once its webhooks answer."""
        timings: dict[str, float] = {}
        begin = time.monotonic()
        binary = binaries.ensure(binaries.KUEUE)["kueue"]
        kubectl = binaries.ensure(binaries.KUBERNETES)["kubectl"]
        timings["build"] = time.monotonic() - begin
        mark = time.monotonic()
        docs = select(manifests(kubectl))
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
        _apply(cluster, crds)
        for crd in crds:
            cluster.kubectl(
                "wait",
                "--for=condition=Established",
                f"crd/{crd['metadata']['name']}",
                "--timeout=60s",
            )
        _apply(cluster, rest)
        webhook_port = _free_port()
        visibility_port = _free_port()
        _endpoints(cluster, host_address(), webhook_port)
        _endpoints(cluster, host_address(), visibility_port, VISIBILITY_SERVICE, "https")
        timings["install"] = time.monotonic() - mark
        mark = time.monotonic()
        work = Path(cluster.layout.root) / "kueue"
        cert_dir = work / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        health_port = _free_port()
        config_path = work / "config.yaml"
        config_path.write_text(
            yaml.safe_dump(configuration(webhook_port, health_port, cert_dir, visibility_port))
        )
        log_path = Path(cluster.logs_dir) / "kueue.log"
        process = spawn(
            # --kubeconfig: the visibility server's delegated authentication and
            # authorization ask the apiserver through it (it is not in a pod).
            [
                str(binary),
                f"--config={config_path}",
                f"--kubeconfig={cluster.kubeconfig}",
                "--zap-log-level=2",
            ],
            log_file=log_path,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        )
        kueue = cls(cluster, process, log_path, health_port, 0.0, timings)
        threading.Thread(
            target=kueue._mount_secret, args=(cert_dir,), name="kueue-certs", daemon=True
        ).start()
        kueue._wait_ready(timeout)
        timings["start"] = time.monotonic() - mark
        kueue.started_seconds = time.monotonic() - begin
        log(
            "ready in {:.1f} s (build/cache {build:.1f} s, install {install:.1f} s, "
            "start {start:.1f} s); log: {log}".format(
                kueue.started_seconds, log=log_path, **timings
            )
        )
        return kueue

    def _mount_secret(self, cert_dir: Path) -> None:
        """Keep ``cert_dir`` equal to the webhook Secret, as a Secret volume would."""
        api = self.cluster.api()
        path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}"
        while not self.stopping.wait(0.5):
            try:
                status, body = api.request("GET", path)
            except OSError:
                continue
            if status != 200:
                continue
            for key, value in ((body or {}).get("data") or {}).items():
                target = cert_dir / key
                content = base64.b64decode(value)
                if not target.is_file() or target.read_bytes() != content:
                    staging = target.with_name(f".{key}.tmp")
                    staging.write_bytes(content)
                    staging.replace(target)

    def _wait_ready(self, timeout: float) -> None:
        """Ready when the apiserver accepts a ResourceFlavor through Kueue's webhooks
        (certificates made, CA injected, webhook server serving)."""
        deadline = time.monotonic() + timeout
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "localcluster-probe"},
        }
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"kueue exited with {self.process.returncode}; log: {self.log_path}\n"
                    + _tail(self.log_path)
                )
            done = self.cluster.kubectl(
                "apply", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
            )
            if done.returncode == 0:
                return
            last = done.stderr.strip()
            time.sleep(1.0)
        raise RuntimeError(f"kueue not ready in {timeout:.0f} s ({last}); log: {self.log_path}")

    def apply(self, docs: Iterable[dict[str, Any]]) -> None:
        _apply(self.cluster, list(docs))

    def kill(self) -> None:
        """SIGKILL the manager (fault tests); ``restart`` brings it back."""
        self.process.kill()
        reap(self.process)

    def restart(self, timeout: float = 120.0) -> None:
        argv = self.process.args
        self.kill()
        self.process = spawn(
            list(argv),  # type: ignore[arg-type]
            log_file=self.log_path,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
        )
        self._wait_ready(timeout)

    def stop(self) -> None:
        """Stop the manager and remove its webhook configurations and visibility
        APIServices (so nothing in the cluster waits for a webhook or an API that is gone:
        an unavailable aggregated API stalls namespace deletion); CRDs and objects stay."""
        self.stopping.set()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        reap(self.process)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.cluster.kubectl(
                "delete",
                kind,
                f"kueue-{kind[: -len('webhookconfiguration')]}-webhook-configuration",
                "--ignore-not-found",
                check=False,
            )
        self.cluster.kubectl(
            "delete",
            "apiservice",
            *VISIBILITY_APISERVICES,
            "--ignore-not-found",
            check=False,
        )


def _apply(cluster: Any, docs: list[dict[str, Any]]) -> None:
    if not docs:
        return
    body = {"apiVersion": "v1", "kind": "List", "items": docs}
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=localcluster",
        "-f",
        "-",
        input=json.dumps(body),
    )


def _endpoints(
    cluster: Any,
    address: str,
    port: int,
    service: str = WEBHOOK_SERVICE,
    port_name: str = "",
) -> None:
    """A Kueue Service's one endpoint: this machine, the manager's port (its webhook, or
    its visibility server's)."""
    family = "IPv6" if ":" in address else "IPv4"
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": service,
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "localcluster",
            },
        },
        "addressType": family,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }
    _apply(cluster, [slice_])


def tpu_queues(
    pools: Iterable[Any],
    *,
    cluster_queue: str = "tpu",
    namespaces: Iterable[str] = (),
    local_queue: str = "tpu",
    chips: int | None = None,
    topology: bool = False,
    preemption: bool = True,
    admission_checks: Iterable[str] = (),
    queueing_strategy: str | None = None,
) -> list[dict[str, Any]]:
    """ResourceFlavors for the simulated TPU pools (one per accelerator and topology,
    selecting its nodes by label), a ClusterQueue over them with ``chips`` of
    ``google.com/tpu`` each (default: all chips of the pools of that flavor) and a
    LocalQueue in each namespace. ``topology``: a Topology on the node-pool level and
    flavors that use it (topology-aware scheduling). ``queueing_strategy``: the
    ClusterQueue's (StrictFIFO or BestEffortFIFO; unset: Kueue's default, BestEffortFIFO)."""
    flavors: dict[str, dict[str, Any]] = {}
    capacity: dict[str, int] = {}
    for pool in pools:
        if not pool.accelerator:
            continue
        name = f"{pool.accelerator.removeprefix('tpu-')}-{pool.topology}".replace("x", "-")
        flavors[name] = {
            "cloud.google.com/gke-tpu-accelerator": pool.accelerator,
            "cloud.google.com/gke-tpu-topology": pool.topology,
        }
        capacity[name] = capacity.get(name, 0) + pool.vms * pool.chips_per_vm
    docs: list[dict[str, Any]] = []
    if topology:
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Topology",
                "metadata": {"name": "gke-nodepool"},
                "spec": {
                    "levels": [
                        {"nodeLabel": NODEPOOL_LABEL},
                        {"nodeLabel": "kubernetes.io/hostname"},
                    ]
                },
            }
        )
    for name, labels in flavors.items():
        spec: dict[str, Any] = {"nodeLabels": labels}
        if topology:
            spec["topologyName"] = "gke-nodepool"
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": [TPU_RESOURCE],
                "flavors": [
                    {
                        "name": name,
                        "resources": [
                            {"name": TPU_RESOURCE, "nominalQuota": chips or capacity[name]}
                        ],
                    }
                    for name in flavors
                ],
            }
        ],
    }
    if preemption:
        cq_spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    if queueing_strategy:
        cq_spec["queueingStrategy"] = queueing_strategy
    if checks := list(admission_checks):
        cq_spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    docs.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": cq_spec,
        }
    )
    for namespace in namespaces:
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": local_queue, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            }
        )
    return docs


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
