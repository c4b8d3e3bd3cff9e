"""Every rendered manifest, of every values combination: validated strictly against the
OpenAPI schemas of each Kubernetes version the chart declares (offline), accepted by the
local apiserver in a strict server-side dry run, and free of deprecated APIs (pluto).

The schemas are kubernetes-validate's (a PyPI package that bundles the JSON schemas
generated from each Kubernetes release's OpenAPI document, strict variants included:
unknown fields are errors). It covers every minor version from the chart's kubeVersion
floor to the newest it ships, offline; kubeconform would need the same schemas fetched
or generated per version, and the apiserver built here serves only its own version.
The custom resources (prometheus-operator's and Managed Prometheus's) have no schema
there: their content is checked by promtool (test_alerts.py) and by the e2e tier's
Prometheus, which is configured from them.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
import pytest
from kubernetes_validate import utils as kubernetes_schemas
from referencing import Registry, Resource

from localcluster import binaries
from tests.chart.conftest import (
    CUSTOM_GROUPS,
    NAMESPACE,
    Rendering,
    Tools,
    minimum_kubernetes,
    run,
)
from tests.e2e.conftest import install_monitoring_crds

pytestmark = pytest.mark.e2e


def kubernetes_versions() -> list[str]:
    """Every Kubernetes minor version the chart declares that the schemas cover."""
    floor = minimum_kubernetes()
    versions = sorted(
        set(kubernetes_schemas.all_versions()),
        key=lambda v: tuple(int(p) for p in v.split(".")),
    )
    return [v for v in versions if tuple(int(p) for p in v.split(".")[:2]) >= floor]


@functools.cache
def _definitions(version: str) -> Resource[Any]:
    return Resource.from_contents(
        kubernetes_schemas.schema_contents(
            f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
        )
    )


@functools.cache
def validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    """The strict schema of ``kind`` in ``version`` (None: that version has no such API).
    The files and their lookup are kubernetes_validate.validate's; the validators are
    cached here (that function reloads the definitions for every object)."""
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = f"kubernetes-json-schema/v{version}-local-strict/{kind.lower()}-{group}.json"
    try:
        schema = kubernetes_schemas.schema_contents(path, version)
    except FileNotFoundError:
        return None
    registry: Registry[Any] = _definitions(version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def is_custom(document: dict[str, Any]) -> bool:
    return document["apiVersion"].split("/")[0] in CUSTOM_GROUPS


def name(document: dict[str, Any]) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


def test_the_schemas_cover_every_version_from_the_chart_s_floor_to_the_local_cluster_s():
    versions = kubernetes_versions()
    major, minor = minimum_kubernetes()
    assert versions[0] == f"{major}.{minor}.0"
    local = ".".join(binaries.KUBERNETES.version.lstrip("v").split(".")[:2]) + ".0"
    assert local in versions, f"no schemas for the local cluster's Kubernetes {local}"


def test_every_manifest_validates_strictly_against_every_declared_kubernetes(
    renderings: list[Rendering],
) -> None:
    versions = kubernetes_versions()
    unique: dict[str, tuple[str, dict[str, Any]]] = {}
    for rendering in renderings:
        for document in rendering.documents:
            key = json.dumps(document, sort_keys=True)
            unique.setdefault(key, (rendering.values.name, document))
    errors: list[str] = []
    custom: set[str] = set()
    for values, document in unique.values():
        if is_custom(document):
            custom.add(document["kind"])
            continue
        for version in versions:
            schema = validator(version, document["apiVersion"], document["kind"])
            if schema is None:
                errors.append(
                    f"{values}: {name(document)}: Kubernetes {version} has no "
                    f"{document['apiVersion']} {document['kind']}"
                )
                continue
            for error in schema.iter_errors(document):
                path = ".".join(str(p) for p in error.absolute_path)
                errors.append(
                    f"{values}: {name(document)} against Kubernetes {version}: "
                    f"{path}: {error.message}"
                )
    assert not errors, "\n".join(errors[:40])
    # Every custom kind the chart can render was rendered (and skipped knowingly).
    assert custom == {
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "PodMonitoring",
        "ClusterPodMonitoring",
    }


def test_the_apiserver_accepts_every_manifest_in_a_strict_dry_run(
    cluster, renderings: list[Rendering]
) -> None:
    """Server-side, with strict field validation, on the local apiserver: what a cluster of
    its version would do with ``helm install``, for each distinct object once.
    prometheus-operator's kinds go to open stand-in CRDs (tests/e2e/conftest.py), so only
    their metadata is checked here; Managed Prometheus's are left out (serving their API
    would change what other tests render)."""
    install_monitoring_crds(cluster)
    # Each distinct object once, with the first combination that renders it.
    seen: set[str] = set()
    checked: dict[str, list[dict[str, Any]]] = {}
    for rendering in renderings:
        for document in rendering.documents:
            key = json.dumps(document, sort_keys=True)
            if key not in seen and not document["apiVersion"].startswith("monitoring.googleapis"):
                seen.add(key)
                checked.setdefault(rendering.values.name, []).append(document)
    namespaces = {NAMESPACE} | {
        d["metadata"]["namespace"]
        for documents in checked.values()
        for d in documents
        if d["metadata"].get("namespace")
    }
    existing = json.loads(cluster.kubectl("get", "namespaces", "-o", "json").stdout)["items"]
    for namespace in namespaces - {n["metadata"]["name"] for n in existing}:
        cluster.kubectl("create", "namespace", namespace)
    for values, documents in checked.items():
        stream = "\n---\n".join(json.dumps(d) for d in documents)
        result = cluster.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--server-side",
            "--field-manager=chart-check",
            "--force-conflicts",
            "-f",
            "-",
            input=stream,
            check=False,
        )
        assert result.returncode == 0, f"{values}:\n{result.stderr}"
        assert result.stdout.count("(server dry run)") == len(documents), result.stdout


def test_no_deprecated_or_removed_api_is_used(tools: Tools, renderings: list[Rendering]) -> None:
    """pluto against the newest Kubernetes the project runs (the local cluster's): an API
    deprecated by then, or removed, fails."""
    target = binaries.KUBERNETES.version
    for rendering in renderings:
        result = run(
            tools.pluto,
            "detect",
            "-",
            "--output=wide",
            f"--target-versions=k8s={target}",
            input=rendering.text,
        )
        assert result.returncode == 0, f"{rendering.values.name}:\n{result.stdout}{result.stderr}"
        assert "no resources found with known deprecated apiVersions" in result.stdout
