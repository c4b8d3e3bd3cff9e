"""Grafana dashboards for tpu-operator, generated as JSON into the Helm chart.

Two dashboards with stable uids and a Prometheus datasource variable: the fleet view
(jobs by phase, restarts, time to running, goodput, operator health) and the job view
(per job, slice and worker: step, step time, throughput, MFU, loss, goodput and badput,
last progress, device memory, stragglers). ``tpu-operator dashboards --write`` writes
them; a unit test fails when the committed files are stale, and the end-to-end test runs
every panel's queries against a real Prometheus.

Worker series carry the labels the PodMonitor's relabelling adds (namespace, pod, node,
tpujob, slice, worker, attempt); operator series carry namespace and tpujob themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTPUT_DIR = REPO_ROOT / "charts" / "tpu-operator" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'namespace="$namespace", tpujob="$tpujob"'
WORKERS = f'{JOB}, slice=~"$slice", worker=~"$worker"'
RATE = "$__rate_interval"


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
        _variable("namespace", "label_values(tpu_worker_build_info, namespace)"),
        _variable("tpujob", 'label_values(tpu_worker_build_info{namespace="$namespace"}, tpujob)'),
        _variable("slice", f"label_values(tpu_worker_build_info{{{JOB}}}, slice)", multi=True),
        _variable("worker", f"label_values(tpu_worker_build_info{{{JOB}}}, worker)", multi=True),
    ]
    panels = [
        _panel(1, "Step", [(f"max(tpu_worker_step{{{JOB}}})", "step")], kind="stat", w=6),
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
            [(f"time() - max(tpu_worker_last_progress_timestamp_seconds{{{JOB}}})", "age")],
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
                    f"tpu_worker_step_duration_seconds_bucket{{{WORKERS}}}[{RATE}])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) (rate("
                    f"tpu_worker_step_duration_seconds_bucket{{{WORKERS}}}[{RATE}])))",
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
                (f"sum(rate(tpu_worker_tokens_total{{{WORKERS}}}[{RATE}]))", "tokens/s"),
                (f"sum(rate(tpu_worker_examples_total{{{WORKERS}}}[{RATE}]))", "examples/s"),
            ],
            x=12,
            y=8,
        ),
        _panel(
            7,
            "MFU",
            [
                (
                    f"sum(rate(tpu_worker_model_flops_total{{{WORKERS}}}[{RATE}])) / "
                    f"sum(tpu_worker_peak_flops_per_second{{{WORKERS}}})",
                    "MFU",
                )
            ],
            unit="percentunit",
            y=16,
        ),
        _panel(
            8,
            "Loss",
            [(f'min(tpu_worker_loss{{{JOB}, slice="0", worker="0"}})', "loss")],
            x=12,
            y=16,
        ),
        _panel(
            9,
            "Where worker time goes (fraction of wall time)",
            [
                (
                    "sum by (phase) (rate("
                    f"tpu_worker_phase_seconds_total{{{WORKERS}}}[{RATE}])) / scalar(count("
                    "count by (pod, attempt) (rate("
                    f"tpu_worker_phase_seconds_total{{{WORKERS}}}[{RATE}]))))",
                    "{{phase}}",
                )
            ],
            unit="percentunit",
            y=24,
            description="Average over the worker processes seen in the window. phase=step "
            "is productive (goodput); the others are badput. A phase is counted when it ends, "
            "so a long one (a compilation) shows as a spike.",
        ),
        _panel(
            10,
            "Data wait per step, by worker (stragglers stand out)",
            [
                (
                    "rate(tpu_worker_phase_seconds_total{"
                    f'{WORKERS}, phase="data_wait"}}[{RATE}]) / on (pod, attempt) '
                    f"rate(tpu_worker_steps_total{{{WORKERS}}}[{RATE}])",
                    "{{pod}}",
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
                    f"max by (pod) (tpu_worker_device_memory_used_bytes{{{WORKERS}}})",
                    "{{pod}} used",
                ),
                (
                    f"max by (pod) (tpu_worker_device_memory_limit_bytes{{{WORKERS}}})",
                    "{{pod}} limit",
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


def write(directory: Path = OUTPUT_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, dashboard in dashboards().items():
        path = directory / name
        path.write_text(render(dashboard))
        written.append(path)
    return written
