"""The CRD rules on ports and identity env, generated from the contract: every name and
port they promise is in the rule and in its message (the apiserver evaluates them in
tests/operator/test_validation.py)."""

from __future__ import annotations

import json

import pytest

from tpu_operator import contract, crdgen
from tpu_operator.api.template import ports_words

pytestmark = pytest.mark.unit


def validations(path: list[str]) -> list[dict[str, str]]:
    crd = crdgen.crds()["tpu-operator.dev_tpujobs.yaml"]
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for name in path:
        node = node["properties"][name]
    return node["x-kubernetes-validations"]


def rule_with(path: list[str], fragment: str) -> dict[str, str]:
    (found,) = [v for v in validations(path) if fragment in v["rule"]]
    return found


def test_identity_env_rule_and_message_name_every_identity_variable():
    rule = rule_with(["spec", "template", "spec"], "c.env.all")
    assert json.dumps(list(contract.IDENTITY_ENV)) in rule["rule"]
    for name in contract.IDENTITY_ENV:
        assert name in rule["message"], name
    assert "TPU_PROCESS_ADDRESSES" in rule["message"]
    assert "TPU_PROCESS_PORT" not in rule["message"]  # a template may move the port


def test_ports_words_writes_runs_as_ranges():
    assert ports_words() == "8431-8438, 8471, 8476"
    assert ports_words(frozenset({1, 2, 3, 5, 7, 8})) == "1-3, 5, 7-8"
    assert contract.DEFAULT_TPU_PROCESS_PORT in contract.LIBTPU_PORTS


@pytest.mark.parametrize("field", ["coordinator", "megascale"])
def test_coordinator_and_megascale_ports_may_not_be_libtpus(field):
    rule = rule_with(["spec", "ports"], f"self.{field} in")
    assert str(sorted(contract.LIBTPU_PORTS)) in rule["rule"]
    assert rule["fieldPath"] == f".{field}"
    assert rule["message"].startswith(f"{field}: this port is libtpu's (8431-8438, 8471, 8476)")


def test_metrics_port_message_lists_every_reserved_port():
    rule = rule_with(["spec", "ports"], "self.metrics in")
    listed = rule["message"].split("(")[1].split(")")[0]
    assert listed == ports_words(contract.RESERVED_PORTS)
    for port in sorted(contract.RESERVED_PORTS):
        assert str(port) in rule["rule"]


def test_template_ports_named_as_the_operators_may_not_be_libtpus():
    rule = rule_with(["spec", "template", "spec"], "c.ports.all")
    for name in (contract.PORT_NAME_COORDINATOR, contract.PORT_NAME_METRICS):
        assert f'"{name}"' in rule["rule"]
    for port in sorted(contract.LIBTPU_PORTS):
        assert str(port) in rule["rule"]
    # unnamed ports (GKE's and xpk's samples declare 8471 and 8431) are not the rule's
    assert "!has(p.name)" in rule["rule"]
    assert "a port named coordinator or metrics" in rule["message"]
    assert "(8431-8438, 8471, 8476)" in rule["message"]
