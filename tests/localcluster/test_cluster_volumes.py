"""ServiceAccount tokens and volumes: a pod's process talks to the API as its ServiceAccount."""

from __future__ import annotations

import textwrap

import pytest

from localcluster import Cluster
from localcluster.api import SyncApi
from localcluster.testing import pod, wait_until

pytestmark = pytest.mark.integration

IN_CLUSTER = textwrap.dedent(
    """
    import pathlib
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
    sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
    namespace = (sa / "namespace").read_text()
    config.load_incluster_config()
    core = client.CoreV1Api()
    print("pods", [p.metadata.name for p in core.list_namespaced_pod(namespace).items])
    try:
        core.list_namespaced_secret(namespace)
        print("secrets allowed")
    except ApiException as error:
        print("secrets", error.status, error.body)
    base = pathlib.Path("/tmp/lc-volume-test")
    print("config", (base / "config" / "greeting").read_text())
    (base / "scratch" / "note").write_text("written")
    """
)


def test_pod_authenticates_as_its_service_account_with_volumes(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    ns = f"/api/v1/namespaces/{namespace}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    api.call("POST", f"{ns}/serviceaccounts", {"metadata": {"name": "runner"}})
    api.call("POST", f"{ns}/configmaps", {"metadata": {"name": "cfg"}, "data": {"greeting": "hi"}})
    api.call(
        "POST",
        f"{rbac}/roles",
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    api.call(
        "POST",
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "runner-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": namespace}],
        },
    )
    manifest = pod(
        "in-cluster",
        ["python", "-c", IN_CLUSTER],
        spec={
            "serviceAccountName": "runner",
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
        container={
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/tmp/lc-volume-test/config"},
                {"name": "scratch", "mountPath": "/tmp/lc-volume-test/scratch"},
            ]
        },
    )
    api.call("POST", f"{ns}/pods", manifest)
    done = wait_until(
        lambda: (
            (p := api.get(f"{ns}/pods/in-cluster"))["status"].get("phase")
            in ("Succeeded", "Failed")
            and p
        ),
        timeout=90,
        message="the in-cluster pod to finish",
    )
    log = cluster.pod_log(namespace, "in-cluster", "main").read_text()
    assert done["status"]["phase"] == "Succeeded", log
    assert "pods ['in-cluster']" in log
    assert "secrets 403" in log and f"system:serviceaccount:{namespace}:runner" in log
    assert "config hi" in log
    scratch = cluster.pods_dir / namespace / "in-cluster" / "volumes" / "scratch" / "note"
    assert scratch.read_text() == "written", "emptyDir is the pod's directory on the machine"
