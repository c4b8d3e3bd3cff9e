"""The end-to-end tier: the chart installed with helm, the operator running in the
cluster as the chart's ServiceAccount, workers training, a real Prometheus scraping.

Session order matters: the e2e tests share one release and one Prometheus (module
fixtures in test_product.py); the integration tests' own operator process is stopped
before this package starts (it is package-scoped there).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import binaries
from tests.e2e.prometheus import Prometheus, free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tpu-operator"
RELEASE = "tpu-operator"
RELEASE_NAMESPACE = "tpu-system"

# Stand-ins for prometheus-operator's CRDs, with open schemas: they let the apiserver
# accept (and dry-run) the chart's ServiceMonitor, PodMonitor and PrometheusRule. Their
# content is checked by promtool and by the Prometheus configured from them.
MONITORING_KINDS = {
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}


class Helm:
    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def template(self, values: dict[str, Any], release: str = RELEASE) -> list[dict[str, Any]]:
        out = self(
            "template",
            release,
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--values",
            values_file(values),
        ).stdout
        return [d for d in yaml.safe_load_all(out) if d]


def values_file(values: dict[str, Any]) -> str:
    """A values file for helm (JSON is YAML), removed at exit."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
    with handle:
        json.dump(values, handle)
    atexit.register(Path(handle.name).unlink, missing_ok=True)
    return handle.name


@pytest.fixture(scope="session")
def helm(cluster) -> Helm:
    return Helm(binaries.ensure(binaries.HELM)["helm"], cluster.kubeconfig)


@pytest.fixture(scope="session")
def monitoring_crds(cluster) -> None:
    for kind, plural in MONITORING_KINDS.items():
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {
                "group": "monitoring.coreos.com",
                "names": {
                    "kind": kind,
                    "plural": plural,
                    "listKind": f"{kind}List",
                    "singular": kind.lower(),
                },
                "scope": "Namespaced",
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(crd))
    for plural in MONITORING_KINDS.values():
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", timeout=60
        )


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for root in ("pyproject.toml", "README.md", "operator", "worker-image"):
        top = REPO / root
        for path in sorted(top.rglob("*") if top.is_dir() else [top]):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def operator_venv() -> Path:
    """The operator installed exactly as the image installs it (scripts/install-package.sh).

    Kept in the build cache, keyed by the sources, and outside /tmp: the chart mounts an
    emptyDir at /tmp, and the node agent's pods see the host's file system beneath it.
    """
    venv = binaries.cache_root() / "venvs" / f"operator-{_sources_digest()}"
    if not (venv / "bin" / "tpu-operator").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(
            ["sh", str(REPO / "scripts" / "install-package.sh"), "operator", str(venv), str(REPO)],
            check=True,
            timeout=600,
        )
    return venv


@pytest.fixture(scope="session")
def release_values(operator_venv: Path) -> dict[str, Any]:
    """Values for the e2e release: every optional part on, short alert durations."""
    return {
        "command": [str(operator_venv / "bin" / "tpu-operator")],
        "operator": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "logFormat": "text",
            "progressPublishSeconds": 2,
        },
        "serviceMonitor": {"enabled": True, "interval": "2s"},
        "podMonitor": {"enabled": True, "interval": "2s"},
        "prometheusRule": {
            "enabled": True,
            "stallSeconds": 10,
            "for": "2s",
            "targetDownFor": "10s",
        },
        "dashboards": {"enabled": True},
    }


@pytest.fixture(scope="session")
def rendered(helm: Helm, release_values: dict[str, Any]) -> list[dict[str, Any]]:
    return helm.template(release_values)


@pytest.fixture(scope="session")
def prometheus(cluster, rendered, tmp_path_factory) -> Iterator[Prometheus]:
    server = Prometheus(Path(tmp_path_factory.mktemp("prometheus")), rendered, cluster.api())
    server.check_config()
    server.start()
    yield server
    server.stop()
