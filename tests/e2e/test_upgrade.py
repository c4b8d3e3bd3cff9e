"""Upgrading a running installation: the previous release's chart, CRDs and operator image
(localcluster.previous) installed, a multi-slice job training on real JAX processes, then
the CRDs applied and the chart upgraded as docs/operations/upgrade.md says.

What must hold: the job's pods are the same pods (same UIDs, no container restarted), no
gang restart is counted, the status the old operator wrote is all there, the job keeps
training under the new operator, the object the old version stored reads as valid in the
new one (its new fields defaulted by the new CRD's schema), neither operator logs a
traceback, and at no sampled moment do two replicas lead.
"""

from __future__ import annotations

import json
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import images, previous
from localcluster.helm import CHART, values_file
from localcluster.testing import wait_until
from tests.e2e.conftest import RELEASE, RELEASE_NAMESPACE, ReleaseHelm
from tests.operator.support import Api, read_metrics
from tpu_operator import contract

pytestmark = pytest.mark.e2e
REPO = CHART.parents[1]
OPERATOR_SELECTOR = "app.kubernetes.io/name=tpu-operator"
LEADER_GAUGE = "tpu_operator_leader"
# Status fields that describe the job's run so far: an upgrade leaves them as they are.
KEPT = (
    "phase",
    "attempt",
    "restarts",
    "countedRestarts",
    "restartsByReason",
    "inPlaceRestarts",
    "runningSince",
    "startTime",
    "nodePools",
    "shape",
    "observedGeneration",
)


def demo_job(namespace: str) -> dict[str, Any]:
    """examples/local-demo.yaml (two v5p slices of two VMs: four JAX processes), training
    long enough to run across the upgrade and checkpointing early."""
    manifest = yaml.safe_load((REPO / "examples" / "local-demo.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    container["args"] = [
        "--steps=1000000" if a.startswith("--steps=") else a
        for a in container["args"]
        if not a.startswith("--checkpoint-every=")
    ] + ["--checkpoint-every=10"]
    return manifest


def crds_apply(cluster, directory: Path) -> None:
    """The documented CRD upgrade: server-side apply of the release's crds/ directory."""
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(directory), timeout=120
    )
    for path in sorted(directory.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", timeout=60)


def operator_pods(cluster) -> list[dict[str, Any]]:
    """Every operator pod with an IP, terminating ones included (they may still act)."""
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", RELEASE_NAMESPACE, "-l", OPERATOR_SELECTOR, "-o", "json"
        ).stdout
    )["items"]
    return [p for p in pods if p["status"].get("podIP")]


def lease_holder(cluster) -> str:
    lease = json.loads(
        cluster.kubectl("get", "lease", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout
    )
    return (lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]


def leader_gauge(url: str, token: str) -> float | None:
    """A replica's ``tpu_operator_leader``, or None when its metrics do not answer."""
    try:
        text = read_metrics(url, token)
    except (OSError, urllib.error.URLError):
        return None
    for line in text.splitlines():
        if line.startswith(LEADER_GAUGE + " "):
            return float(line.split()[1])
    return None


class LeaderSampler:
    """Samples every operator replica's leader gauge until stopped.

    A sample reads each replica twice, in the same order. A replica counts as leading in
    the sample only when both reads say 1: a deposed leader exits, so it led throughout
    the time between its two reads; two replicas counted so led at one moment (the first
    one's interval holds the second one's first read). A handover between two reads is
    not counted as two leaders.
    """

    def __init__(self, cluster, port: int, token: str) -> None:
        self.cluster, self.port, self.token = cluster, port, token
        self.samples: list[set[str]] = []
        self.both: list[set[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-sampler", daemon=True)

    def __enter__(self) -> LeaderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = operator_pods(self.cluster)
            except Exception:  # the apiserver busy: sample again
                self._stop.wait(0.5)
                continue
            urls = {
                p["metadata"]["name"]: f"https://{p['status']['podIP']}:{self.port}/metrics"
                for p in pods
            }
            first = {name: leader_gauge(url, self.token) for name, url in urls.items()}
            second = {name: leader_gauge(url, self.token) for name, url in urls.items()}
            leading = {n for n in urls if first[n] == 1 and second[n] == 1}
            self.samples.append(leading)
            if len(leading) > 1:
                self.both.append(leading)
            self._stop.wait(0.3)


@pytest.fixture(scope="module")
def previous_image() -> images.ImageConfig:
    return previous.operator_image()


@pytest.fixture(scope="module")
def previous_values(
    cluster, chart_values: dict[str, Any], previous_image: images.ImageConfig
) -> Iterator[dict[str, Any]]:
    """The e2e values with the previous operator image as the container's command."""
    old = ReleaseHelm(cluster.kubeconfig, chart=previous.chart())
    deployment = next(d for d in old.template(chart_values) if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = [
        *images.podman_command(),
        *images.pod_run_arguments(previous_image, container, cluster.directory),
    ]
    yield {**chart_values, "command": command}
    images.remove_cluster_containers(cluster.directory)


def test_upgrade_keeps_the_running_job_and_its_status(
    cluster,
    helm: ReleaseHelm,
    monitoring_crds,
    previous_values,
    release_values,
    prometheus_token,
    namespace,
):
    tpu = Api(cluster)
    old_chart = previous.chart()
    # The previous release as installed: its CRDs (helm installs crds/ only when missing,
    # and earlier tiers may have applied today's), its chart and its operator image.
    crds_apply(cluster, previous.crds())
    helm(
        "install",
        RELEASE,
        str(old_chart),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--values",
        values_file(previous_values),
        "--wait",
        "--timeout",
        "300s",
    )
    try:
        run_across_upgrade(cluster, helm, tpu, namespace, release_values, prometheus_token)
    finally:
        cluster.kubectl(
            "delete", "tpujobs,tpuslices", "--all", "-n", namespace, "--wait=true", timeout=180
        )
        helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", check=False)
        # Today's CRDs for whatever runs next.
        crds_apply(cluster, CHART / "crds")


def run_across_upgrade(cluster, helm, tpu: Api, namespace, release_values, token) -> None:
    old_pods = wait_until(
        lambda: len(ps := [p for p in operator_pods(cluster) if is_running(p)]) == 2 and ps,
        timeout=120,
        message="the previous release's two operator pods",
    )
    old_names = {p["metadata"]["name"] for p in old_pods}
    wait_until(lambda: lease_holder(cluster) in old_names, timeout=120, message="a leader")

    tpu.apply(demo_job(namespace))
    worker_log = cluster.pod_log(namespace, "demo-0-0", "worker")
    wait_until(
        lambda: worker_log.exists() and "checkpoint saved at step" in worker_log.read_text(),
        timeout=600,
        message="the demo's first checkpoint",
    )
    wait_until(
        lambda: (tpu.status(namespace, "demo").get("progress") or {}).get("step"),
        timeout=120,
        message="the old operator to report the demo's progress",
    )
    before_status = tpu.status(namespace, "demo")
    assert before_status["phase"] == "Running" and before_status["attempt"] == 1
    assert sorted(before_status["nodePools"]) == ["v5p-a", "v5p-b"]
    before_pods = worker_pods(tpu, namespace)
    assert len(before_pods) == 4
    assert all(p["restarts"] == 0 for p in before_pods.values())
    before_slices = {s["metadata"]["name"]: s["metadata"]["uid"] for s in tpu.slices(namespace)}

    port = release_values["operator"]["metricsPort"]
    with LeaderSampler(cluster, port, token) as sampler:
        # The documented order: today's CRDs first (helm upgrade never touches crds/), then
        # the chart with today's operator.
        crds_apply(cluster, CHART / "crds")
        # The object the old version stored reads in the new schema with today's fields
        # defaulted (while the old operator still runs, which ignores fields it lacks).
        stored = tpu.job(namespace, "demo")
        assert stored["spec"]["failurePolicy"]["maxSliceFailuresPerPool"] == 3
        assert [s.get("failures") for s in stored["status"]["slices"]] == [0, 0]
        helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--values",
            values_file(release_values),
            "--wait",
            "--timeout",
            "300s",
        )
        new_pods = wait_until(
            lambda: (
                len(ps := operator_pods(cluster)) == 2
                and all(is_running(p) for p in ps)
                and not {p["metadata"]["name"] for p in ps} & old_names
                and ps
            ),
            timeout=180,
            message="the two upgraded operator pods (and the old ones gone)",
        )
        new_names = {p["metadata"]["name"] for p in new_pods}
        leader = wait_until(
            lambda: (holder := lease_holder(cluster)) in new_names and holder,
            timeout=120,
            message="an upgraded pod to hold the Lease",
        )
        leader_log = cluster.pod_log(RELEASE_NAMESPACE, leader, "operator")
        wait_until(
            lambda: "acting as the leader" in leader_log.read_text(),
            timeout=120,
            message="the upgraded leader to act",
        )
        # The new operator reports the job's progress: it read the old object and the
        # workers train on.
        acting_step = tpu.status(namespace, "demo")["progress"]["step"]
        wait_until(
            lambda: tpu.status(namespace, "demo")["progress"]["step"] > acting_step,
            timeout=300,
            message="the demo's step to advance under the upgraded operator",
        )
        # A few samples with the new leader in place.
        seen = len(sampler.samples)
        wait_until(lambda: len(sampler.samples) >= seen + 3, timeout=60, message="samples")

    # Never two replicas leading; the sampler did see the old and then a new leader.
    assert not sampler.both, sampler.both
    leaders = [s for s in sampler.samples if s]
    assert any(s <= old_names for s in leaders), "no sample with the old leader"
    assert any(s <= new_names for s in leaders), "no sample with an upgraded leader"

    # The same pods, no container restarted, no gang restart counted, the status kept.
    after_pods = worker_pods(tpu, namespace)
    after_status = tpu.status(namespace, "demo")
    print(
        f"worker pods before {len(before_pods)}, after {len(after_pods)}, the same UIDs "
        f"{after_pods == before_pods}; container restarts "
        f"{sum(p['restarts'] for p in after_pods.values())}; step "
        f"{before_status['progress']['step']} -> {after_status['progress']['step']}; leader "
        f"samples {len(sampler.samples)}, with two leaders {len(sampler.both)}"
    )
    assert after_pods == before_pods
    assert set(before_status) <= set(after_status), set(before_status) - set(after_status)
    for key in KEPT:
        before, after = before_status.get(key), after_status.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            # Kept as it was; a field the new version adds (status.shape.machineType) may
            # join it.
            assert before.items() <= after.items(), (key, before, after)
        else:
            assert after == before, key
    assert after_status["progress"]["step"] > before_status["progress"]["step"]
    assert {s["metadata"]["name"]: s["metadata"]["uid"] for s in tpu.slices(namespace)} == (
        before_slices
    )

    # The object the old version stored reads as valid in the new one: today's fields
    # come defaulted from the new CRD's schema, and nothing found the spec invalid.
    job = tpu.job(namespace, "demo")
    assert job["spec"]["failurePolicy"]["maxSliceFailuresPerPool"] == 3
    assert [s.get("failures") for s in after_status["slices"]] == [0, 0], after_status
    assert [(s["name"], s.get("nodePool")) for s in after_status["slices"]] == [
        (s["name"], s.get("nodePool")) for s in before_status["slices"]
    ]
    reasons = {e["reason"] for e in tpu.events(namespace, "demo")}
    assert "InvalidSpec" not in reasons, reasons
    conditions = {c["type"]: c for c in after_status.get("conditions") or []}
    assert "InvalidSpec" not in json.dumps(conditions)

    # No traceback in either version's operator logs; no operator container restarted.
    for name in old_names | new_names:
        text = cluster.pod_log(RELEASE_NAMESPACE, name, "operator").read_text()
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
    assert all(
        c.get("restartCount", 0) == 0
        for p in operator_pods(cluster)
        for c in p["status"].get("containerStatuses") or []
    )


def is_running(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def worker_pods(tpu: Api, namespace: str) -> dict[str, dict[str, Any]]:
    """name -> uid and restart count of the demo's worker pods."""
    return {
        p["metadata"]["name"]: {
            "uid": p["metadata"]["uid"],
            "restarts": sum(
                c.get("restartCount", 0) for c in p["status"].get("containerStatuses") or []
            ),
        }
        for p in tpu.pods(namespace, f"{contract.LABEL_JOB_NAME}=demo")
    }
