"""``helm lint --strict`` and chart-testing's ``ct lint`` over every values combination."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from localcluster.helm import CHART, REPO
from tests.chart.conftest import (
    VALUES_FILES,
    Rendering,
    Tools,
    chart_metadata,
    run,
    values_id,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("values", VALUES_FILES, ids=values_id)
def test_helm_lint_strict(tools: Tools, values: Path) -> None:
    result = run(tools.helm, "lint", "--strict", CHART, "--values", values)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_chart_testing_lint(tools: Tools) -> None:
    """``ct lint``: Chart.yaml against chart-testing's schema (yamale), Chart.yaml, values.yaml
    and every ci/ values file through its yamllint rules, ``helm lint --strict`` with each
    values file. Not here: the version bump check compares the chart with a target branch
    of a pull request (this suite runs on the branch itself), and the maintainer check asks
    GitHub whether each maintainer's account exists (offline here: the maintainers are
    checked for presence below instead)."""
    env = {
        **os.environ,
        # ct runs helm, yamllint and yamale from PATH: the pinned ones.
        "PATH": os.pathsep.join([str(tools.helm.parent), str(Path(sys.executable).parent)])
        + os.pathsep
        + os.environ.get("PATH", ""),
    }
    result = run(
        tools.ct,
        "lint",
        "--charts",
        CHART.relative_to(REPO),
        "--chart-yaml-schema",
        tools.ct_config / "chart_schema.yaml",
        "--lint-conf",
        tools.ct_config / "lintconf.yaml",
        "--helm-lint-extra-args=--strict",
        "--check-version-increment=false",
        "--validate-maintainers=false",
        cwd=REPO,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "All charts linted successfully" in output
    for values in VALUES_FILES:
        assert f'Linting chart with values file "{values.relative_to(REPO)}"' in output
    maintainers = chart_metadata().get("maintainers") or []
    assert maintainers, "Chart.yaml has no maintainers (chart-testing requires them)"
    assert all(m.get("name") for m in maintainers), maintainers


def test_every_template_renders_in_some_values_combination(renderings: list[Rendering]) -> None:
    """Each template is linted, validated and scanned only where a values combination
    renders it: a template no ci/ values file reaches would go unchecked."""
    rendered = {
        line.removeprefix("# Source: tpu-operator/")
        for r in renderings
        for line in r.text.splitlines()
        if line.startswith("# Source: ")
    }
    templates = {
        str(p.relative_to(CHART))
        for p in (CHART / "templates").glob("*.yaml")
        if p.read_text().strip()
    }
    unreached = templates - rendered
    assert not unreached, f"templates no ci/*-values.yaml renders: {sorted(unreached)}"
