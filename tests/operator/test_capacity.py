"""Flex-start and queued provisioning without Kueue (docs/tasks/capacity.md), on a local
cluster of its own that starts with no TPU node and runs the simulated cluster autoscaler
(localcluster/agent/provisioner.py): its node auto-provisioner creates flex-start pools
and takes their VMs back at the end of their run duration, and it serves
ProvisioningRequests (queued-provisioning.gke.io; the CRD from the autoscaler's API
module) by creating their pools all at once, failing them, or letting them expire."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Autoprovisioning, Cluster, Pool
from localcluster.kueue import install_provisioning_requests
from localcluster.testing import wait_until
from tests.operator.support import Api, ChartIdentity, OperatorProcess, install_crds
from tests.operator.support import job_manifest as manifest
from tpu_operator import contract

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROVREQS = "/apis/autoscaling.x-k8s.io/v1/namespaces/{ns}/provisioningrequests"
SETTINGS = Autoprovisioning(delay=2.0, idle=300.0, mode="simulate", termination_notice=5.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster.start(
        REPO / ".localcluster" / f"test-capacity-{os.getpid()}",
        pools=[Pool(name="cpu", vms=1)],
        fresh=True,
        autoprovisioning=SETTINGS,
    )
    try:
        install_crds(cluster)
        install_provisioning_requests(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def identity(cluster: Cluster, tmp_path_factory) -> ChartIdentity:
    directory = Path(tmp_path_factory.mktemp("capacity-operator"))
    # As the chart's ServiceAccount, with exactly the chart's RBAC.
    return ChartIdentity(
        cluster, directory, release="tpu-operator-cap", namespace="tpu-operator-cap"
    ).create()


@pytest.fixture(scope="module")
def operator(identity: ChartIdentity, tmp_path_factory) -> Iterator[OperatorProcess]:
    process = identity.operator(Path(tmp_path_factory.mktemp("log")) / "operator.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def tpu(cluster: Cluster, operator: OperatorProcess) -> Iterator[Api]:
    yield Api(cluster)
    cluster.agent.set_autoprovisioning(SETTINGS)


@pytest.fixture
def ns(request: pytest.FixtureRequest, tpu: Api) -> Iterator[str]:
    name = f"cap-{request.node.name[5:25].replace('_', '-').strip('-')}-{uuid.uuid4().hex[:4]}"
    tpu.raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    tpu.raw.request("DELETE", f"/api/v1/namespaces/{name}")


def job(name: str, ns: str, placement: dict[str, Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("failurePolicy", {"backoffSeconds": 0})
    return manifest(name, ns, {"type": "v6e-16"}, "sleep 3600", placement=placement, **spec)


def requests(tpu: Api, ns: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in tpu.raw.get(PROVREQS.format(ns=ns))["items"]}


def node_labels(tpu: Api, pool: str) -> list[dict[str, str]]:
    return [
        n["metadata"]["labels"]
        for n in tpu.raw.get("/api/v1/nodes")["items"]
        if n["metadata"]["labels"].get(contract.NODE_LABEL_NODEPOOL) == pool
    ]


def slice_status(tpu: Api, ns: str) -> dict[str, Any]:
    (only,) = tpu.slices(ns)
    return only.get("status") or {}


def test_queued_provisioning_runs_a_slice_on_the_pool_of_its_own_request(tpu: Api, ns: str):
    tpu.apply(job("queued", ns, {"capacity": "QueuedProvisioning", "maxRunDurationSeconds": 3600}))
    status = tpu.wait_phase(ns, "queued", "Running", timeout=90)
    (name,) = requests(tpu, ns)
    assert name == "queued-0-a1-r0"
    request = requests(tpu, ns)[name]
    assert request["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert request["spec"]["parameters"] == {"maxRunDurationSeconds": "3600"}
    assert request["spec"]["podSets"] == [{"count": 4, "podTemplateRef": {"name": name}}]
    template = tpu.raw.get(f"/api/v1/namespaces/{ns}/podtemplates/{name}")["template"]["spec"]
    assert template["nodeSelector"][contract.NODE_LABEL_QUEUED] == "true"
    for pod in tpu.pods(ns):
        annotations = pod["metadata"]["annotations"]
        assert annotations[contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST] == name
        assert annotations[contract.ANNOTATION_PROVISIONING_CLASS] == "queued-provisioning.gke.io"
    (pool,) = status["nodePools"]
    labels = node_labels(tpu, pool)
    assert len(labels) == 4
    assert all(n[contract.NODE_LABEL_QUEUED] == "true" for n in labels)
    assert slice_status(tpu, ns)["provisioningState"].startswith("Provisioned")


def test_a_request_that_fails_or_expires_is_made_again(tpu: Api, ns: str, cluster: Cluster):
    cluster.agent.set_autoprovisioning(
        Autoprovisioning(**{**SETTINGS.to_json(), "provisioning_requests": "fail"})
    )
    tpu.apply(job("retried", ns, {"capacity": "QueuedProvisioning"}))
    wait_until(
        lambda: slice_status(tpu, ns).get("provisioningTries") == 1,
        timeout=60,
        message=lambda: f"a second try after the failure: {slice_status(tpu, ns)}",
    )
    cluster.agent.set_autoprovisioning(
        Autoprovisioning(**{**SETTINGS.to_json(), "provisioning_requests": "expire"})
    )
    wait_until(
        lambda: slice_status(tpu, ns).get("provisioningTries") == 2,
        timeout=90,
        message=lambda: f"a third try after the expiry: {slice_status(tpu, ns)}",
    )
    cluster.agent.set_autoprovisioning(SETTINGS)
    tpu.wait_phase(ns, "retried", "Running", timeout=120)
    made = requests(tpu, ns)
    assert sorted(made) == ["retried-0-a1-r0", "retried-0-a1-r1", "retried-0-a1-r2"]
    conditions = {
        name: {c["type"] for c in r["status"]["conditions"] if c["status"] == "True"}
        for name, r in made.items()
    }
    assert "Failed" in conditions["retried-0-a1-r0"]
    assert "BookingExpired" in conditions["retried-0-a1-r1"]
    assert "Provisioned" in conditions["retried-0-a1-r2"]
    consumed = {
        p["metadata"]["annotations"][contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST]
        for p in tpu.pods(ns)
    }
    assert consumed == {"retried-0-a1-r2"}
    assert "ProvisioningFailed" in {e["reason"] for e in tpu.events(ns, "retried-0")}


def test_an_operator_killed_with_a_request_in_flight_makes_no_second_and_loses_none(
    tpu: Api, ns: str, cluster: Cluster, operator: OperatorProcess
):
    # The autoscaler takes its time: the request is in flight when the operator dies.
    cluster.agent.set_autoprovisioning(Autoprovisioning(**{**SETTINGS.to_json(), "delay": 20.0}))
    tpu.apply(job("killed", ns, {"capacity": "QueuedProvisioning"}))
    wait_until(
        lambda: requests(tpu, ns),
        timeout=60,
        message=lambda: f"the first request: {tpu.status(ns, 'killed')}",
    )
    operator.kill()
    operator.start()
    cluster.agent.set_autoprovisioning(SETTINGS)
    tpu.wait_phase(ns, "killed", "Running", timeout=120)
    assert sorted(requests(tpu, ns)) == ["killed-0-a1-r0"]
    assert {
        p["metadata"]["annotations"][contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST]
        for p in tpu.pods(ns)
    } == {"killed-0-a1-r0"}


def test_flex_start_vms_taken_back_at_the_end_of_their_run_are_a_disruption(tpu: Api, ns: str):
    tpu.apply(job("flex", ns, {"capacity": "FlexStart", "maxRunDurationSeconds": 30}))
    first = tpu.wait_phase(ns, "flex", "Running", timeout=90)
    (pool,) = first["nodePools"]
    labels = node_labels(tpu, pool)
    assert len(labels) == 4
    assert all(n[contract.NODE_LABEL_FLEX_START] == "true" for n in labels)
    assert all(n[contract.NODE_LABEL_MAX_RUN_DURATION] == "30" for n in labels)
    nodes = [
        n
        for n in tpu.raw.get("/api/v1/nodes")["items"]
        if n["metadata"]["labels"].get(contract.NODE_LABEL_NODEPOOL) == pool
    ]
    assert all(contract.NODE_ANNOTATION_TERMINATION in n["metadata"]["annotations"] for n in nodes)
    assert all(
        p["spec"]["nodeSelector"][contract.NODE_LABEL_MAX_RUN_DURATION] == "30"
        for p in tpu.pods(ns)
    )
    # The VMs go after 30 s; the job restarts on new flex-start VMs, not counted.
    again = wait_until(
        lambda: (
            (s := tpu.status(ns, "flex")).get("restarts", 0) >= 1
            and s.get("phase") == "Running"
            and s
        ),
        timeout=150,
        message=lambda: f"the job running again: {tpu.status(ns, 'flex')}",
    )
    assert again["countedRestarts"] == 0
    assert again["nodePools"] != [pool]


def test_queued_capacity_that_does_not_come_falls_back_to_a_reservation(
    tpu: Api, ns: str, cluster: Cluster
):
    # The ProvisioningRequest is accepted and never provisioned: after 10 s of waiting the
    # job asks for its reservation's pool (one of its own, so that no other test's pool
    # is in its way), and the request is withdrawn.
    reservation = f"r-{uuid.uuid4().hex[:6]}"
    pool = Pool(
        name=f"res{reservation[2:]}",
        vms=4,
        accelerator="tpu-v6e-slice",
        topology="4x4",
        chips_per_vm=4,
        reservation=reservation,
        mode="simulate",
    )
    cluster.agent.set_autoprovisioning(
        Autoprovisioning(**{**SETTINGS.to_json(), "provisioning_requests": "hold"})
    )
    cluster.agent.add_pool(pool)
    placement = {
        "capacity": "QueuedProvisioning",
        "fallbacks": [{"afterSeconds": 10, "reservation": reservation}],
    }
    try:
        tpu.apply(job("fallback", ns, placement))
        first = wait_until(
            lambda: requests(tpu, ns),
            timeout=60,
            message=lambda: f"the first step's request: {tpu.status(ns, 'fallback')}",
        )
        assert sorted(first) == ["fallback-0-a1-r0"]
        status = tpu.wait_phase(ns, "fallback", "Running", timeout=150)
        assert status["fallback"]["step"] == 1
        assert status["fallback"]["capacity"] == f"reservation {reservation}"
        assert status["restarts"] == 0 and status["nodePools"] == [pool.name]
        for pod in tpu.pods(ns):
            assert contract.NODE_LABEL_QUEUED not in pod["spec"]["nodeSelector"]
            annotations = pod["metadata"].get("annotations") or {}
            assert contract.ANNOTATION_CONSUME_PROVISIONING_REQUEST not in annotations
        wait_until(
            lambda: requests(tpu, ns) == {},
            timeout=30,
            message=lambda: f"the first step's request withdrawn: {sorted(requests(tpu, ns))}",
        )
        (event,) = [
            e["message"] for e in tpu.events(ns, "fallback") if e["reason"] == "CapacityFallback"
        ]
        assert "of queued provisioning (step 0)" in event
    finally:
        tpu.raw.request(
            "DELETE",
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.JOB_PLURAL}/fallback",
        )
        wait_until(lambda: not tpu.pods(ns), timeout=60, message="the job's pods gone")
        cluster.agent.remove_pool(pool.name)
