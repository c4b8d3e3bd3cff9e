"""ServiceAccount tokens and volumes: a pod's process talks to the API as its ServiceAccount;
the pods of a claim bound to a hostPath volume share its files."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

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


def persistent_volume(name: str, source: dict[str, Any], storage_class: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            **source,
        },
    }


def claim(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def test_pods_of_a_claim_bound_to_a_host_path_volume_share_its_files(
    api: SyncApi, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns = f"/api/v1/namespaces/{namespace}"
    shared = tmp_path / "shared"
    # A storage class name of this test's own: the controller-manager binds the claim to
    # this volume and no other.
    volumes = {
        "files": persistent_volume(
            f"{namespace}-files", {"hostPath": {"path": str(shared), "type": ""}}, namespace
        ),
        "nfs": persistent_volume(
            f"{namespace}-nfs", {"nfs": {"server": "nfs.example", "path": "/"}}, f"{namespace}-n"
        ),
    }
    try:
        for volume in volumes.values():
            api.call("POST", "/api/v1/persistentvolumes", volume)
        api.call("POST", f"{ns}/persistentvolumeclaims", claim("files", namespace))
        api.call("POST", f"{ns}/persistentvolumeclaims", claim("nfs", f"{namespace}-n"))
        for name in ("one", "two"):
            manifest = pod(
                name,
                ["sh", "-c", f"echo {name} > /tmp/lc-claim-test/{name}"],
                spec={
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "files"}}]
                },
                container={"volumeMounts": [{"name": "data", "mountPath": "/tmp/lc-claim-test"}]},
            )
            api.call("POST", f"{ns}/pods", manifest)
        manifest = pod(
            "remote",
            ["true"],
            spec={"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "nfs"}}]},
        )
        api.call("POST", f"{ns}/pods", manifest)

        def finished(name: str) -> dict[str, Any] | None:
            current = api.get(f"{ns}/pods/{name}")
            return current if current["status"].get("phase") in ("Succeeded", "Failed") else None

        for name in ("one", "two"):
            done = wait_until(lambda n=name: finished(n), timeout=90, message=f"pod {name}")
            assert done["status"]["phase"] == "Succeeded", done["status"]
        # Both wrote to the volume's directory on this machine, not to the pods' own.
        assert sorted(p.name for p in shared.iterdir()) == ["one", "two"]
        assert (shared / "two").read_text() == "two\n"
        assert api.get(f"{ns}/persistentvolumeclaims/files")["spec"]["volumeName"] == (
            f"{namespace}-files"
        )
        failed = wait_until(lambda: finished("remote"), timeout=90, message="pod remote")
        assert failed["status"]["phase"] == "Failed"
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["reason"] == "CreateContainerConfigError"
        assert f"bound to persistentvolume '{namespace}-nfs' of type nfs" in terminated["message"]
    finally:
        api.request("DELETE", f"{ns}/pods?gracePeriodSeconds=0")
        for volume in volumes.values():
            api.request("DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}")
