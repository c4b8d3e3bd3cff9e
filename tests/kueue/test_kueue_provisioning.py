"""Queued provisioning through Kueue's real ProvisioningRequest admission check
(docs/tasks/capacity.md), on a local cluster of its own with no TPU node: the
ProvisioningRequest CRD from the cluster autoscaler's API module is installed before Kueue
starts, the ClusterQueue carries a ``kueue.x-k8s.io/provisioning-request`` AdmissionCheck
(``queued-provisioning.gke.io``, as GKE documents it), and the simulated autoscaler
(localcluster/agent/provisioner.py) serves the requests Kueue makes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Autoprovisioning, Cluster, Pool
from localcluster.kueue import install_provisioning_requests, provisioning_check, tpu_queues
from localcluster.testing import wait_until
from tests.operator.support import Api
from tests.operator.support import job_manifest as manifest
from tpu_operator import contract

pytestmark = pytest.mark.kueue

REPO = Path(__file__).resolve().parents[2]
PROVREQS = "/apis/autoscaling.x-k8s.io/v1/namespaces/{ns}/provisioningrequests"
SETTINGS = Autoprovisioning(delay=2.0, idle=300.0, mode="simulate")
V6E_16 = Pool(name="v6e-4x4", accelerator="tpu-v6e-slice", topology="4x4", vms=4)
V5E_16 = Pool(name="v5e-4x4", accelerator="tpu-v5-lite-podslice", topology="4x4", vms=4)
"""The flex-start test's shape: a flavor of its own, without topology-aware scheduling
(the queued-provisioning tests' flavor has a Topology, which Kueue does not let go)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """This module's own cluster (no TPU node; the autoscaler creates them), with the
    ProvisioningRequest API installed before Kueue starts."""
    cluster = Cluster.start(
        REPO / ".localcluster" / f"test-kueue-provreq-{os.getpid()}",
        pools=[Pool(name="cpu", vms=1)],
        fresh=True,
        autoprovisioning=SETTINGS,
    )
    try:
        install_provisioning_requests(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"kpr-{os.urandom(3).hex()}"
    cluster.api().call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    cluster.api().request("DELETE", f"/api/v1/namespaces/{name}")
    cluster.agent.set_autoprovisioning(SETTINGS)


@pytest.fixture
def dws_queue(cluster: Cluster, kueue, namespace: str) -> Iterator[Callable[[], str]]:
    name = f"cq-{namespace}"

    def make() -> str:
        docs = [
            *provisioning_check(),
            *tpu_queues(
                [V6E_16],
                cluster_queue=name,
                namespaces=[namespace],
                chips=64,
                topology=True,
                admission_checks=["dws-prov"],
            ),
        ]
        kueue.apply(docs)
        return name

    yield make
    cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")


def queued_job(name: str, ns: str, **placement: Any) -> dict[str, Any]:
    job = manifest(
        name,
        ns,
        {"type": "v6e-16"},
        "sleep 3600",
        placement={"capacity": "QueuedProvisioning", **placement},
        failurePolicy={"backoffSeconds": 0},
    )
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tpu"}
    return job


def requests(tpu: Api, ns: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in tpu.raw.get(PROVREQS.format(ns=ns))["items"]}


def true_conditions(request: dict[str, Any]) -> set[str]:
    return {
        c["type"]
        for c in (request.get("status") or {}).get("conditions") or []
        if c["status"] == "True"
    }


def test_kueue_admits_a_queued_job_once_its_request_is_provisioned(
    tpu: Api, namespace: str, dws_queue, operator
):
    dws_queue()
    tpu.apply(queued_job("dws", namespace, maxRunDurationSeconds=3600))
    status = tpu.wait_phase(namespace, "dws", "Running", timeout=120)
    (name,) = requests(tpu, namespace)
    request = requests(tpu, namespace)[name]
    assert request["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert request["spec"]["parameters"] == {"maxRunDurationSeconds": "3600"}
    assert [p["count"] for p in request["spec"]["podSets"]] == [4]
    assert "Provisioned" in true_conditions(request)
    assert status["queue"]["state"] == "Admitted"
    for pod in tpu.pods(namespace):
        annotations = pod["metadata"]["annotations"]
        assert annotations[contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST] == name
        assert annotations[contract.ANNOTATION_PROVISIONING_CLASS] == "queued-provisioning.gke.io"
        assert pod["spec"]["nodeSelector"][contract.NODE_LABEL_QUEUED] == "true"
    (pool,) = status["nodePools"]
    nodes = [
        n
        for n in tpu.raw.get("/api/v1/nodes")["items"]
        if n["metadata"]["labels"].get(contract.NODE_LABEL_NODEPOOL) == pool
    ]
    assert len(nodes) == 4
    assert all(n["metadata"]["labels"][contract.NODE_LABEL_QUEUED] == "true" for n in nodes)
    # The operator made no request of its own: Kueue's is the only one.
    (slice_,) = tpu.slices(namespace)
    assert not (slice_.get("status") or {}).get("provisioningRequest")


def test_kueue_asks_again_after_a_request_fails(
    tpu: Api, namespace: str, dws_queue, operator, cluster: Cluster
):
    cluster.agent.set_autoprovisioning(
        Autoprovisioning(**{**SETTINGS.to_json(), "provisioning_requests": "fail"})
    )
    dws_queue()
    tpu.apply(queued_job("retried", namespace))
    failed = wait_until(
        lambda: [
            r for r, body in requests(tpu, namespace).items() if "Failed" in true_conditions(body)
        ],
        timeout=90,
        message=lambda: f"a failed request: {requests(tpu, namespace)}",
    )
    assert tpu.status(namespace, "retried").get("phase") != "Running"
    cluster.agent.set_autoprovisioning(SETTINGS)
    tpu.wait_phase(namespace, "retried", "Running", timeout=120)
    # Kueue deletes a request it gave up on; the one that was provisioned is a later try.
    made = requests(tpu, namespace)
    (provisioned,) = [r for r, body in made.items() if "Provisioned" in true_conditions(body)]
    assert provisioned not in failed
    assert int(provisioned.rsplit("-", 1)[1]) > min(int(f.rsplit("-", 1)[1]) for f in failed)
    consumed = {
        p["metadata"]["annotations"][contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST]
        for p in tpu.pods(namespace)
    }
    assert consumed == {provisioned}


def test_kueue_admits_a_flex_start_job_by_quota_and_gke_provisions_its_vms(
    tpu: Api, namespace: str, cluster: Cluster, kueue, operator
):
    """Flex-start under Kueue, as GKE documents it: no admission check (the VMs are not
    booked ahead); Kueue admits the job by quota, its pods select and tolerate flex-start
    VMs and node auto-provisioning creates a flex-start pool for them."""
    name = f"cq-{namespace}"
    kueue.apply(tpu_queues([V5E_16], cluster_queue=name, namespaces=[namespace], chips=16))
    try:
        job = manifest(
            "flex",
            namespace,
            {"type": "v5litepod-16"},
            "sleep 3600",
            placement={"capacity": "FlexStart", "maxRunDurationSeconds": 7200},
        )
        job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tpu"}
        tpu.apply(job)
        status = tpu.wait_phase(namespace, "flex", "Running", timeout=120)
        assert status["queue"]["state"] == "Admitted", status["queue"]
        pods = tpu.pods(namespace)
        assert len(pods) == 4
        for pod in pods:
            selector = pod["spec"]["nodeSelector"]
            assert selector[contract.NODE_LABEL_FLEX_START] == "true", selector
            assert selector[contract.NODE_LABEL_MAX_RUN_DURATION] == "7200", selector
            assert contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST not in (
                pod["metadata"].get("annotations") or {}
            )
        (pool,) = status["nodePools"]
        labels = [
            n["metadata"]["labels"]
            for n in tpu.raw.get("/api/v1/nodes")["items"]
            if n["metadata"]["labels"].get(contract.NODE_LABEL_NODEPOOL) == pool
        ]
        assert len(labels) == 4
        assert all(n[contract.NODE_LABEL_FLEX_START] == "true" for n in labels)
        assert not requests(tpu, namespace)  # nothing booked ahead, by anyone
        # A second flex-start job waits in the queue: the quota is the job's.
        second = {**job, "metadata": {**job["metadata"], "name": "flex-2"}}
        tpu.apply(second)
        queued = wait_until(
            lambda: (s := tpu.status(namespace, "flex-2")).get("queue") and s,
            timeout=60,
            message=lambda: f"flex-2 queued: {tpu.status(namespace, 'flex-2')}",
        )
        assert queued["queue"]["state"] != "Admitted", queued["queue"]
        assert not [p for p in tpu.pods(namespace) if p["metadata"]["name"].startswith("flex-2")]
    finally:
        cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")
