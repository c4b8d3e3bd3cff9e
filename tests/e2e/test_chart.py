"""The chart as rendered for clusters that differ from the e2e one: with or without
prometheus-operator's and Managed Service for Prometheus's APIs, every tuning flag of
the operator reachable from a value, the install notes.

These run before test_product.py (which installs the release) and need no release.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from localcluster.helm import CHART, HelmError, values_file
from localcluster.prometheus import PROMETHEUS_OPERATOR_APIS
from localcluster.testing import wait_until
from tests.e2e.conftest import (
    MONITORING_KINDS,
    RELEASE_NAMESPACE,
    ReleaseHelm,
    install_monitoring_crds,
)
from tpu_operator import cli, contract

pytestmark = pytest.mark.e2e

MONITORS = {
    "serviceMonitor": {"enabled": True},
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
}
MANAGED = "monitoring.googleapis.com/v1/PodMonitoring"
NOT_CHART_VALUES = {
    "--help": "argparse's",
    "--kubeconfig": "a pod uses its ServiceAccount (in-cluster configuration)",
}
"""``tpu-operator run`` flags the chart has no value for, and why."""


def kinds(documents: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in documents}


def test_monitors_and_rules_are_rendered_only_where_their_apis_are_served(helm: ReleaseHelm):
    without = helm.template({**MONITORS, "managedPrometheus": {"enabled": True}}, api_versions=())
    assert not kinds(without) & {*MONITORING_KINDS, "PodMonitoring", "ClusterPodMonitoring"}
    # The scraper account for Managed Prometheus is not made either, nor bound.
    assert not [d for d in without if d["metadata"]["name"].endswith("-metrics-scraper")]
    with_them = helm.template(MONITORS, api_versions=PROMETHEUS_OPERATOR_APIS)
    assert set(MONITORING_KINDS) <= kinds(with_them)
    only_monitors = helm.template(MONITORS, api_versions=PROMETHEUS_OPERATOR_APIS[:1])
    assert "ServiceMonitor" in kinds(only_monitors)
    assert not {"PodMonitor", "PrometheusRule"} & kinds(only_monitors)


def test_the_service_monitor_scrapes_over_https_with_the_scraper_s_token(helm: ReleaseHelm):
    reader = {"namespace": "monitoring", "name": "prometheus"}
    documents = helm.template({**MONITORS, "metrics": {"auth": {"readers": [reader]}}})
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    roles = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ClusterRole"}
    assert roles["tpu-operator-metrics-reader"]["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    ]
    assert roles["tpu-operator-metrics-auth"]["rules"] == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        },
    ]
    bindings = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ClusterRoleBinding"}
    assert bindings["tpu-operator-metrics-reader"]["subjects"] == [
        {"kind": "ServiceAccount", **reader}
    ]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert "--metrics-auth" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    verified = {"ca": {"secret": {"name": "metrics-ca", "key": "ca.crt"}}, "serverName": "x"}
    custom = helm.template(
        {
            **MONITORS,
            "serviceMonitor": {"enabled": True, "tlsConfig": verified},
            "metrics": {"auth": {"certSecret": "metrics-cert"}},
        }
    )
    (monitor,) = [d for d in custom if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["tlsConfig"] == verified
    pod = next(d for d in custom if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--metrics-cert-dir=/etc/tpu-operator/metrics-cert" in pod["containers"][0]["args"]
    assert {"name": "metrics-cert", "secret": {"secretName": "metrics-cert"}} in pod["volumes"]

    open_ = helm.template({**MONITORS, "metrics": {"auth": {"enabled": False}}})
    (monitor,) = [d for d in open_ if d["kind"] == "ServiceMonitor"]
    assert not {"scheme", "bearerTokenFile", "tlsConfig"} & set(monitor["spec"]["endpoints"][0])
    assert not [d for d in open_ if d["metadata"]["name"].endswith(("-metrics-auth", "-reader"))]
    args = next(d for d in open_ if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--no-metrics-auth" in args["containers"][0]["args"]


def test_managed_prometheus_scrapes_the_operator_with_a_token_and_the_workers_as_labelled(
    helm: ReleaseHelm,
):
    documents = helm.template({"managedPrometheus": {"enabled": True}}, api_versions=(MANAGED,))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in documents:
        by_kind.setdefault(d["kind"], []).append(d)
    (operator,) = by_kind["PodMonitoring"]
    assert operator["metadata"]["namespace"] == RELEASE_NAMESPACE
    (endpoint,) = operator["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
    assert endpoint["tls"] == {"insecureSkipVerify": True}
    scraper = "tpu-operator-metrics-scraper"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"secret": {"name": scraper, "key": "token"}},
    }
    token = next(d for d in by_kind["Secret"] if d["metadata"]["name"] == scraper)
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": scraper}
    reader = next(
        d for d in by_kind["ClusterRoleBinding"] if d["metadata"]["name"].endswith("-reader")
    )
    assert {"kind": "ServiceAccount", "name": scraper, "namespace": RELEASE_NAMESPACE} in reader[
        "subjects"
    ]
    secret_role = next(d for d in by_kind["Role"] if d["metadata"]["name"] == f"{scraper}-token")
    assert secret_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [scraper],
            "verbs": ["get", "list", "watch"],
        }
    ]
    collector = next(
        d for d in by_kind["RoleBinding"] if d["metadata"]["name"] == f"{scraper}-token"
    )
    assert collector["subjects"] == [
        {"kind": "ServiceAccount", "name": "collector", "namespace": "gmp-system"}
    ]

    (workers,) = by_kind["ClusterPodMonitoring"]
    assert "namespace" not in workers["metadata"]
    spec = workers["spec"]
    assert spec["selector"] == {
        "matchExpressions": [{"key": contract.LABEL_SLICE_NAME, "operator": "Exists"}]
    }
    assert spec["endpoints"] == [{"port": "metrics", "interval": "15s"}]
    labels = {m["from"]: m["to"] for m in spec["targetLabels"]["fromPod"]}
    assert labels == {
        contract.LABEL_JOB_NAME: "tpujob",
        contract.LABEL_SLICE_INDEX: "slice",
        contract.LABEL_WORKER_INDEX: "worker",
        contract.LABEL_RESTART_ATTEMPT: "attempt",
    }
    # ClusterPodMonitoring's permitted metadata labels (GMP's API reference).
    permitted = {"container", "namespace", "node", "pod", "top_level_controller_name"}
    assert set(spec["targetLabels"]["metadata"]) <= permitted | {"top_level_controller_type"}

    per_namespace = helm.template(
        {"managedPrometheus": {"enabled": True}, "podMonitor": {"namespaces": ["a", "b"]}},
        api_versions=(MANAGED,),
    )
    monitors = [d for d in per_namespace if d["kind"] == "PodMonitoring"]
    assert sorted(d["metadata"]["namespace"] for d in monitors) == ["a", "b", RELEASE_NAMESPACE]
    assert "ClusterPodMonitoring" not in kinds(per_namespace)
    for monitor in monitors:
        # PodMonitoring permits no namespace target label (it is always the monitor's).
        assert "namespace" not in monitor["spec"].get("targetLabels", {}).get("metadata", [])


def run_flags() -> set[str]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {o for a in run._actions for o in a.option_strings if o.startswith("--")}


def rendered_flags(documents: list[dict[str, Any]]) -> set[str]:
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def test_every_flag_of_the_operator_has_a_chart_value(helm: ReleaseHelm):
    everything = helm.template(
        {
            "watchNamespaces": ["team-a"],
            "kueue": {"enabled": True},
            "inPlaceRestarts": {"networkPolicy": {"enabled": True}},
            "operator": {"verbose": True},
            "metrics": {"auth": {"certSecret": "metrics-cert"}},
            "placement": {"spareNodePoolSelector": {"example.com/pool-role": "spare", "b": "x"}},
        }
    )
    nothing = helm.template(
        {
            "replicas": 1,
            "leaderElection": {"enabled": False},
            "inPlaceRestarts": {"enabled": False},
            "metrics": {"auth": {"enabled": False}},
        }
    )
    flags = rendered_flags(everything) | rendered_flags(nothing)
    missing = run_flags() - set(NOT_CHART_VALUES) - flags
    # --no-X (BooleanOptionalAction) is the same flag as --X.
    missing -= {f"--{f.removeprefix('--no-')}" for f in flags if f.startswith("--no-")}
    assert not missing, f"flags of `tpu-operator run` with no chart value: {sorted(missing)}"
    tuned = helm.template(
        {
            "operator": {
                "sampleConcurrency": 7,
                "reconcileMinIntervalSeconds": 0.25,
                "reconcileSettleSeconds": 0,
                "gcThreshold": 1000000,
                "eventLoop": "asyncio",
            }
        }
    )
    args = next(d for d in tuned if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    for flag in (
        "--sample-concurrency=7",
        "--reconcile-min-interval=0.25",
        "--reconcile-settle=0",
        "--gc-threshold=1000000",
        "--event-loop=asyncio",
    ):
        assert flag in args
    parsed = cli._parser().parse_args(args)  # the rendered arguments parse
    assert parsed.gc_threshold == 1_000_000 and parsed.reconcile_min_interval == 0.25
    assert parsed.event_loop == "asyncio"
    spares = next(d for d in everything if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    # Sorted by key, so that a values file's order changes no rollout.
    assert "--spare-node-pool-selector=b=x,example.com/pool-role=spare" in spares


def test_user_roles_aggregate_into_edit_and_view(helm: ReleaseHelm):
    roles = {d["metadata"]["name"]: d for d in helm.template({}) if d["kind"] == "ClusterRole"}
    edit, view = roles["tpu-operator-edit"], roles["tpu-operator-view"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {
        f"{aggregate}view"
    }
    off = helm.template({"rbac": {"aggregateToDefaultRoles": False}})
    assert not [d for d in off if d["metadata"]["name"].endswith(("-edit", "-view"))]


def _served_groups(cluster) -> set[str]:
    return {v["groupVersion"] for g in cluster.api().get("/apis")["groups"] for v in g["versions"]}


def test_install_notes_name_the_monitors_this_cluster_cannot_take(cluster, helm: ReleaseHelm):
    """Installed where neither prometheus-operator nor Managed Prometheus is, with all of
    them asked for: the install goes through without them and the notes say so."""
    crds = [f"{plural}.monitoring.coreos.com" for plural in MONITORING_KINDS.values()]
    cluster.kubectl("delete", "crd", *crds, "--ignore-not-found", "--wait=true", timeout=120)
    try:
        wait_until(
            lambda: "monitoring.coreos.com/v1" not in _served_groups(cluster),
            timeout=60,
            message="monitoring.coreos.com/v1 to be gone from discovery",
        )
        values = {**MONITORS, "managedPrometheus": {"enabled": True}}
        out = helm(
            "install",
            "notes-check",
            str(CHART),
            "--namespace",
            "default",
            "--dry-run=server",
            "--values",
            values_file(values),
        ).stdout
        manifest, notes = out.split("NOTES:", 1)
        for kind in (*MONITORING_KINDS, "PodMonitoring", "ClusterPodMonitoring"):
            assert f"kind: {kind}\n" not in manifest
        flat = " ".join(notes.split())
        assert (
            "NOT CREATED: serviceMonitor (ServiceMonitor), podMonitor (PodMonitor), "
            "prometheusRule (PrometheusRule). This cluster does not serve "
            "monitoring.coreos.com/v1" in flat
        )
        assert "--set managedPrometheus.enabled=true" in flat
        assert "NOT CREATED: managedPrometheus (PodMonitoring, ClusterPodMonitoring)" in flat
    finally:
        install_monitoring_crds(cluster)
    again = helm(
        "install",
        "notes-check",
        str(CHART),
        "--namespace",
        "default",
        "--dry-run=server",
        "--values",
        values_file(MONITORS),
    ).stdout
    manifest, notes = again.split("NOTES:", 1)
    assert "NOT CREATED" not in notes
    assert "kind: ServiceMonitor\n" in manifest and "kind: PrometheusRule\n" in manifest


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"podSecurityContext": {"runAsUsr": 5}}, "additional properties 'runAsUsr' not allowed"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"podSecurityContext": {"runAsUser": "65532"}}, "/podSecurityContext/runAsUser"),
        ({"securityContext": {"privileged": True}}, "/securityContext/privileged"),
        ({"securityContext": {"allowPrivilegeEscalation": True}}, "allowPrivilegeEscalation"),
        (
            {"securityContext": {"capabilities": {"drop": "ALL"}}},
            "/securityContext/capabilities/drop",
        ),
        ({"securityContext": {"seccompProfile": {"type": "Open"}}}, "seccompProfile/type"),
    ],
)
def test_security_contexts_are_checked_against_the_kubernetes_fields(
    helm: ReleaseHelm, values, said
):
    """The chart's schema knows the fields of a PodSecurityContext and a SecurityContext,
    refuses any other (a typo would otherwise be dropped without a word) and any value
    that would give the operator a privilege it never needs."""
    with pytest.raises(HelmError) as refused:
        helm.template(values)
    assert said in str(refused.value)
    assert helm.template({"podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000}})
