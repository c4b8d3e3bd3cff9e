"""Worker metric names: defined once (``tpu_operator.worker_metrics``), used everywhere.

The worker exports exactly the defined metrics; the chart's alert rules take the names
from a generated helper template that must match the generator; the dashboards, the
chart and the docs spell no worker metric that is not defined.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import metrics as client_metrics

from tpu_operator import dashboards
from tpu_operator import worker_metrics as wm
from tpu_operator.progress.samples import parse
from tpu_worker.metrics import MemoryStat, WorkerMetrics

pytestmark = pytest.mark.unit

CHART = dashboards.REPO_ROOT / "charts" / "tpu-operator"
DOCS = dashboards.REPO_ROOT / "docs"
WORKER_METRIC = re.compile(r"\btpu_worker_[a-z][a-z0-9_]*")
SERIES = {s for name in wm.METRICS for s in (name, *wm.series(name))}


def _used(text: str) -> set[str]:
    return set(WORKER_METRIC.findall(text))


@pytest.fixture
def worker_metrics() -> Iterator[WorkerMetrics]:
    """A worker registry with every metric populated (device memory and build info too)."""
    created = client_metrics._use_created
    exported = WorkerMetrics()  # turns off *_created series process-wide
    try:
        exported.watch_device_memory(lambda: [MemoryStat(0, 1, 2, 3)])
        exported.build_info.labels(*(["x"] * len(wm.BUILD_INFO_LABELS))).set(1)
        yield exported
    finally:
        if created:
            prometheus_client.enable_created_metrics()


def test_the_worker_exports_exactly_the_defined_metrics(worker_metrics):
    exported = {}
    samples = set()
    for family in worker_metrics.registry.collect():
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        exported[family.name] = (family.type, labels)
        samples |= {s.name for s in family.samples}
    defined = {
        name.removesuffix("_total") if kind == wm.COUNTER else name: (kind, set(labels))
        for name, (kind, labels) in wm.METRICS.items()
    }
    assert exported == defined
    assert samples == {s for name in wm.METRICS for s in wm.series(name)}


def test_the_sampler_reads_what_the_worker_exports(worker_metrics):
    worker_metrics.steps.inc(3)
    worker_metrics.step.set(10)
    worker_metrics.tokens.inc(64)
    worker_metrics.step_duration.observe(0.5)
    worker_metrics.phase_counter(wm.PHASE_DATA_WAIT).inc(1.5)
    worker_metrics.start_time.set(100.0)
    text = prometheus_client.generate_latest(worker_metrics.registry).decode()
    sample = parse(text, 0.0)
    assert (sample.steps_total, sample.step, sample.tokens) == (3, 10, 64)
    assert (sample.step_seconds_sum, sample.step_seconds_count) == (0.5, 1)
    assert sample.start_time == 100.0
    assert set(sample.phases) == set(wm.BUILTIN_PHASES)
    assert sample.phases[wm.PHASE_DATA_WAIT] == 1.5


def test_committed_worker_metrics_template_matches_the_generator():
    path = dashboards.WORKER_METRICS_TEMPLATE
    assert path.exists(), f"{path} is missing; run `tpu-operator dashboards --write`"
    assert path.read_text() == dashboards.worker_metrics_template(), (
        f"{path} is stale; run `tpu-operator dashboards --write` and commit the result"
    )
    assert set(dashboards.worker_metric_names().values()) == SERIES


def test_chart_templates_take_worker_metric_names_from_the_helper():
    names = dashboards.worker_metric_names()
    referenced = 0
    for path in sorted((CHART / "templates").iterdir()):
        if path == dashboards.WORKER_METRICS_TEMPLATE:
            continue
        text = path.read_text()
        assert not _used(text), f"{path.name} spells worker metric names; use $m.<NAME>"
        for key in re.findall(r"\$m\.([A-Za-z0-9_]+)", text):
            assert f'$m := include "{dashboards.WORKER_METRICS_DEFINE}"' in text, path.name
            assert key in names, f"{path.name}: $m.{key} is not a worker metric"
            referenced += 1
    assert referenced, "the alert rules no longer use any worker metric"


def test_dashboards_name_only_defined_metrics():
    # The docs' metric names are checked by tests/unit/test_docs.py.
    for path in sorted((CHART / "dashboards").glob("*.json")):
        unknown = _used(path.read_text()) - SERIES
        assert not unknown, f"{path.name} names undefined worker metrics: {sorted(unknown)}"


def test_the_metrics_reference_lists_every_worker_metric():
    text = (DOCS / "reference" / "metrics.md").read_text()
    for name, (kind, labels) in wm.METRICS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}`")), None)
        assert row is not None, f"docs/reference/metrics.md does not list {name}"
        assert f"| {kind}" in row, f"docs/reference/metrics.md: {name} is a {kind}"
        for label in labels:
            assert f"`{label}`" in row, f"docs/reference/metrics.md: {name} has label {label}"


def test_the_worker_exports_the_defined_help_texts(worker_metrics):
    helps = {family.name: family.documentation for family in worker_metrics.registry.collect()}
    for name, (kind, _) in wm.METRICS.items():
        family = name.removesuffix("_total") if kind == wm.COUNTER else name
        assert helps[family] == wm.HELP[name], name
    assert set(wm.HELP) == set(wm.METRICS)


def test_the_pod_monitor_attaches_the_target_labels():
    text = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert tuple(re.findall(r"targetLabel: (\w+)", text)) == wm.TARGET_LABELS


def test_the_worker_metrics_module_imports_only_the_standard_library():
    source = Path(wm.__file__).read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, re.M)
    assert set(imports) <= {"__future__", "typing"}, imports
