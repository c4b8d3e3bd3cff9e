"""The real controller-manager and apiserver behaviours the operator relies on."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from localcluster.api import SyncApi
from localcluster.testing import wait_until

pytestmark = pytest.mark.integration


def _items(api: SyncApi, path: str, selector: str) -> list[dict[str, Any]]:
    return list(api.get(f"{path}?labelSelector={selector}")["items"])


def test_deployment_gets_replicaset_and_pods_and_gc_removes_them(
    api: SyncApi, namespace: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "main", "image": "local", "command": ["sleep", "300"]}],
                },
            },
        },
    }
    apps = f"/apis/apps/v1/namespaces/{namespace}"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    api.call("POST", f"{apps}/deployments", deployment)

    replicasets = wait_until(
        lambda: _items(api, f"{apps}/replicasets", "app=web"),
        timeout=30,
        message="the Deployment's ReplicaSet",
    )
    assert replicasets[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"

    def running() -> list[dict[str, Any]] | None:
        items = _items(api, pods, "app=web")
        ok = [p for p in items if p["status"].get("phase") == "Running"]
        return items if len(ok) == 2 else None

    wait_until(running, timeout=60, message="2 running pods of the Deployment")
    status = wait_until(
        lambda: (d := api.get(f"{apps}/deployments/web")["status"]).get("readyReplicas") == 2 and d,
        timeout=30,
        message="the Deployment to report 2 ready replicas",
    )
    assert status["availableReplicas"] == 2

    api.call("DELETE", f"{apps}/deployments/web", {"propagationPolicy": "Background"})
    wait_until(
        lambda: not _items(api, f"{apps}/replicasets", "app=web"),
        timeout=60,
        message="the garbage collector to delete the ReplicaSet",
    )
    wait_until(
        lambda: not _items(api, pods, "app=web"),
        timeout=60,
        message="the garbage collector to delete the pods (and the agent to stop them)",
    )


def test_crd_cel_rule_rejects_invalid_object_at_create(api: SyncApi, namespace: str) -> None:
    group = f"cel{uuid.uuid4().hex[:6]}.localcluster.test"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "min": {"type": "integer"},
                                        "max": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {
                                            "rule": "self.min <= self.max",
                                            "message": "min must not exceed max",
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    api.call("POST", crds, crd)
    try:
        wait_until(
            lambda: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in api.get(f"{crds}/widgets.{group}")["status"].get("conditions", [])
            ),
            timeout=30,
            message="the CRD to be established",
        )
        path = f"/apis/{group}/v1/namespaces/{namespace}/widgets"

        def create(name: str, low: int, high: int) -> tuple[int, Any]:
            body = {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": {"min": low, "max": high},
            }
            return api.request("POST", path, body)

        # Discovery of a new group takes a moment; a valid create proves it is served.
        wait_until(lambda: create("good", 1, 2)[0] == 201, timeout=30, message="valid create")
        status, body = create("bad", 5, 1)
        assert status == 422
        assert "min must not exceed max" in body["message"]
        assert api.request("GET", f"{path}/bad")[0] == 404
    finally:
        api.request("DELETE", f"{crds}/widgets.{group}")
