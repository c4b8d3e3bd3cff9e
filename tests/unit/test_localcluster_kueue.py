"""localcluster/kueue.py's pure parts: which of Kueue's manifests are applied, the queues
built for the simulated pools, the manager's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import binaries
from localcluster.kueue import (
    EXTERNAL_FRAMEWORKS,
    WEBHOOK_SERVICE,
    configuration,
    select,
    tpu_queues,
)
from localcluster.pools import Pool
from tpu_operator.builders.workload import EXTERNAL_FRAMEWORK

pytestmark = pytest.mark.unit


def webhook_config(kind: str, resources: list[list[str]]) -> dict:
    return {
        "kind": kind,
        "metadata": {"name": "kueue-x"},
        "webhooks": [
            {"name": f"w{i}", "rules": [{"resources": r}]} for i, r in enumerate(resources)
        ],
    }


def test_only_kueues_own_webhooks_and_no_deployment_are_applied():
    docs = [
        {"kind": "Deployment", "metadata": {"name": "kueue-controller-manager"}},
        {"kind": "CustomResourceDefinition", "metadata": {"name": "workloads.kueue.x-k8s.io"}},
        {
            "kind": "Service",
            "metadata": {"name": WEBHOOK_SERVICE},
            "spec": {"selector": {"a": "b"}, "ports": [{"port": 443}]},
        },
        {
            "kind": "Service",
            "metadata": {"name": "kueue-visibility-server"},
            "spec": {"selector": {"a": "b"}, "ports": [{"name": "https", "port": 443}]},
        },
        {"kind": "APIService", "metadata": {"name": "v1beta2.visibility.kueue.x-k8s.io"}},
        webhook_config(
            "MutatingWebhookConfiguration", [["pods"], ["workloads"], ["jobs"], ["clusterqueues"]]
        ),
        webhook_config("ValidatingWebhookConfiguration", [["workloads", "workloads/status"]]),
    ]
    kept = select(docs)
    kinds = [d["kind"] for d in kept]
    assert "Deployment" not in kinds
    services = [d for d in kept if d["kind"] == "Service"]
    assert [s["metadata"]["name"] for s in services] == [WEBHOOK_SERVICE, "kueue-visibility-server"]
    assert all("selector" not in s["spec"] for s in services)  # their endpoint is this machine
    assert "APIService" in kinds  # the visibility API, served by the manager
    mutating = next(d for d in kept if d["kind"] == "MutatingWebhookConfiguration")
    assert [w["name"] for w in mutating["webhooks"]] == ["w1", "w3"]
    assert docs[2]["spec"]["selector"] == {"a": "b"}  # the input is not changed


def test_queues_for_the_simulated_pools_count_chips_per_flavor():
    pools = [
        Pool(name="a", vms=2, accelerator="tpu-v5p-slice", topology="2x2x2"),
        Pool(name="b", vms=2, accelerator="tpu-v5p-slice", topology="2x2x2"),
        Pool(name="c", vms=4, accelerator="tpu-v5-lite-podslice", topology="4x4"),
        Pool(name="cpu", vms=2),
    ]
    docs = tpu_queues(pools, namespaces=["ml"], topology=True)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Topology", "ResourceFlavor", "ResourceFlavor", "ClusterQueue", "LocalQueue"]
    (cq,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    quota = {
        f["name"]: f["resources"][0]["nominalQuota"]
        for f in cq["spec"]["resourceGroups"][0]["flavors"]
    }
    assert quota == {"v5p-slice-2-2-2": 16, "v5-lite-podslice-4-4": 16}
    assert all(d["spec"].get("topologyName") for d in docs if d["kind"] == "ResourceFlavor")


def test_configuration_registers_tpujob_as_an_external_framework():
    config = configuration(9443, 8081, Path("/tmp/certs"))
    assert config["integrations"]["externalFrameworks"] == [EXTERNAL_FRAMEWORK]
    assert list(EXTERNAL_FRAMEWORKS) == [EXTERNAL_FRAMEWORK]
    assert config["internalCertManagement"]["enable"] is True


def test_kueue_version_is_pinned_in_its_wrapper_module():
    assert binaries.KUEUE.version.startswith("v0.19.")
