"""The local demo: the whole product on this machine, from a fresh clone.

``python -m localcluster.demo`` (``make demo``): builds or reuses the control-plane and
helm binaries, installs Prometheus if needed, starts the local cluster with simulated TPU
node pools (detached: its daemon restarts any component that exits), installs the
operator with its Helm chart (the operator runs in the cluster as the chart's
ServiceAccount, from its image: built from ./Dockerfile with buildah, run by podman; see
docs/contributing/images.md), starts a real Prometheus
configured from the chart's monitors and alert rules, applies
examples/local-demo.yaml (four JAX processes on two simulated v5p slices), shows live
progress and ends with a summary and where to look. Everything keeps running until
``python -m localcluster.demo down`` (``make demo-down``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from localcluster import binaries, images
from localcluster.cluster import Cluster, ClusterError
from localcluster.helm import Helm
from localcluster.prometheus import PROMETHEUS_OPERATOR_APIS, Prometheus, free_port

REPO = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO / ".demo"
CLUSTER_DIR = DEMO_DIR / "cluster"
STATE = DEMO_DIR / "state.json"
EXAMPLE = REPO / "examples" / "local-demo.yaml"
# The example's hostPath checkpoints (<dir>/<namespace>/<job>): a new demo starts afresh.
CHECKPOINTS = Path("/var/tmp/tpu-operator-demo/default/demo")
RELEASE, RELEASE_NAMESPACE = "tpu-operator", "tpu-system"
SCRAPER = {"namespace": "monitoring", "name": "prometheus"}
"""The ServiceAccount the demo's Prometheus scrapes the operator as (bound by the chart)."""
STEPS = 7


def say(step: int, message: str) -> None:
    print(f"[demo {step}/{STEPS}] {message}", flush=True)


def operator_command(cluster: Cluster, helm: Helm, values: dict[str, Any]) -> list[str]:
    """The chart's command for the operator container: podman running the operator image
    (localcluster.images), built from ./Dockerfile or taken from the build cache, with the
    volume mounts and env of the container the chart renders from ``values``."""
    image = images.ensure(images.OPERATOR)
    rendered = helm.template(values, release=RELEASE, namespace=RELEASE_NAMESPACE)
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [
        *images.podman_command(),
        *images.pod_run_arguments(image, container, cluster.directory),
    ]


def chart_values(command: list[str], *, monitors: bool) -> dict[str, Any]:
    return {
        "command": command,
        "operator": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "logFormat": "text",
            "progressPublishSeconds": 5,
        },
        "metrics": {"auth": {"readers": [SCRAPER]}},
        "serviceMonitor": {"enabled": monitors, "interval": "5s"},
        "podMonitor": {"enabled": monitors, "interval": "5s"},
        "prometheusRule": {"enabled": monitors, "stallSeconds": 120},
        "dashboards": {"enabled": False},
    }


def start_prometheus(cluster: Cluster, helm: Helm, command: list[str]) -> Prometheus:
    """Prometheus (and its pod discovery) detached: they outlive this command."""
    # The monitors as helm renders them on a cluster with prometheus-operator.
    rendered = helm.template(
        chart_values(command, monitors=True),
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        api_versions=PROMETHEUS_OPERATOR_APIS,
    )
    port = 9090 if _free(9090) else free_port()
    cluster.kubectl("create", "namespace", SCRAPER["namespace"], check=False)
    cluster.kubectl(
        "create", "serviceaccount", SCRAPER["name"], "-n", SCRAPER["namespace"], check=False
    )
    token = cluster.service_account_token(
        SCRAPER["namespace"], SCRAPER["name"], seconds=30 * 24 * 3600
    )
    server = Prometheus(DEMO_DIR / "prometheus", rendered, cluster.api(), port=port, token=token)
    server.start(discovery_thread=False)
    discovery = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localcluster.prometheus",
            "discover",
            "--cluster",
            str(CLUSTER_DIR),
            "--targets",
            str(server.discovery.path),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=open(DEMO_DIR / "discovery.log", "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    assert server.process is not None
    STATE.write_text(
        json.dumps({"prometheus": server.process.pid, "discovery": discovery.pid, "port": port})
    )
    return server


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def down() -> int:
    """Stop the demo's Prometheus, pod discovery and cluster."""
    if STATE.exists():
        state = json.loads(STATE.read_text())
        for name in ("discovery", "prometheus"):
            pid = state.get(name)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
        STATE.unlink()
    with contextlib.suppress(ClusterError):  # nothing running there
        Cluster.attach(CLUSTER_DIR).stop()
    if shutil.which("podman"):
        images.remove_cluster_containers(CLUSTER_DIR)
    print("[demo] stopped")
    return 0


def _line(status: dict[str, Any]) -> str:
    progress = status.get("progress") or {}
    parts = [
        f"phase {status.get('phase', 'Pending')}",
        f"workers {status.get('ready') or '-'}",
        f"attempt {status.get('attempt', 0)}",
        f"step {progress.get('step', '-')}",
    ]
    if progress.get("tokensPerSecond") is not None:
        parts.append(f"{progress['tokensPerSecond']:,.0f} tokens/s")
    if progress.get("mfu") is not None:
        parts.append(f"MFU {progress['mfu']:.4f}")
    if status.get("restarts"):
        parts.append(f"restarts {status['restarts']}")
    return " | ".join(parts)


def follow(cluster: Cluster, timeout: float) -> dict[str, Any]:
    """Print the job's progress as it changes; return its final status."""
    api = cluster.api()
    path = "/apis/tpu-operator.dev/v1alpha1/namespaces/default/tpujobs/demo"
    started, last = time.monotonic(), ""
    while time.monotonic() - started < timeout:
        status = api.get(path).get("status") or {}
        line = _line(status)
        if line != last:
            print(f"  {time.monotonic() - started:5.0f} s  {line}", flush=True)
            last = line
        if status.get("phase") in ("Succeeded", "Failed"):
            return status
        time.sleep(1.0)
    raise SystemExit(f"[demo] the job did not finish in {timeout:.0f} s; it is: {last}")


def summary(cluster: Cluster, status: dict[str, Any], prometheus: Prometheus, took: float):
    progress, goodput = status.get("progress") or {}, status.get("goodput") or {}
    kubectl = cluster.kubectl_path
    operator_logs = sorted(CLUSTER_DIR.glob(f"pods/{RELEASE_NAMESPACE}/*/operator.log"))
    print()
    print(f"TPUJob default/demo {status.get('phase')}: {status.get('message', '')}")
    print(
        f"  step {progress.get('step')}, attempt {status.get('attempt')}, restarts "
        f"{status.get('restarts', 0)}; demo wall time {took:.0f} s"
    )
    if progress.get("tokensPerSecond") is not None:
        print(
            f"  throughput {progress['tokensPerSecond']:,.0f} tokens/s, MFU "
            f"{progress.get('mfu')} (against the CPU's theoretical peak)"
        )
    if goodput:
        badput = ", ".join(
            f"{k} {v:.1f} s" for k, v in sorted(goodput.get("badputSeconds", {}).items()) if v
        )
        print(
            f"  goodput {goodput.get('fraction', 0):.2%} of {goodput.get('wallSeconds')} s; "
            f"badput: {badput}"
        )
    print()
    print("Where to look (everything keeps running):")
    print(f"  Prometheus  {prometheus.url}   alerts: {prometheus.url}/alerts")
    print("              e.g. tpu_worker_step, rate(tpu_worker_tokens_total[1m]),")
    print("              tpu_operator_job_goodput, tpu_operator_jobs")
    print(f"  Dashboards  {REPO / 'charts/tpu-operator/dashboards'} (Grafana JSON)")
    print(f"  kubectl     export KUBECONFIG={cluster.kubeconfig}")
    print(f"              {kubectl} get tpujobs,tpuslices,pods")
    print(f"              {kubectl} describe tpujob demo")
    if operator_logs:
        print(f"  Operator    {operator_logs[-1]}")
    print(f"  Workers     {CLUSTER_DIR}/pods/default/demo-*/worker.log")
    print(f"  Control     {cluster.logs_dir}/")
    print("  Stop        make demo-down   (python -m localcluster.demo down)")


def up(timeout: float) -> int:
    started = time.monotonic()
    say(1, "control plane and helm binaries (built from Go modules once, then cached)")
    binaries.ensure_all((*binaries.CONTROL_PLANE, binaries.HELM))
    say(2, "Prometheus (Debian package)")
    subprocess.run(["sh", str(REPO / "scripts" / "ensure-prometheus.sh")], check=True)
    down()
    DEMO_DIR.mkdir(exist_ok=True)
    say(3, f"local cluster with simulated TPU node pools in {CLUSTER_DIR}")
    cluster = Cluster.start(CLUSTER_DIR, detach=True, fresh=True)
    say(4, "operator image: built from ./Dockerfile with buildah (cached), run by podman")
    helm = Helm(cluster.kubeconfig)
    # The chart's default command until the image's is known.
    values = chart_values(["tpu-operator"], monitors=False)
    command = operator_command(cluster, helm, values)
    say(
        5,
        f"helm install {RELEASE} (namespace {RELEASE_NAMESPACE}); the operator runs in the "
        "cluster as the chart's ServiceAccount",
    )
    helm.install({**values, "command": command}, release=RELEASE, namespace=RELEASE_NAMESPACE)
    say(6, "Prometheus scraping the operator and the workers through the chart's monitors")
    prometheus = start_prometheus(cluster, helm, command)
    say(7, f"kubectl apply -f {EXAMPLE.relative_to(REPO)}: 4 JAX processes on two v5p slices")
    if CHECKPOINTS.exists():
        print(f"[demo] removing an earlier demo's checkpoints in {CHECKPOINTS}", flush=True)
        shutil.rmtree(CHECKPOINTS)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    status = follow(cluster, timeout)
    summary(cluster, status, prometheus, time.monotonic() - started)
    return 0 if status.get("phase") == "Succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.demo", description=__doc__)
    parser.add_argument("command", nargs="?", default="up", choices=["up", "down"])
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the job")
    args = parser.parse_args(argv)
    return up(args.timeout) if args.command == "up" else down()


if __name__ == "__main__":
    raise SystemExit(main())
