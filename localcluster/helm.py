"""Run helm (built from Go modules, see binaries.py) against the local cluster."""

from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from localcluster import binaries

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "tpu-operator"


class HelmError(RuntimeError):
    """A helm command failed; the message has its output."""


class Helm:
    def __init__(self, kubeconfig: Path, chart: Path = CHART, binary: Path | None = None) -> None:
        self.binary = binary or binaries.ensure(binaries.HELM)["helm"]
        self.kubeconfig = kubeconfig
        self.chart = chart

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and result.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def template(
        self,
        values: dict[str, Any],
        *,
        release: str,
        namespace: str,
        api_versions: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """The chart rendered with ``values``, as objects. ``helm template`` knows only the
        built-in APIs: ``api_versions`` (``group/version/Kind``) adds others, so that
        templates rendered only where the cluster serves an API (the monitors) render."""
        extra = [f"--api-versions={v}" for v in api_versions]
        out = self(
            "template",
            release,
            str(self.chart),
            "--namespace",
            namespace,
            "--values",
            values_file(values),
            *extra,
        ).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    def install(self, values: dict[str, Any], *, release: str, namespace: str) -> None:
        self(
            "upgrade",
            "--install",
            release,
            str(self.chart),
            "--namespace",
            namespace,
            "--create-namespace",
            "--values",
            values_file(values),
            "--wait",
            "--timeout",
            "180s",
        )


def values_file(values: dict[str, Any]) -> str:
    """A values file for helm (JSON is YAML), removed at exit."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
    with handle:
        json.dump(values, handle)
    atexit.register(Path(handle.name).unlink, missing_ok=True)
    return handle.name
