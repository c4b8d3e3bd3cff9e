"""A real Prometheus server for the local cluster, configured from the rendered chart.

Used by the end-to-end tests and the local demo.

The chart's PodMonitor (workers) and ServiceMonitor (operator) are translated into the
scrape configs prometheus-operator would generate for them: pod discovery, the same
selection (label presence, port name) and the same relabelling to namespace, pod, node,
tpujob, slice, worker and attempt labels. The operator's Service has no endpoints on the
local cluster (its pod IPs are loopback addresses, which EndpointSlices reject), so the
ServiceMonitor's target is discovered through the pod behind the Service instead, with
the Service's selector. The PrometheusRule's groups become the rule file.

The operator's metrics are HTTPS for authorized scrapers only: the ServiceMonitor's
``scheme``, ``tlsConfig`` and ``bearerTokenFile`` become the job's scheme, TLS settings and
credentials. ``bearerTokenFile`` names a file in Prometheus's pod (its ServiceAccount's
token); here it is ``token_file``, a token of the ServiceAccount this Prometheus stands
for (``Cluster.service_account_token``), which the chart binds to its metrics reader role.

Debian's Prometheus is built without Kubernetes service discovery, so ``PodDiscovery``
stands in for it: it lists the pods from the real apiserver every second and writes them
as file-based targets carrying exactly the ``__meta_kubernetes_pod_*`` labels Kubernetes
discovery would attach (one target per container port), so the relabelling runs
unchanged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from localcluster.testing import wait_until

PROMETHEUS_OPERATOR_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
"""What ``helm template`` must be told the cluster serves for the chart to render its
monitors and rules (``Helm.template(api_versions=...)``), as ``helm install`` sees on a
cluster with prometheus-operator."""
POD_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
"""Where a pod finds its ServiceAccount's token (a ServiceMonitor's ``bearerTokenFile``)."""


def _label_meta(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def pod_monitor_job(monitor: dict[str, Any], targets: Path) -> dict[str, Any]:
    spec = monitor["spec"]
    endpoint = spec["podMetricsEndpoints"][0]
    relabel: list[dict[str, Any]] = []
    for expression in spec["selector"].get("matchExpressions", []):
        assert expression["operator"] == "Exists", expression
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_pod_labelpresent_{_label_meta(expression['key'])}"
                ],
                "regex": "true",
            }
        )
    for key, value in spec["selector"].get("matchLabels", {}).items():
        relabel.append(
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_label_{_label_meta(key)}"],
                "regex": value,
            }
        )
    relabel.append(
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
        }
    )
    relabel.append(
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
        }
    )
    for rule in endpoint.get("relabelings", []):
        relabel.append(
            {
                "action": rule.get("action", "replace").lower(),
                "source_labels": rule["sourceLabels"],
                "target_label": rule["targetLabel"],
            }
        )
    return {
        "job_name": (
            f"podMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0"
        ),
        "scrape_interval": "2s",
        "honor_labels": endpoint.get("honorLabels", False),
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        "relabel_configs": relabel,
    }


def endpoint_client(endpoint: dict[str, Any], token_file: Path | None) -> dict[str, Any]:
    """A ServiceMonitor endpoint's scheme, TLS settings and bearer token as scrape-config
    fields; ``token_file`` stands for the pod's ServiceAccount token."""
    client: dict[str, Any] = {}
    if endpoint.get("scheme"):
        client["scheme"] = endpoint["scheme"]
    tls = endpoint.get("tlsConfig")
    if tls:
        unsupported = set(tls) - {"insecureSkipVerify", "serverName"}
        assert not unsupported, f"tlsConfig fields not translated here: {unsupported}"
        client["tls_config"] = {"insecure_skip_verify": bool(tls.get("insecureSkipVerify"))}
        if tls.get("serverName"):
            client["tls_config"]["server_name"] = tls["serverName"]
    if endpoint.get("bearerTokenFile"):
        assert endpoint["bearerTokenFile"] == POD_TOKEN, endpoint["bearerTokenFile"]
        assert token_file is not None, "the ServiceMonitor needs a ServiceAccount token"
        client["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    return client


def service_monitor_job(
    monitor: dict[str, Any],
    service: dict[str, Any],
    targets: Path,
    token_file: Path | None = None,
) -> dict[str, Any]:
    endpoint = monitor["spec"]["endpoints"][0]
    relabel = [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_pod_label_{_label_meta(key)}"],
            "regex": value,
        }
        for key, value in service["spec"]["selector"].items()
    ]
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    return {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/"
        f"{monitor['metadata']['name']}/0",
        "scrape_interval": "2s",
        "honor_labels": endpoint.get("honorLabels", False),
        **endpoint_client(endpoint, token_file),
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        "relabel_configs": relabel,
    }


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kubernetes pod discovery's targets: one per container port, with its meta labels."""
    targets = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        if not status.get("podIP"):
            continue
        common = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": status["podIP"],
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_uid": meta["uid"],
        }
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{_label_meta(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{_label_meta(key)}"] = "true"
        for container in spec.get("containers", []):
            for port in container.get("ports") or []:
                targets.append(
                    {
                        "targets": [f"{status['podIP']}:{port['containerPort']}"],
                        "labels": {
                            **common,
                            "__meta_kubernetes_pod_container_name": container["name"],
                            "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                            "__meta_kubernetes_pod_container_port_number": str(
                                port["containerPort"]
                            ),
                        },
                    }
                )
    return targets


class PodDiscovery:
    """Keeps a file_sd targets file in step with the cluster's pods (see module doc).

    Runs as a thread (tests) or as its own process (``python -m localcluster.prometheus
    discover``) for a Prometheus that outlives the command that started it (the demo).
    """

    def __init__(self, api: Any, path: Path) -> None:
        self.api = api
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        self.refresh()

    def refresh(self) -> None:
        pods = self.api.get("/api/v1/pods")["items"]
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps(pod_targets(pods)))
        staging.replace(self.path)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.refresh()
            except Exception as error:  # the apiserver may be restarting: try again
                print(f"pod discovery: {error}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """``prometheus`` from Debian's package on 127.0.0.1 (scripts/ensure-prometheus.sh)."""

    def __init__(
        self,
        directory: Path,
        rendered: list[dict[str, Any]],
        api: Any,
        port: int | None = None,
        token: str | None = None,
    ):
        """``token``: the ServiceAccount token this Prometheus scrapes with where a
        ServiceMonitor asks for its pod's token."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        targets = directory / "pods.json"
        self.discovery = PodDiscovery(api, targets)
        token_file = None
        if token is not None:
            token_file = directory / "token"
            token_file.write_text(token)
            token_file.chmod(0o600)
        by_kind = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
        monitors = [d for d in rendered if d["kind"] == "PodMonitor"]
        service_monitors = [d for d in rendered if d["kind"] == "ServiceMonitor"]
        jobs = [pod_monitor_job(m, targets) for m in monitors]
        for monitor in service_monitors:
            service = next(
                d
                for (kind, _), d in by_kind.items()
                if kind == "Service"
                and d["metadata"]["labels"].get("app.kubernetes.io/name") == "tpu-operator"
            )
            jobs.append(service_monitor_job(monitor, service, targets, token_file))
        rules = [d for d in rendered if d["kind"] == "PrometheusRule"]
        self.rules_file = directory / "rules.yaml"
        self.rules_file.write_text(
            yaml.safe_dump({"groups": [g for r in rules for g in r["spec"]["groups"]]})
        )
        self.config_file = directory / "prometheus.yml"
        self.config_file.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "2s", "evaluation_interval": "1s"},
                    "rule_files": [str(self.rules_file)],
                    "scrape_configs": jobs,
                }
            )
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check_config(self) -> str:
        promtool = shutil.which("promtool")
        assert promtool, "promtool is missing (Debian package prometheus)"
        result = subprocess.run(
            [promtool, "check", "config", str(self.config_file)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def start(self, *, discovery_thread: bool = True) -> None:
        """Start the server; pod discovery in a thread of this process unless told not to
        (then run ``python -m localcluster.prometheus discover``)."""
        if discovery_thread:
            self.discovery.start()
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: scripts/ensure-prometheus.sh installs it"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config_file}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=1d",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._ready, timeout=60, message=f"Prometheus to be ready (log {self.log})")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.discovery.stop()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; a query Prometheus rejects raises with its error."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = json.loads(error.read() or b"{}").get("error", error.reason)
            raise AssertionError(f"Prometheus rejected {expr!r}: {detail}") from None
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            return json.loads(response.read())["data"]["activeTargets"]

    def wait_for(self, expr: str, timeout: float, what: str) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something."""
        return wait_until(lambda: self.query(expr), timeout=timeout, message=f"{what} ({expr})")


def main(argv: list[str] | None = None) -> int:
    """``python -m localcluster.prometheus discover --cluster DIR --targets FILE``."""
    import argparse

    from localcluster.cluster import Cluster

    parser = argparse.ArgumentParser(prog="python -m localcluster.prometheus")
    sub = parser.add_subparsers(dest="command", required=True)
    discover = sub.add_parser("discover", help="keep a file_sd targets file in step with pods")
    discover.add_argument("--cluster", required=True, type=Path)
    discover.add_argument("--targets", required=True, type=Path)
    args = parser.parse_args(argv)
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    discovery = PodDiscovery(Cluster.attach(args.cluster).api(), args.targets)
    discovery.start()
    signal.sigwait(signals)
    discovery.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
