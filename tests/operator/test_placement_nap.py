"""Placement without pre-existing pools, on a local cluster of its own that starts with no
TPU node and runs the simulated GKE cluster autoscaler and node auto-provisioner
(localcluster/agent/provisioner.py), with the operator's --default-provisioning=Auto: pools
GKE creates per slice, one asked for again after it vanished, a pool scaled to zero pinned
by name, and 2x4 pools of 8-chip and of 4-chip VMs side by side."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Autoprovisioning, Cluster, Pool
from localcluster.testing import wait_until
from tests.operator.support import (
    Api,
    ChartIdentity,
    OperatorProcess,
    PodAttemptRecorder,
    install_crds,
)
from tests.operator.support import job_manifest as manifest
from tpu_operator import contract

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SLICE_POOL = "tpu-operator.dev/slice-pool"
IDLE = 6.0
ZERO = Pool(
    name="v5p-zero",
    accelerator="tpu-v5p-slice",
    topology="2x2x2",
    vms=2,
    autoscaling=True,
    initial_vms=0,
    mode="simulate",
)


@pytest.fixture(scope="module")
def nap_cluster() -> Iterator[Cluster]:
    """A cluster with one CPU VM, a v5p pool scaled to zero, and autoprovisioning on."""
    cluster = Cluster.start(
        REPO / ".localcluster" / f"test-nap-{os.getpid()}",
        pools=[Pool(name="cpu", vms=1), ZERO],
        fresh=True,
        autoprovisioning=Autoprovisioning(delay=1.0, idle=IDLE, mode="simulate"),
    )
    try:
        install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def nap_operator(nap_cluster: Cluster, tmp_path_factory) -> Iterator[OperatorProcess]:
    directory = Path(tmp_path_factory.mktemp("nap-operator"))
    # As the chart's ServiceAccount, with exactly the chart's RBAC.
    identity = ChartIdentity(
        nap_cluster,
        directory,
        release="tpu-operator-nap",
        namespace="tpu-operator-nap",
        values={"placement": {"defaultProvisioning": "Auto"}},
    ).create()
    # Auto by default: jobs that do not set placement.provisioning ask GKE for pools too
    process = identity.operator(
        directory / "operator.log", extra_args=["--default-provisioning=Auto"]
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def tpu(nap_cluster: Cluster, nap_operator: OperatorProcess) -> Api:
    return Api(nap_cluster)


@pytest.fixture
def ns(request: pytest.FixtureRequest, tpu: Api) -> Iterator[str]:
    name = f"nap-{request.node.name[5:25].replace('_', '-').strip('-')}-{uuid.uuid4().hex[:4]}"
    tpu.raw.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    tpu.raw.request("DELETE", f"/api/v1/namespaces/{name}")


def job(name: str, ns: str, shape: dict[str, Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("failurePolicy", {"backoffSeconds": 0})
    return manifest(name, ns, shape, "sleep 3600", **spec)


def auto() -> dict[str, Any]:
    return {"provisioning": "Auto"}


def nodes(tpu: Api) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in tpu.raw.get("/api/v1/nodes")["items"]}


def pool_of(node: dict[str, Any]) -> str:
    return node["metadata"]["labels"][contract.NODE_LABEL_NODEPOOL]


def pods_by_pool(tpu: Api, ns: str, name: str) -> dict[str, set[str]]:
    """Slice name -> the node pools its pods run on."""
    known = nodes(tpu)
    found: dict[str, set[str]] = {}
    for pod in tpu.pods(ns, f"{contract.LABEL_JOB_NAME}={name}"):
        slice_name = pod["metadata"]["labels"][contract.LABEL_SLICE_NAME]
        found.setdefault(slice_name, set()).add(pool_of(known[pod["spec"]["nodeName"]]))
    return found


def test_multi_host_and_multislice_jobs_get_pools_created_per_slice(tpu: Api, ns: str):
    tpu.apply(job("single", ns, {"type": "v6e-16"}, placement=auto()))
    tpu.apply(job("multi", ns, {"type": "v5p-16"}, numSlices=2, placement=auto()))
    waiting = wait_until(
        lambda: (s := tpu.status(ns, "multi")).get("nodePools") and s,
        timeout=30,
        message="multi to record its claims",
    )
    assert all(p.startswith("auto:multi-") for p in waiting["nodePools"])

    single = tpu.wait_phase(ns, "single", "Running", timeout=60)
    multi = tpu.wait_phase(ns, "multi", "Running", timeout=60)
    pools = single["nodePools"] + multi["nodePools"]
    assert len(pools) == 3 and len(set(pools)) == 3
    assert all(p.startswith("nap-ct") for p in pools), pools
    assert single["nodePools"][0].startswith("nap-ct6e-standard-4t-")
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for node in nodes(tpu).values():
        by_pool.setdefault(pool_of(node), []).append(node)
    assert len(by_pool[single["nodePools"][0]]) == 4
    for name in multi["nodePools"]:
        pool_nodes = by_pool[name]
        assert len(pool_nodes) == 2
        assert {n["metadata"]["labels"][SLICE_POOL] for n in pool_nodes} != {""}
        assert {"key": SLICE_POOL, "effect": "NoSchedule"}.items() <= pool_nodes[0]["spec"][
            "taints"
        ][-1].items()
    # all hosts of a slice in its own pool, one slice per pool
    assert pods_by_pool(tpu, ns, "multi") == {
        "multi-0": {multi["nodePools"][0]},
        "multi-1": {multi["nodePools"][1]},
    }
    assert pods_by_pool(tpu, ns, "single") == {"single-0": {single["nodePools"][0]}}
    reasons = [e["reason"] for e in tpu.events(ns, "multi")]
    assert reasons.count("WaitingForNodePools") == 2 and "NodePoolsAssigned" in reasons

    # a gang restart stays on the same pools and never mixes attempts
    with PodAttemptRecorder(tpu, ns) as recorder:
        tpu.cluster.agent.kill_pod(ns, "multi-1-0", exit_code=1)
        restarted = wait_until(
            lambda: (
                (s := tpu.status(ns, "multi")).get("attempt") == 2
                and s.get("phase") == "Running"
                and s
            ),
            timeout=60,
            message=lambda: f"multi attempt 2 Running: {tpu.status(ns, 'multi').get('message')}",
        )
    assert restarted["nodePools"] == multi["nodePools"]
    assert pods_by_pool(tpu, ns, "multi") == {
        "multi-0": {multi["nodePools"][0]},
        "multi-1": {multi["nodePools"][1]},
    }
    mixed = [
        alive
        for _, alive in recorder.overlaps
        if len({a for pod, a in alive.items() if pod.startswith("multi-")}) > 1
    ]
    assert not mixed, mixed[:3]

    # once the jobs' pods are gone, the pools GKE created are deleted after being idle
    for name in ("single", "multi"):
        tpu.patch_job(ns, name, {"spec": {"suspend": True}})
    wait_until(
        lambda: not set(pools) & {pool_of(n) for n in nodes(tpu).values()},
        timeout=IDLE + 30,
        message=lambda: f"idle pools {pools} removed; nodes {sorted(nodes(tpu))}",
    )


def test_a_pool_gke_created_that_vanishes_is_asked_for_again(tpu: Api, ns: str):
    """A job that does not set placement.provisioning (the operator runs with
    --default-provisioning=Auto) gets a pool GKE creates; when that pool is deleted under
    it, the restarted slice asks GKE for a new pool instead of waiting for the old one.
    The template declares libtpu's ports unnamed, as GKE's and xpk's samples do."""
    spec = job("vanish", ns, {"type": "v5p-16"})
    worker = spec["spec"]["template"]["spec"]["containers"][0]
    worker["ports"] = [{"containerPort": 8471}, {"containerPort": 8080}]
    tpu.apply(spec)
    first = tpu.wait_phase(ns, "vanish", "Running", timeout=60)
    (pool,) = first["nodePools"]
    assert pool.startswith("nap-ct5p-hightpu-4t-"), pool

    tpu.cluster.agent.remove_pool(pool)  # deleted with the slice's pods on it
    second = wait_until(
        lambda: (
            (s := tpu.status(ns, "vanish")).get("attempt") == 2
            and s.get("phase") == "Running"
            and s
        ),
        timeout=90,
        message=lambda: f"vanish attempt 2 Running: {tpu.status(ns, 'vanish').get('message')}",
    )
    (renewed,) = second["nodePools"]
    assert renewed != pool and renewed.startswith("nap-ct5p-hightpu-4t-"), renewed
    assert pods_by_pool(tpu, ns, "vanish") == {"vanish-0": {renewed}}
    gone = [e["message"] for e in tpu.events(ns, "vanish") if e["reason"] == "NodePoolGone"]
    assert gone == [
        f"slice 0: node pool {pool} has no nodes; GKE deleted it or scaled it to zero; its "
        "pods ask GKE for a new pool"
    ]
    tpu.patch_job(ns, "vanish", {"spec": {"suspend": True}})
    wait_until(lambda: not tpu.pods(ns), timeout=30, message="vanish's pods gone")


def test_a_pool_scaled_to_zero_pinned_by_name(tpu: Api, ns: str):
    assert not any(pool_of(n) == ZERO.name for n in nodes(tpu).values())
    tpu.apply(job("pinned", ns, {"type": "v5p-16"}, placement={"nodePools": [ZERO.name]}))
    running = tpu.wait_phase(ns, "pinned", "Running", timeout=60)
    assert running["nodePools"] == [ZERO.name]
    assert pods_by_pool(tpu, ns, "pinned") == {"pinned-0": {ZERO.name}}
    assert sum(pool_of(n) == ZERO.name for n in nodes(tpu).values()) == 2
    events = tpu.raw.get(f"/api/v1/namespaces/{ns}/events")["items"]
    assert any(
        e["reason"] == "TriggeredScaleUp" and f"{ZERO.name} 0->2" in e["message"] for e in events
    )


def test_2x4_pools_of_8_chip_and_4_chip_vms(tpu: Api, ns: str):
    agent = tpu.cluster.agent
    four = Pool(
        name=f"v6e-4t-{ns[-4:]}",
        accelerator="tpu-v6e-slice",
        topology="2x4",
        vms=2,
        chips_per_vm=4,
        mode="simulate",
    )
    eight = Pool(
        name=f"v6e-8t-{ns[-4:]}",
        accelerator="tpu-v6e-slice",
        topology="2x4",
        vms=2,
        chips_per_vm=8,
        mode="simulate",
    )
    existing = {"provisioning": "ExistingPools"}
    try:
        # neither machine type, and GKE may not create one: e1 waits, naming both
        tpu.apply(job("e1", ns, {"type": "v6e-8"}, placement=existing))
        waiting = wait_until(
            lambda: "either machine type" in (s := tpu.status(ns, "e1")).get("message", "") and s,
            timeout=30,
            message=lambda: f"e1 waiting: {tpu.status(ns, 'e1').get('message')}",
        )
        assert (
            "ct6e-standard-8t (1 VM of 8 chips) or ct6e-standard-4t (2 VMs of 4 chips)"
            in (waiting["message"])
        )
        assert waiting["phase"] == "Pending" and not waiting.get("attempt")
        assert not tpu.pods(ns)
        # only 4-chip 2x4 VMs appear: an unset chipsPerHost takes them (two hosts)
        agent.add_pool(four)
        e1 = tpu.wait_phase(ns, "e1", "Running", timeout=60)
        assert (e1["shape"]["chipsPerHost"], e1["shape"]["hosts"]) == (4, 2)
        assert e1["shape"]["machineType"] == "ct6e-standard-4t"
        assert e1["nodePools"] == [four.name]
        assigned = tpu.wait_events(ns, "e1", "NodePoolsAssigned")
        assert assigned
        message = next(
            e["message"] for e in tpu.events(ns, "e1") if e["reason"] == "NodePoolsAssigned"
        )
        assert "4-chip VMs (ct6e-standard-4t)" in message

        agent.add_pool(eight)
        # chipsPerHost 4 never gets the 8-chip pool, even while the 4-chip one is busy
        # (ExistingPools, overriding the operator's Auto default: d waits for a pool)
        tpu.apply(job("d", ns, {"type": "v6e-8", "chipsPerHost": 4}, placement=existing))
        waiting = wait_until(
            lambda: "8-chip VMs" in (s := tpu.status(ns, "d")).get("message", "") and s,
            timeout=30,
            message=lambda: f"d waiting: {tpu.status(ns, 'd').get('message')}",
        )
        assert waiting["phase"] == "Pending" and not waiting.get("nodePools")
        assert f"{eight.name} has 8-chip VMs (ct6e-standard-8t)" in waiting["message"]
        # an unset chipsPerHost now takes the free 8-chip VM (one host)
        tpu.apply(job("e2", ns, {"type": "v6e-8"}))
        e2 = tpu.wait_phase(ns, "e2", "Running", timeout=60)
        assert (e2["shape"]["chipsPerHost"], e2["shape"]["hosts"]) == (8, 1)
        assert e2["shape"]["machineType"] == "ct6e-standard-8t"
        assert pods_by_pool(tpu, ns, "e2") == {"e2-0": {eight.name}}
        # the 4-chip pool frees up: d gets it
        tpu.patch_job(ns, "e1", {"spec": {"suspend": True}})
        d = tpu.wait_phase(ns, "d", "Running", timeout=60)
        assert d["nodePools"] == [four.name]
        assert pods_by_pool(tpu, ns, "d") == {"d-0": {four.name}}
    finally:
        for name in ("d", "e1", "e2"):
            tpu.raw.request(
                "PATCH",
                f"{_jobs(ns)}/{name}",
                {"spec": {"suspend": True}},
                content_type="application/merge-patch+json",
            )
        wait_until(lambda: not tpu.pods(ns), timeout=30, message="the jobs' pods gone")
        agent.remove_pool(four.name)
        agent.remove_pool(eight.name)


def _jobs(ns: str) -> str:
    return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.JOB_PLURAL}"
