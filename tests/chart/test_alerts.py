"""The chart's alert rules: ``promtool check rules`` on every values combination that
renders them, and ``promtool test rules`` (alerts.test.yaml) on the rules as the chart's
defaults render them, with a case where each alert fires and one where it stays silent.

The rules have one source, the chart's templates/prometheusrule.yaml (worker metric names
from tpu_operator/worker_metrics.py through _worker_metrics.tpl); they are tested as
rendered.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.helm import values_file
from tests.chart.conftest import Rendering, Tools, render, run

pytestmark = pytest.mark.e2e

RULE_TESTS = Path(__file__).with_name("alerts.test.yaml")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool missing: scripts/ensure-prometheus.sh installs Prometheus"
    return path


def rule_groups(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules = [d for d in documents if d["kind"] == "PrometheusRule"]
    assert len(rules) <= 1
    return rules[0]["spec"]["groups"] if rules else []


def alerts(groups: list[dict[str, Any]]) -> set[str]:
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


@pytest.fixture(scope="module")
def default_rules(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rules with the chart's defaults (prometheusRule on), as a Prometheus rule file."""
    enabled = Path(values_file({"prometheusRule": {"enabled": True}}))
    groups = rule_groups(render(tools, enabled).documents)
    assert groups, "prometheusRule.enabled=true rendered no PrometheusRule"
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def test_promtool_checks_the_rules_of_every_values_combination(
    promtool: str, renderings: list[Rendering], tmp_path: Path
) -> None:
    checked = 0
    for rendering in renderings:
        groups = rule_groups(rendering.documents)
        if not groups:
            continue
        path = tmp_path / f"{rendering.values.stem}.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        result = run(promtool, "check", "rules", path)
        count = sum(len(g["rules"]) for g in groups)
        assert result.returncode == 0, f"{rendering.values.name}:\n{result.stdout}{result.stderr}"
        assert f"SUCCESS: {count} rules found" in result.stdout
        checked += 1
    assert checked, "no values combination renders the alert rules"


def test_promtool_unit_tests_of_the_alert_rules_pass(promtool: str, default_rules: Path) -> None:
    # The test file names its rule file relative to itself: rules.yaml beside it.
    assert yaml.safe_load(RULE_TESTS.read_text())["rule_files"] == [default_rules.name]
    path = default_rules.with_name(RULE_TESTS.name)
    shutil.copyfile(RULE_TESTS, path)
    result = run(promtool, "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_silent_rule_test(default_rules: Path) -> None:
    shipped = alerts(yaml.safe_load(default_rules.read_text())["groups"])
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert not shipped - firing, f"alerts with no rule test where they fire: {shipped - firing}"
    assert not shipped - silent, (
        f"alerts with no rule test where they stay silent: {shipped - silent}"
    )
    unknown = (firing | silent) - shipped
    assert not unknown, f"{RULE_TESTS.name} tests alerts the chart does not ship: {unknown}"
