"""Fault injection through the node agent, observed through the real control plane."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import AgentError, Cluster, Pool
from localcluster.api import SyncApi
from localcluster.pools import POOL_LABEL
from localcluster.testing import pod, wait_until

pytestmark = pytest.mark.integration

TRAP = (
    "import signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('got SIGTERM', flush=True); time.sleep(1); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('started', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[str]:
    """A private one-VM CPU pool, so faults never touch the shared default nodes."""
    name = f"fault-{uuid.uuid4().hex[:6]}"
    cluster.agent.add_pool(Pool(name=name, vms=1))
    try:
        yield name
    finally:
        try:
            cluster.agent.remove_pool(name)
        except AgentError as error:
            if error.status != 404:
                raise


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def _get(api: SyncApi, namespace: str, name: str) -> dict[str, Any]:
    return api.get(f"{_pods(namespace)}/{name}")


def _ready(api: SyncApi, node: str) -> dict[str, Any]:
    conditions = api.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "Ready")


def _start(api: SyncApi, cluster: Cluster, namespace: str, pool: str, name: str) -> int:
    """Run the SIGTERM-trapping sleeper on ``pool``; return its process id."""
    manifest = pod(
        name, ["python", "-c", TRAP], grace=10, spec={"nodeSelector": {POOL_LABEL: pool}}
    )
    api.call("POST", _pods(namespace), manifest)
    wait_until(
        lambda: _get(api, namespace, name)["status"].get("phase") == "Running",
        timeout=60,
        message=f"{name} to run",
    )
    log = cluster.pod_log(namespace, name, "main")
    wait_until(lambda: "started" in log.read_text(), timeout=30, message=f"{name} to print")
    entry = next(p for p in cluster.agent.status()["pods"] if p["name"] == name)
    return int(entry["processes"]["main"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def test_kill_pod_reports_the_given_exit_code(
    api: SyncApi, cluster: Cluster, namespace: str, pool: str
) -> None:
    pid = _start(api, cluster, namespace, pool, "victim")
    assert cluster.agent.kill_pod(namespace, "victim", exit_code=42) == ["main"]
    done = wait_until(
        lambda: (p := _get(api, namespace, "victim"))["status"]["phase"] == "Failed" and p,
        timeout=30,
        message="victim to fail",
    )
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (42, "Error")
    assert "got SIGTERM" not in cluster.pod_log(namespace, "victim", "main").read_text()
    wait_until(lambda: not _alive(pid), timeout=10, message="the process to be gone")


def test_partitioned_node_keeps_processes_until_force_delete(
    api: SyncApi, cluster: Cluster, namespace: str, pool: str
) -> None:
    node = f"{pool}-0"
    pid = _start(api, cluster, namespace, pool, "island")
    cluster.agent.partition_node(node)
    ready = _ready(api, node)
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
    wait_until(
        lambda: any(
            t["key"] == "node.kubernetes.io/unreachable"
            for t in api.get(f"/api/v1/nodes/{node}")["spec"].get("taints", [])
        ),
        timeout=30,
        message="the node-lifecycle controller to taint the node unreachable",
    )
    assert _alive(pid), "a partition must not stop the pod's processes"
    assert _get(api, namespace, "island")["status"]["phase"] == "Running"

    # A graceful delete is not seen by a partitioned kubelet: the process keeps running.
    api.call("DELETE", f"{_pods(namespace)}/island")
    assert _alive(pid)
    # A force delete removes the object; the agent then kills the process.
    api.call("DELETE", f"{_pods(namespace)}/island", {"gracePeriodSeconds": 0})
    wait_until(lambda: not _alive(pid), timeout=15, message="the force-deleted pod's process")

    cluster.agent.heal_node(node)
    wait_until(
        lambda: _ready(api, node)["status"] == "True", timeout=30, message="the node to heal"
    )


def test_not_ready_node_reports_ready_false_and_heals(
    api: SyncApi, cluster: Cluster, pool: str
) -> None:
    node = f"{pool}-0"
    cluster.agent.make_node_not_ready(node, "runtime down for a test")
    ready = _ready(api, node)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "KubeletNotReady",
        "runtime down for a test",
    )
    wait_until(
        lambda: any(
            t["key"] == "node.kubernetes.io/not-ready"
            for t in api.get(f"/api/v1/nodes/{node}")["spec"].get("taints", [])
        ),
        timeout=30,
        message="the node-lifecycle controller to taint the node not-ready",
    )
    cluster.agent.heal_node(node)
    assert _ready(api, node)["status"] == "True"
    wait_until(
        lambda: (
            not any(
                t["key"].startswith("node.kubernetes.io/")
                for t in api.get(f"/api/v1/nodes/{node}")["spec"].get("taints", [])
            )
        ),
        timeout=30,
        message="the not-ready taint to be removed after healing",
    )


def test_delete_node_kills_its_processes(
    api: SyncApi, cluster: Cluster, namespace: str, pool: str
) -> None:
    node = f"{pool}-0"
    pid = _start(api, cluster, namespace, pool, "preempted")
    cluster.agent.delete_node(node)
    assert api.request("GET", f"/api/v1/nodes/{node}")[0] == 404
    wait_until(lambda: not _alive(pid), timeout=10, message="the VM's processes to be gone")
    assert "got SIGTERM" not in cluster.pod_log(namespace, "preempted", "main").read_text()


def test_graceful_node_shutdown_marks_pods_disrupted(
    api: SyncApi, cluster: Cluster, namespace: str, pool: str
) -> None:
    node = f"{pool}-0"
    pid = _start(api, cluster, namespace, pool, "shutdown")
    cluster.agent.delete_node(node, graceful=True)
    assert not _alive(pid)
    current = _get(api, namespace, "shutdown")
    assert current["status"]["phase"] == "Failed"
    disruption = next(c for c in current["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert disruption["reason"] == "TerminationByKubelet"
    assert "got SIGTERM" in cluster.pod_log(namespace, "shutdown", "main").read_text()
    assert api.request("GET", f"/api/v1/nodes/{node}")[0] == 404


def test_evict_pod_adds_disruption_target_and_terminates(
    api: SyncApi, cluster: Cluster, namespace: str, pool: str
) -> None:
    pid = _start(api, cluster, namespace, pool, "evictee")
    cluster.agent.evict_pod(namespace, "evictee")
    current = _get(api, namespace, "evictee")
    assert current["metadata"].get("deletionTimestamp")
    disruption = next(c for c in current["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert disruption["reason"] == "EvictionByEvictionAPI"
    wait_until(
        lambda: api.request("GET", f"{_pods(namespace)}/evictee")[0] == 404,
        timeout=30,
        message="the evicted pod to be deleted",
    )
    assert not _alive(pid)
    assert "got SIGTERM" in cluster.pod_log(namespace, "evictee", "main").read_text()


def test_fault_on_unknown_pod_is_a_clear_error(cluster: Cluster, namespace: str) -> None:
    with pytest.raises(AgentError, match="not found"):
        cluster.agent.kill_pod(namespace, "nobody", exit_code=1)
