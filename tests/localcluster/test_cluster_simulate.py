"""Simulate-mode pools: kubelet-shaped status without processes, at scale."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from localcluster import Cluster, Pool, Simulate
from localcluster.agent.simulate import COMPLETE_AFTER_ANNOTATION, EXIT_CODE_ANNOTATION
from localcluster.api import SyncApi
from localcluster.pools import POOL_LABEL
from localcluster.testing import tpu_pod, wait_until

pytestmark = pytest.mark.integration

VMS = 256  # v5p 8x8x16: 1024 chips, 4 per VM
STARTED = ("Running", "Succeeded", "Failed")


def _phases(api: SyncApi, namespace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        phase = item["status"].get("phase", "")
        counts[phase] = counts.get(phase, 0) + 1
    return counts


def test_simulated_256_host_slice_runs_and_completes(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    name = f"sim-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    nodes = cluster.agent.add_pool(
        Pool(
            name=name,
            accelerator="tpu-v5p-slice",
            topology="8x8x16",
            vms=VMS,
            mode="simulate",
            simulate=Simulate(complete_after=None),
        )
    )
    registered = time.monotonic() - began
    try:
        assert len(nodes) == VMS
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{nodes[-1]}"
        first_renewal = api.get(lease_path)["spec"]["renewTime"]
        pods = []
        for index in range(VMS):
            manifest = tpu_pod(
                f"w-{index}",
                ["never-run"],
                accelerator="tpu-v5p-slice",
                topology="8x8x16",
                pool=name,
                spec={"hostname": f"w-{index}", "subdomain": "job"},
            )
            manifest["metadata"]["annotations"] = {
                COMPLETE_AFTER_ANNOTATION: "3",
                EXIT_CODE_ANNOTATION: "0" if index else "7",
            }
            pods.append(manifest)
        began = time.monotonic()
        cluster.kubectl(
            f"--namespace={namespace}",
            "create",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
            timeout=120,
        )
        # Pods complete 3 s after they start, so "started" is Running or already done.
        wait_until(
            lambda: sum(_phases(api, namespace).get(p, 0) for p in STARTED) == VMS,
            timeout=120,
            message=lambda: f"{VMS} simulated pods started (now {_phases(api, namespace)})",
        )
        running = time.monotonic() - began
        listing: list[dict[str, Any]] = api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        ips = {p["status"]["podIP"] for p in listing}
        assert len(ips) == VMS, "every pod gets its own IP"
        assert {p["spec"]["nodeName"] for p in listing} <= set(nodes)
        wait_until(
            lambda: _phases(api, namespace) == {"Succeeded": VMS - 1, "Failed": 1},
            timeout=60,
            message=lambda: f"completion (now {_phases(api, namespace)})",
        )
        failed = api.get(f"/api/v1/namespaces/{namespace}/pods/w-0")["status"]
        assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
        wait_until(
            lambda: api.get(lease_path)["spec"]["renewTime"] != first_renewal,
            timeout=30,
            message="the lease of a simulated node to be renewed",
        )
        api.call(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods?labelSelector=",
        )
        wait_until(
            lambda: not api.get(f"/api/v1/namespaces/{namespace}/pods")["items"],
            timeout=60,
            message="deleted simulated pods to be gone",
        )
        print(
            f"\n{VMS} nodes registered in {registered:.1f} s; {VMS} pods started in {running:.1f} s"
        )
    finally:
        cluster.agent.remove_pool(name)
    assert not any(
        n.startswith(name)
        for n in (i["metadata"]["name"] for i in api.get("/api/v1/nodes")["items"])
    )


def test_simulated_pod_runs_until_deleted(api: SyncApi, cluster: Cluster, namespace: str) -> None:
    name = f"simr-{uuid.uuid4().hex[:6]}"
    cluster.agent.add_pool(Pool(name=name, vms=1, mode="simulate"))
    try:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "forever"},
            "spec": {
                "nodeSelector": {POOL_LABEL: name},
                "containers": [{"name": "main", "image": "ignored"}],
            },
        }
        path = f"/api/v1/namespaces/{namespace}/pods"
        api.call("POST", path, manifest)
        current = wait_until(
            lambda: (p := api.get(f"{path}/forever"))["status"].get("phase") == "Running" and p,
            timeout=30,
            message="the simulated pod to run",
        )
        conditions = {c["type"]: c["status"] for c in current["status"]["conditions"]}
        assert conditions["Ready"] == "True"
        assert current["status"]["containerStatuses"][0]["state"]["running"]
        kill = cluster.agent.kill_pod(namespace, "forever", exit_code=3)
        assert kill == ["main"]
        wait_until(
            lambda: api.get(f"{path}/forever")["status"]["phase"] == "Failed",
            timeout=30,
            message="the simulated kill to be reported",
        )
        api.call("DELETE", f"{path}/forever")
        wait_until(
            lambda: api.request("GET", f"{path}/forever")[0] == 404,
            timeout=30,
            message="the simulated pod to be deleted",
        )
    finally:
        cluster.agent.remove_pool(name)
