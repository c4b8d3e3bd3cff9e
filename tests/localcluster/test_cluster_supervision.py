"""Supervision: a component killed from outside is started again, as a kubelet restarts a
control plane's static pods, and the cluster works on; one stopped on purpose through
``kill_component`` stays down until ``start_component``. On the session cluster (as the
tests start it) and on a detached one (``python -m localcluster up``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster
from localcluster.api import SyncApi
from localcluster.layout import Layout, read_state, recorded_processes
from localcluster.procs import ProcessRecord
from localcluster.testing import pod, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOWHERE = {"localcluster.tpu-operator.dev/test": "no-such-node"}
"""A node selector no node matches: pods that are created but never run."""


def _record(layout: Layout, name: str) -> ProcessRecord:
    return recorded_processes(read_state(layout))[name]


def _sigkill(layout: Layout, name: str) -> ProcessRecord:
    """SIGKILL a component from outside (no fault API) and wait until it is gone."""
    record = _record(layout, name)
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not record.alive(), timeout=10, message=f"{name} to die")
    return record


def _replaced(layout: Layout, name: str, old: ProcessRecord) -> ProcessRecord | None:
    record = _record(layout, name)
    return record if record != old and record.alive() else None


def _node_of(api: SyncApi, namespace: str, name: str) -> str | None:
    return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["spec"].get("nodeName")


def _create_pod(api: SyncApi, namespace: str, name: str) -> None:
    api.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod(name, ["sleep", "600"]))


def test_a_killed_scheduler_is_started_again_and_schedules(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    old = _sigkill(cluster.layout, "kube-scheduler")
    _create_pod(api, namespace, "after-kill")
    node = wait_until(
        lambda: _node_of(api, namespace, "after-kill"),
        timeout=120,
        message="a pod created after the scheduler was killed to be scheduled",
    )
    assert node
    assert _replaced(cluster.layout, "kube-scheduler", old), "a new kube-scheduler runs"
    assert read_state(cluster.layout)["restarts"]["kube-scheduler"] >= 1


def test_a_killed_controller_manager_is_started_again_and_reconciles(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    old = _sigkill(cluster.layout, "kube-controller-manager")
    labels = {"app": "after-kill"}
    template = pod(
        "ignored",
        ["sleep", "600"],
        labels=labels,
        restart_policy="Always",
        spec={"nodeSelector": NOWHERE},
    )
    del template["metadata"]["name"]
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "after-kill"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    api.call("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", replicaset)

    def owned() -> list[str]:
        pods = api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3Dafter-kill")
        return [
            p["metadata"]["name"]
            for p in pods["items"]
            if any(o["name"] == "after-kill" for o in p["metadata"].get("ownerReferences", []))
        ]

    created = wait_until(
        lambda: len(owned()) == 2 and owned(),
        timeout=120,
        message="the ReplicaSet controller to create the pods of a ReplicaSet created after "
        "the controller-manager was killed",
    )
    assert len(created) == 2
    assert _replaced(cluster.layout, "kube-controller-manager", old)


def _supervisor_log(
    cluster: Cluster, captured: list[str], capfd: pytest.CaptureFixture[str]
) -> str:
    """What supervision logged so far: this process's stderr (a foreground cluster) or
    ``logs/supervisor.log`` (an attached detached one)."""
    captured.append(capfd.readouterr().err)
    path = cluster.logs_dir / "supervisor.log"
    return "".join(captured) + (path.read_text() if path.exists() else "")


def test_a_component_stopped_on_purpose_stays_down_until_started(
    api: SyncApi, cluster: Cluster, namespace: str, capfd: pytest.CaptureFixture[str]
) -> None:
    captured: list[str] = []
    old = _record(cluster.layout, "kube-scheduler")
    argv = cluster.kill_component("kube-scheduler")
    try:
        assert "kube-scheduler" in argv[0]
        held = "kube-scheduler exited with code 137 (SIGKILL) after"
        wait_until(
            lambda: any(
                held in line and "stopped on purpose, not restarted" in line
                for line in _supervisor_log(cluster, captured, capfd).splitlines()
            ),
            timeout=30,
            message="supervision to see the deliberate stop and leave it",
        )
        _create_pod(api, namespace, "while-held")
        assert not old.alive()
        assert _record(cluster.layout, "kube-scheduler") == old, "nothing started it again"
        assert cluster.status()["processes"]["kube-scheduler"]["held"] is True
        assert _node_of(api, namespace, "while-held") is None
    finally:
        cluster.start_component("kube-scheduler")
    assert _replaced(cluster.layout, "kube-scheduler", old)
    wait_until(
        lambda: _node_of(api, namespace, "while-held"),
        timeout=120,
        message="the pod to be scheduled once the scheduler is started again",
    )


# Detached: the process that started the cluster is gone ---------------------------------


@pytest.fixture
def detached(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "c"
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: cpu, vms: 1}\n")
    up = _cli("up", directory, f"--pools={pools}")
    assert up.returncode == 0, up.stderr
    try:
        yield directory
    finally:
        _cli("down", directory)


def _cli(command: str, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcluster", command, f"--dir={directory}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _state(directory: Path) -> dict[str, Any]:
    return read_state(Layout(directory)) or {}


def test_a_detached_cluster_restarts_a_killed_scheduler_and_stops_cleanly(
    detached: Path,
) -> None:
    layout = Layout(detached)
    api = Cluster.attach(detached).api()
    old = _sigkill(layout, "kube-scheduler")
    _create_pod(api, "default", "after-kill")
    wait_until(
        lambda: _node_of(api, "default", "after-kill"),
        timeout=120,
        message="a pod created after the scheduler was killed to be scheduled",
    )
    assert _replaced(layout, "kube-scheduler", old)
    state = _state(detached)
    daemon = ProcessRecord.from_json(state["supervisor"])
    assert state["mode"] == "detached" and daemon.alive(), "a daemon outlives `up`"
    log = (layout.logs / "supervisor.log").read_text()
    assert "kube-scheduler exited with code 137 (SIGKILL)" in log and "restarting in 0 s" in log

    # Without its daemon the cluster runs on unsupervised, and `down` still stops it.
    os.kill(daemon.pid, signal.SIGKILL)
    wait_until(lambda: not daemon.alive(), timeout=10, message="the daemon to die")
    records = recorded_processes(_state(detached))
    assert all(record.alive() for record in records.values())
    down = _cli("down", detached)
    assert down.returncode == 0, down.stderr
    assert not any(record.alive() for record in records.values())
    assert _state(detached)["status"] == "stopped"
