"""The real scheduler places pods on the simulated TPU nodes; the agent runs them."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster import Cluster
from localcluster.api import SyncApi
from localcluster.pools import ACCELERATOR_LABEL, TPU_RESOURCE
from localcluster.testing import pod, tpu_pod, wait_until

pytestmark = pytest.mark.integration


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def _get(api: SyncApi, namespace: str, name: str) -> dict[str, Any]:
    return api.get(f"{_pods(namespace)}/{name}")


def _terminal(api: SyncApi, namespace: str, name: str) -> dict[str, Any] | None:
    current = _get(api, namespace, name)
    return current if current["status"].get("phase") in ("Succeeded", "Failed") else None


def _unschedulable(api: SyncApi, namespace: str, name: str) -> dict[str, Any] | None:
    for condition in _get(api, namespace, name)["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return condition
    return None


def test_tpu_pod_is_scheduled_run_and_succeeds(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    manifest = tpu_pod(
        "tpu-ok",
        ["python", "-c", "import os; print('worker', os.environ['TPU_NAME'])"],
        accelerator="tpu-v5-lite-podslice",
        topology="2x4",
        env={"TPU_NAME": "slice-a"},
    )
    api.call("POST", _pods(namespace), manifest)
    done = wait_until(
        lambda: _terminal(api, namespace, "tpu-ok"), timeout=60, message="tpu-ok to finish"
    )

    node = api.get(f"/api/v1/nodes/{done['spec']['nodeName']}")
    assert node["metadata"]["labels"][ACCELERATOR_LABEL] == "tpu-v5-lite-podslice"
    assert node["metadata"]["labels"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert done["status"]["phase"] == "Succeeded"
    state = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (0, "Completed")
    assert done["status"]["podIP"].startswith("127.") and done["status"]["podIP"] != "127.0.0.1"
    assert done["status"]["hostIP"] == next(
        a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"
    )
    assert "worker slice-a" in cluster.pod_log(namespace, "tpu-ok", "main").read_text()


def test_pod_without_toleration_never_lands_on_a_tpu_node(api: SyncApi, namespace: str) -> None:
    plain = pod("plain", ["sleep", "60"])
    wants_tpu = pod(
        "no-toleration",
        ["sleep", "60"],
        container={"resources": {"limits": {TPU_RESOURCE: "4"}, "requests": {TPU_RESOURCE: "4"}}},
    )
    api.call("POST", _pods(namespace), plain)
    api.call("POST", _pods(namespace), wants_tpu)

    condition = wait_until(
        lambda: _unschedulable(api, namespace, "no-toleration"),
        timeout=30,
        message="no-toleration to be reported Unschedulable",
    )
    assert "untolerated taint" in condition["message"]
    assert "google.com/tpu" in condition["message"]
    placed = wait_until(
        lambda: _get(api, namespace, "plain")["spec"].get("nodeName"),
        timeout=30,
        message="the plain pod to be scheduled",
    )
    labels = api.get(f"/api/v1/nodes/{placed}")["metadata"]["labels"]
    assert ACCELERATOR_LABEL not in labels
    assert _get(api, namespace, "no-toleration")["spec"].get("nodeName") is None


def test_more_tpu_pods_than_chips_stay_pending(api: SyncApi, namespace: str) -> None:
    # Pool v5e-2x2 has 2 VMs x 4 chips: two 4-chip pods fit, the third does not.
    names = [f"chip-eater-{i}" for i in range(3)]
    for name in names:
        manifest = tpu_pod(
            name,
            ["sleep", "120"],
            accelerator="tpu-v5-lite-podslice",
            topology="2x2",
            pool="v5e-2x2",
            grace=1,
        )
        api.call("POST", _pods(namespace), manifest)

    def phases() -> dict[str, str] | None:
        current = {n: _get(api, namespace, n)["status"].get("phase", "") for n in names}
        running = [n for n, phase in current.items() if phase == "Running"]
        return current if len(running) == 2 else None

    wait_until(phases, timeout=60, message="two of the three pods to run")
    pending = [n for n in names if _get(api, namespace, n)["status"].get("phase") == "Pending"]
    assert len(pending) == 1
    condition = wait_until(
        lambda: _unschedulable(api, namespace, pending[0]),
        timeout=30,
        message=f"{pending[0]} to be reported Unschedulable",
    )
    assert "Insufficient google.com/tpu" in condition["message"]
    nodes = {_get(api, namespace, n)["spec"]["nodeName"] for n in names if n not in pending}
    assert nodes == {"v5e-2x2-0", "v5e-2x2-1"}
