"""The chart's optional NetworkPolicy for the workers' control port
(``inPlaceRestarts.networkPolicy``): rendered with helm, accepted by the apiserver (server
dry run), only the operator's pods on the control port, every other port as before, and
the operator told which namespaces it guards.

The local cluster enforces no NetworkPolicy (no network plugin); what the policy lets
through is checked here on the rendered rules, what the operator does for pods it cannot
guard in tests/unit/test_inplace_reconciler.py.
"""

from __future__ import annotations

import json

import pytest

from localcluster.helm import CHART, values_file
from tests.e2e.conftest import RELEASE, RELEASE_NAMESPACE
from tpu_operator import contract

pytestmark = pytest.mark.e2e

ENABLED = {"inPlaceRestarts": {"networkPolicy": {"enabled": True}}}


def test_off_by_default(helm) -> None:
    documents = helm.template({})
    assert not [d for d in documents if d["kind"] == "NetworkPolicy"]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--control-network-policy")]


def test_only_the_operator_reaches_the_control_port(helm, cluster) -> None:
    values = {"watchNamespaces": ["team-a", "team-b"], **ENABLED}
    documents = helm.template(values)
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    operator_pod = deployment["spec"]["template"]
    args = operator_pod["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--control-network-policy")] == [
        "--control-network-policy=team-a",
        "--control-network-policy=team-b",
    ]
    port = contract.DEFAULT_CONTROL_PORT
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"] == {
            "matchExpressions": [{"key": contract.LABEL_SLICE_NAME, "operator": "Exists"}]
        }
        assert spec["policyTypes"] == ["Ingress"]
        control, rest = spec["ingress"]
        assert control["ports"] == [{"protocol": "TCP", "port": port}]
        (peer,) = control["from"]
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
        }
        # The operator's own pods match, nothing else of its namespace needs to.
        selector = peer["podSelector"]["matchLabels"]
        assert selector.items() <= operator_pod["metadata"]["labels"].items()
        assert "from" not in rest  # every other port, from anywhere
        tcp = sorted((p["port"], p["endPort"]) for p in rest["ports"] if p["protocol"] == "TCP")
        assert tcp == [(1, port - 1), (port + 1, 65535)]
        assert {p["protocol"] for p in rest["ports"] if "port" not in p} == {"UDP", "SCTP"}
        for other in (
            contract.DEFAULT_COORDINATOR_PORT,
            contract.DEFAULT_METRICS_PORT,
            contract.DEFAULT_MEGASCALE_PORT,
            *contract.LIBTPU_PORTS,
        ):
            assert any(lo <= other <= hi for lo, hi in tcp), other
    for namespace in ("team-a", "team-b"):
        cluster.kubectl("create", "namespace", namespace, check=False)
    stream = "\n---\n".join(json.dumps(p) for p in policies)
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=stream)
    assert result.stdout.count("(server dry run)") == 2
    # Namespaces of their own for a cluster-wide operator.
    cluster_wide = {"inPlaceRestarts": {"networkPolicy": {"enabled": True, "namespaces": ["ml"]}}}
    policies = [d for d in helm.template(cluster_wide) if d["kind"] == "NetworkPolicy"]
    assert [p["metadata"]["namespace"] for p in policies] == ["ml"]


def test_without_namespaces_the_chart_says_what_is_missing(helm) -> None:
    result = helm("template", RELEASE, str(CHART), "--values", values_file(ENABLED), check=False)
    assert result.returncode != 0
    assert "inPlaceRestarts.networkPolicy.namespaces" in result.stderr
