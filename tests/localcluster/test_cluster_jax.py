"""Two JAX processes, run by the agent as pods, rendezvous by DNS name and all-gather."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from localcluster import Cluster
from localcluster.api import SyncApi
from localcluster.testing import tpu_pod, wait_until

pytestmark = pytest.mark.integration
pytest.importorskip("jax")

WORKER = textwrap.dedent(
    """
    import os, socket, time
    coordinator = os.environ["COORDINATOR"]
    for _ in range(600):  # the coordinator's name resolves once its pod has an IP
        try:
            socket.gethostbyname(coordinator)
            break
        except OSError:
            time.sleep(0.1)
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    process_id = int(os.environ["PROCESS_ID"])
    jax.distributed.initialize(
        coordinator_address=f"{coordinator}:8482",
        num_processes=2,
        process_id=process_id,
        coordinator_bind_address=f"{os.environ['POD_IP']}:8482",
        initialization_timeout=120,
    )
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(jnp.array([process_id + 1]))
    print("allgather", sorted(int(v) for v in gathered.ravel()), flush=True)
    jax.distributed.shutdown()
    """
)


def test_jax_processes_rendezvous_by_pod_dns_names(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "jax"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"j": "x"}},
    }
    api.call("POST", f"/api/v1/namespaces/{namespace}/services", service)
    for index in range(2):
        manifest = tpu_pod(
            f"w-{index}",
            ["python", "-c", WORKER],
            accelerator="tpu-v5-lite-podslice",
            topology="2x4",
            labels={"j": "x"},
            spec={"hostname": f"w-{index}", "subdomain": "jax"},
            container={
                "env": [
                    {"name": "COORDINATOR", "value": "w-0.jax"},
                    {"name": "PROCESS_ID", "value": str(index)},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ]
            },
        )
        api.call("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)

    def finished(name: str) -> dict[str, Any] | None:
        current = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return current if current["status"].get("phase") in ("Succeeded", "Failed") else None

    for name in ("w-0", "w-1"):
        done = wait_until(lambda name=name: finished(name), timeout=180, message=f"{name}")
        log = cluster.pod_log(namespace, name, "main").read_text()
        assert done["status"]["phase"] == "Succeeded", log
        assert "allgather [1, 2]" in log
