"""Grafana dashboards for tpu-operator, generated as JSON into the Helm chart.

Two dashboards with stable uids and a Prometheus datasource variable: the fleet view
(jobs by phase, restarts, time to running, goodput, operator health) and the job view
(per job, slice and worker: step, step time, throughput, MFU, loss, goodput and badput,
last progress, device memory, stragglers). ``tpu-operator dashboards --write`` writes
them; a unit test fails when the committed files are stale, and the end-to-end test runs
every panel's queries against a real Prometheus.

Worker series carry the labels the PodMonitor's relabelling adds (namespace, pod, node,
tpujob, slice, worker, attempt); operator series carry namespace and tpujob themselves.
Worker metric and label names come from ``tpu_operator.worker_metrics``, which is also
the source of the chart's helper template that gives the alert rules the same names
(``WORKER_METRICS_TEMPLATE``, written together with the dashboards).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpu_operator import worker_metrics as wm

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTPUT_DIR = REPO_ROOT / "charts" / "tpu-operator" / "dashboards"
WORKER_METRICS_TEMPLATE = (
    REPO_ROOT / "charts" / "tpu-operator" / "templates" / "_worker_metrics.tpl"
)
WORKER_METRICS_DEFINE = "tpu-operator.workerMetrics"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB = f'{wm.LABEL_NAMESPACE}="$namespace", {wm.LABEL_TPUJOB}="$tpujob"'
WORKERS = f'{JOB}, {wm.LABEL_SLICE}=~"$slice", {wm.LABEL_WORKER}=~"$worker"'
POD = wm.LABEL_POD
PHASE = wm.LABEL_PHASE
RATE = "$__rate_interval"


def _legend(label: str, text: str = "") -> str:
    """A legend that shows a label's value, optionally followed by ``text``."""
    return f"{{{{{label}}}}} {text}" if text else f"{{{{{label}}}}}"


def _target(expr: str, legend: str = "", ref: str = "A") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def _panel(
    panel_id: int,
    title: str,
    targets: list[tuple[str, str]],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    x: int = 0,
    y: int = 0,
    w: int = 12,
    h: int = 8,
    description: str = "",
) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            _target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)
        ],
    }


def _variable(name: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "allValue": ".*" if multi else None,
    }


def _dashboard(uid: str, title: str, variables: list[dict], panels: list[dict]) -> dict:
    datasource = {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "refresh": 1,
    }
    return {
        "uid": uid,
        "title": title,
        "tags": ["tpu", "tpu-operator"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource, *variables]},
        "panels": panels,
    }


def fleet() -> dict[str, Any]:
    panels = [
        _panel(1, "TPUJobs by phase", [("sum by (phase) (tpu_operator_jobs)", "{{phase}}")], w=12),
        _panel(
            2, "TPUSlices by phase", [("sum by (phase) (tpu_operator_slices)", "{{phase}}")], x=12
        ),
        _panel(
            3,
            "Gang restarts by reason (over the range)",
            [("sum by (reason) (increase(tpu_operator_restarts_total[$__range]))", "{{reason}}")],
            kind="bargauge",
            y=8,
        ),
        _panel(
            4,
            "Time from TPUJob creation to all workers running (since the operator started)",
            [
                (
                    "histogram_quantile(0.5, sum by (le) "
                    "(tpu_operator_job_time_to_running_seconds_bucket))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) "
                    "(tpu_operator_job_time_to_running_seconds_bucket))",
                    "p95",
                ),
            ],
            kind="stat",
            unit="s",
            x=12,
            y=8,
            description="Cumulative over the operator's life: a job that started before "
            "Prometheus first scraped the operator still counts.",
        ),
        _panel(
            5,
            "Goodput by job",
            [("tpu_operator_job_goodput", "{{namespace}}/{{tpujob}}")],
            unit="percentunit",
            y=16,
        ),
        _panel(
            6,
            "Restarts by job",
            [("tpu_operator_job_restarts", "{{namespace}}/{{tpujob}}")],
            x=12,
            y=16,
        ),
        _panel(
            7,
            "Reconcile time p95 by kind",
            [
                (
                    "histogram_quantile(0.95, sum by (le, kind) "
                    f"(rate(tpu_operator_reconcile_duration_seconds_bucket[{RATE}]))) "
                    "and on (kind) sum by (kind) "
                    f"(rate(tpu_operator_reconcile_duration_seconds_count[{RATE}])) > 0",
                    "{{kind}}",
                )
            ],
            unit="s",
            y=24,
            w=8,
        ),
        _panel(
            8,
            "Kubernetes API requests by code",
            [(f"sum by (code) (rate(tpu_operator_api_requests_total[{RATE}]))", "{{code}}")],
            unit="reqps",
            x=8,
            y=24,
            w=8,
        ),
        _panel(
            9,
            "Operator work queues and up",
            [
                ("sum by (queue) (tpu_operator_workqueue_depth)", "{{queue}} depth"),
                ("count(tpu_operator_build_info)", "operators up"),
            ],
            x=16,
            y=24,
            w=8,
        ),
    ]
    return _dashboard("tpu-operator-fleet", "TPU jobs: fleet", [], panels)


def job() -> dict[str, Any]:
    variables = [
        _variable("namespace", f"label_values({wm.BUILD_INFO}, {wm.LABEL_NAMESPACE})"),
        _variable(
            "tpujob",
            f'label_values({wm.BUILD_INFO}{{{wm.LABEL_NAMESPACE}="$namespace"}}, '
            f"{wm.LABEL_TPUJOB})",
        ),
        _variable("slice", f"label_values({wm.BUILD_INFO}{{{JOB}}}, {wm.LABEL_SLICE})", multi=True),
        _variable(
            "worker", f"label_values({wm.BUILD_INFO}{{{JOB}}}, {wm.LABEL_WORKER})", multi=True
        ),
    ]
    panels = [
        _panel(1, "Step", [(f"max({wm.STEP}{{{JOB}}})", "step")], kind="stat", w=6),
        _panel(
            2,
            "Goodput (operator account)",
            [(f"tpu_operator_job_goodput{{{JOB}}}", "goodput")],
            kind="stat",
            unit="percentunit",
            x=6,
            w=6,
        ),
        _panel(
            3,
            "Seconds since the last step",
            [(f"time() - max({wm.LAST_PROGRESS_TIMESTAMP_SECONDS}{{{JOB}}})", "age")],
            kind="stat",
            unit="s",
            x=12,
            w=6,
        ),
        _panel(
            4,
            "Restarts",
            [(f"tpu_operator_job_restarts{{{JOB}}}", "restarts")],
            kind="stat",
            x=18,
            w=6,
        ),
        _panel(
            5,
            "Step time",
            [
                (
                    "histogram_quantile(0.5, sum by (le) (rate("
                    f"{wm.STEP_DURATION_SECONDS_BUCKET}{{{WORKERS}}}[{RATE}])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) (rate("
                    f"{wm.STEP_DURATION_SECONDS_BUCKET}{{{WORKERS}}}[{RATE}])))",
                    "p95",
                ),
            ],
            unit="s",
            y=8,
        ),
        _panel(
            6,
            "Throughput",
            [
                (f"sum(rate({wm.TOKENS_TOTAL}{{{WORKERS}}}[{RATE}]))", "tokens/s"),
                (f"sum(rate({wm.EXAMPLES_TOTAL}{{{WORKERS}}}[{RATE}]))", "examples/s"),
            ],
            x=12,
            y=8,
        ),
        _panel(
            7,
            "MFU",
            [
                (
                    f"sum(rate({wm.MODEL_FLOPS_TOTAL}{{{WORKERS}}}[{RATE}])) / "
                    f"sum({wm.PEAK_FLOPS_PER_SECOND}{{{WORKERS}}})",
                    "MFU",
                )
            ],
            unit="percentunit",
            y=16,
        ),
        _panel(
            8,
            "Loss",
            [(f'min({wm.LOSS}{{{JOB}, {wm.LABEL_SLICE}="0", {wm.LABEL_WORKER}="0"}})', "loss")],
            x=12,
            y=16,
        ),
        _panel(
            9,
            "Where worker time goes (fraction of wall time)",
            [
                (
                    f"sum by ({PHASE}) (rate("
                    f"{wm.PHASE_SECONDS_TOTAL}{{{WORKERS}}}[{RATE}])) / scalar(count("
                    f"count by ({POD}, {wm.LABEL_ATTEMPT}) (rate("
                    f"{wm.PHASE_SECONDS_TOTAL}{{{WORKERS}}}[{RATE}]))))",
                    _legend(PHASE),
                )
            ],
            unit="percentunit",
            y=24,
            description="Average over the worker processes seen in the window. phase=step "
            "is productive (goodput); the others are badput. Phases count while they run, "
            "except compile time, which JAX reports when a compilation ends: it shows up "
            "after the compilation, over about as long again.",
        ),
        _panel(
            10,
            "Data wait per step, by worker (stragglers stand out)",
            [
                (
                    f"rate({wm.PHASE_SECONDS_TOTAL}{{"
                    f'{WORKERS}, {PHASE}="{wm.PHASE_DATA_WAIT}"}}[{RATE}]) / '
                    f"on ({POD}, {wm.LABEL_ATTEMPT}) "
                    f"rate({wm.STEPS_TOTAL}{{{WORKERS}}}[{RATE}])",
                    _legend(POD),
                )
            ],
            unit="s",
            x=12,
            y=24,
        ),
        _panel(
            11,
            "Device memory",
            [
                (
                    f"max by ({POD}) ({wm.DEVICE_MEMORY_USED_BYTES}{{{WORKERS}}})",
                    _legend(POD, "used"),
                ),
                (
                    f"max by ({POD}) ({wm.DEVICE_MEMORY_LIMIT_BYTES}{{{WORKERS}}})",
                    _legend(POD, "limit"),
                ),
            ],
            unit="bytes",
            y=32,
            w=24,
        ),
    ]
    return _dashboard("tpu-operator-job", "TPU job", variables, panels)


def dashboards() -> dict[str, dict[str, Any]]:
    return {"tpu-operator-fleet.json": fleet(), "tpu-operator-job.json": job()}


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def worker_metric_names() -> dict[str, str]:
    """Every worker metric name of ``worker_metrics``, by its constant's name."""
    return {
        key: value
        for key, value in vars(wm).items()
        if key.isupper()
        and key != "PREFIX"
        and isinstance(value, str)
        and value.startswith(wm.PREFIX)
    }


def worker_metrics_template() -> str:
    """The chart's helper template that hands the worker metric names to the alert rules.

    A template takes them as a dict and uses the constants' names, so a rule spells no
    worker metric name itself::

        {{- $m := include "tpu-operator.workerMetrics" . | fromYaml }}
        expr: max by (namespace, tpujob) ({{ $m.END_TIME_SECONDS }}) == 0
    """
    lines = [
        "{{- /*",
        "Generated from operator/tpu_operator/worker_metrics.py by",
        "`tpu-operator dashboards --write` (make dashboards): do not edit.",
        "The worker's metric names, keyed by their constants' names, as YAML; the alert",
        "rules read them with include and fromYaml.",
        "*/ -}}",
        f'{{{{- define "{WORKER_METRICS_DEFINE}" -}}}}',
        *(f"{key}: {value}" for key, value in worker_metric_names().items()),
        "{{- end -}}",
    ]
    return "\n".join(lines) + "\n"


def write(directory: Path = OUTPUT_DIR) -> list[Path]:
    """Write the dashboards into ``directory`` and the worker metric names helper."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, dashboard in dashboards().items():
        path = directory / name
        path.write_text(render(dashboard))
        written.append(path)
    WORKER_METRICS_TEMPLATE.write_text(worker_metrics_template())
    written.append(WORKER_METRICS_TEMPLATE)
    return written
