"""The chart checked as Helm charts are checked in their ecosystem: ``helm lint --strict``,
chart-testing's ``ct lint``, every rendered manifest validated strictly against the
schemas of each Kubernetes version the chart declares, deprecated APIs (pluto), the alert
rules checked and unit tested (promtool).

The values combinations are the chart's ``ci/*-values.yaml`` files (chart-testing's
convention: ``ct lint`` lints the chart with each of them); each names the tests whose
values it stands for. The tools are pinned: helm, ct and pluto are built from the Go
modules pinned in ``localcluster/gobuild/`` (``python -m localcluster build --helm
--chart-tools``, cached), yamllint, yamale and kubernetes-validate are pinned in the dev
extra of pyproject.toml, promtool is Debian's (``scripts/ensure-prometheus.sh``).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import binaries
from localcluster.helm import CHART
from localcluster.prometheus import PROMETHEUS_OPERATOR_APIS

VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "tpu-operator"
NAMESPACE = "tpu-system"
MANAGED_PROMETHEUS_APIS = ("monitoring.googleapis.com/v1/PodMonitoring",)
SERVED_APIS = (*PROMETHEUS_OPERATOR_APIS, *MANAGED_PROMETHEUS_APIS)
"""Every optional API the chart renders objects for: a cluster with prometheus-operator
and Managed Service for Prometheus."""
CUSTOM_GROUPS = {"monitoring.coreos.com", "monitoring.googleapis.com"}
"""API groups of the custom resources the chart renders (no Kubernetes schema has them)."""


def values_id(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


@dataclass(frozen=True)
class Tools:
    helm: Path
    ct: Path
    pluto: Path

    @property
    def ct_config(self) -> Path:
        """ct's Chart.yaml schema and yamllint configuration, of the pinned release."""
        return self.ct.parent


@pytest.fixture(scope="session")
def tools() -> Tools:
    paths = binaries.ensure_all((binaries.HELM, *binaries.CHART_TOOLS))
    return Tools(helm=paths["helm"], ct=paths["ct"], pluto=paths["pluto"])


def run(*command: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kwargs,
    )


def chart_metadata() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def minimum_kubernetes() -> tuple[int, int]:
    """The oldest Kubernetes minor version Chart.yaml's kubeVersion admits."""
    constraint = chart_metadata()["kubeVersion"]
    match = re.fullmatch(r"\s*>=\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:-0)?\s*", constraint)
    assert match, f"Chart.yaml kubeVersion {constraint!r}: expected a '>=X.Y.Z-0' floor"
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class Rendering:
    values: Path
    text: str
    documents: list[dict[str, Any]]


def render(tools: Tools, values: Path, *extra: str) -> Rendering:
    """The chart with ``values`` as ``helm template`` renders it for a cluster that serves
    every optional API, CRDs included, at the oldest Kubernetes version it declares."""
    major, minor = minimum_kubernetes()
    result = run(
        tools.helm,
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--values",
        values,
        "--include-crds",
        f"--kube-version={major}.{minor}.0",
        *[f"--api-versions={api}" for api in SERVED_APIS],
        *extra,
    )
    assert result.returncode == 0, f"helm template -f {values.name}:\n{result.stderr}"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    documents = [d for d in yaml.load_all(result.stdout, Loader=loader) if d]
    return Rendering(values, result.stdout, documents)


@pytest.fixture(scope="session")
def renderings(tools: Tools) -> list[Rendering]:
    assert VALUES_FILES, f"no values combinations in {CHART / 'ci'}"
    return [render(tools, values) for values in VALUES_FILES]
