"""The end-to-end tier: the chart installed with helm, the operator running in the
cluster as the chart's ServiceAccount from its image, workers training, a real Prometheus
scraping (the operator's metrics through their authorization, with the token of a
ServiceAccount ``monitoring/prometheus`` the chart binds to its metrics reader role).

The operator container runs the operator image built from ./Dockerfile
(localcluster.images): the chart's ``command`` is podman running the image's filesystem
with runc on the host's network (a local cluster's pod is a process group of this machine,
its pod IP one of the machine's addresses), with the pod's volumes, its ServiceAccount
token and its env passed into the container.

Session order matters: the e2e tests share one release and one Prometheus (module
fixtures in test_product.py); the integration tests' own operator process is stopped
before this package starts (it is package-scoped there).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import images
from localcluster.helm import Helm
from localcluster.prometheus import PROMETHEUS_OPERATOR_APIS, Prometheus, free_port

RELEASE = "tpu-operator"
RELEASE_NAMESPACE = "tpu-system"
PROMETHEUS_ACCOUNT = {"namespace": "monitoring", "name": "prometheus"}
"""The ServiceAccount the e2e Prometheus scrapes as (the chart's metrics.auth.readers)."""

# Stand-ins for prometheus-operator's CRDs, with open schemas: they let the apiserver
# accept (and dry-run) the chart's ServiceMonitor, PodMonitor and PrometheusRule. Their
# content is checked by promtool and by the Prometheus configured from them.
MONITORING_KINDS = {
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}


class ReleaseHelm(Helm):
    """helm with this suite's release and namespace as defaults, rendering as for this
    cluster, which serves prometheus-operator's APIs (``monitoring_crds``)."""

    def template(  # type: ignore[override]
        self,
        values: dict[str, Any],
        release: str = RELEASE,
        namespace: str = RELEASE_NAMESPACE,
        api_versions: tuple[str, ...] = PROMETHEUS_OPERATOR_APIS,
    ) -> list[dict[str, Any]]:
        return super().template(
            values, release=release, namespace=namespace, api_versions=api_versions
        )


@pytest.fixture(scope="session")
def helm(cluster) -> ReleaseHelm:
    return ReleaseHelm(cluster.kubeconfig)


@pytest.fixture(scope="session")
def monitoring_crds(cluster) -> None:
    install_monitoring_crds(cluster)


def install_monitoring_crds(cluster) -> None:
    for kind, plural in MONITORING_KINDS.items():
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {
                "group": "monitoring.coreos.com",
                "names": {
                    "kind": kind,
                    "plural": plural,
                    "listKind": f"{kind}List",
                    "singular": kind.lower(),
                },
                "scope": "Namespaced",
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(crd))
    for plural in MONITORING_KINDS.values():
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", timeout=60
        )


@pytest.fixture(scope="session")
def operator_image() -> images.ImageConfig:
    """The operator image built from ./Dockerfile (cached by its inputs)."""
    return images.ensure(images.OPERATOR)


@pytest.fixture(scope="session")
def chart_values() -> dict[str, Any]:
    """Values for the e2e release but the command: every optional part on, short alert
    durations."""
    return {
        "operator": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "logFormat": "text",
            "progressPublishSeconds": 2,
            # The local cluster's pods share the host's network: each replica listens
            # on its own pod IP.
            "bindAddress": "$(POD_IP)",
        },
        "metrics": {"auth": {"readers": [PROMETHEUS_ACCOUNT]}},
        "serviceMonitor": {"enabled": True, "interval": "2s"},
        "podMonitor": {"enabled": True, "interval": "2s"},
        "prometheusRule": {
            "enabled": True,
            "stallSeconds": 10,
            "for": "2s",
            "targetDownFor": "10s",
        },
        "dashboards": {"enabled": True},
    }


@pytest.fixture(scope="session")
def operator_command(
    helm: ReleaseHelm, cluster, operator_image, chart_values: dict[str, Any]
) -> Iterator[list[str]]:
    """The operator container's command: podman running the operator image as a kubelet
    would run the container the chart renders (localcluster.images.pod_run_arguments)."""
    deployment = next(d for d in helm.template(chart_values) if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    yield [
        *images.podman_command(),
        *images.pod_run_arguments(operator_image, container, cluster.directory),
    ]
    images.remove_cluster_containers(cluster.directory)


@pytest.fixture(scope="session")
def release_values(chart_values: dict[str, Any], operator_command: list[str]) -> dict[str, Any]:
    """Values for the e2e release: the operator runs from its image."""
    return {**chart_values, "command": operator_command}


@pytest.fixture(scope="session")
def rendered(helm: ReleaseHelm, release_values: dict[str, Any]) -> list[dict[str, Any]]:
    return helm.template(release_values)


@pytest.fixture(scope="session")
def prometheus_token(cluster) -> str:
    """A token of the ServiceAccount monitoring/prometheus, as its pod would have."""
    namespace, name = PROMETHEUS_ACCOUNT["namespace"], PROMETHEUS_ACCOUNT["name"]
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
    return cluster.service_account_token(namespace, name)


@pytest.fixture(scope="session")
def prometheus(cluster, rendered, prometheus_token, tmp_path_factory) -> Iterator[Prometheus]:
    server = Prometheus(
        Path(tmp_path_factory.mktemp("prometheus")),
        rendered,
        cluster.api(),
        token=prometheus_token,
    )
    server.check_config()
    server.start()
    yield server
    server.stop()
