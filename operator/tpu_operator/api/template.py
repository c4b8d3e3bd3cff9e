"""The worker pod template: a Kubernetes PodTemplateSpec, kept as the user wrote it.

The parts the operator reads or merges into are typed, so that ``kubectl apply`` rejects
a wrong type there with a message naming the field, and the operator never meets one:
of every container and init container its name, ``env`` (a list of objects with a name),
``resources`` (an object whose ``requests`` and ``limits`` map to quantities) and
``ports`` (objects with a port number in range); ``nodeSelector`` (strings),
``tolerations`` (objects), ``affinity`` down to the node selector terms, ``hostNetwork``
(a boolean), and the template's labels and annotations. Everything else, and the values
inside those parts (env values, toleration fields), is preserved unknown and validated by
the apiserver when the operator creates pods; a pod it rejects fails the job with
``InvalidPodTemplate``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic.config import JsonDict

from tpu_operator import contract
from tpu_operator.api.common import ApiModel, cel, rules

_PRESERVE: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float | str)):
        raise ValueError("must be a quantity: a number, or a string such as 500m or 1Gi")
    return value


Quantity = Annotated[
    Any,
    AfterValidator(_quantity),
    WithJsonSchema({**_PRESERVE, "pattern": QUANTITY_PATTERN}),
]
"""A resource quantity: a number, or a string such as 500m or 1Gi. The CRD checks strings
against the pattern (a structural schema cannot say "number or string"); another type
gets through the apiserver and is Invalid, naming the field, when the operator reads it."""


class OpenObject(ApiModel):
    """An object of the template: its declared fields typed, any other field kept as is."""

    model_config = {**ApiModel.model_config, "extra": "allow", "json_schema_extra": _PRESERVE}


class EnvVarName(OpenObject):
    name: str = Field(max_length=256)


class ResourceFields(OpenObject):
    """Compute resources; the operator sets google.com/tpu in requests and limits of the
    worker container (quantities are checked by the apiserver when it creates the pod)."""

    requests: dict[str, Quantity] | None = Field(default=None, max_length=64)
    limits: dict[str, Quantity] | None = Field(default=None, max_length=64)


class PortFields(OpenObject):
    """A container port; the operator adds its named ports unless these take them."""

    name: str | None = Field(default=None, max_length=15)
    container_port: int | None = Field(default=None, ge=1, le=65535)


class ContainerFields(OpenObject):
    name: str = Field(max_length=63)
    env: list[EnvVarName] | None = Field(default=None, max_length=512)
    resources: ResourceFields | None = None
    ports: list[PortFields] | None = Field(default=None, max_length=64)


class Toleration(OpenObject):
    pass


class Requirement(OpenObject):
    pass


class NodeSelectorTerm(OpenObject):
    match_expressions: list[Requirement] | None = Field(default=None, max_length=64)


class NodeSelectorFields(OpenObject):
    node_selector_terms: list[NodeSelectorTerm] | None = Field(default=None, max_length=64)


class NodeAffinityFields(OpenObject):
    required_during_scheduling_ignored_during_execution: NodeSelectorFields | None = None


class AffinityFields(OpenObject):
    """Pod affinity; with placement.spot false the operator ANDs a node selector
    requirement into every required node selector term."""

    node_affinity: NodeAffinityFields | None = None


def _identity_env() -> str:
    return json.dumps(list(contract.IDENTITY_ENV))


_OPERATOR_PORT_NAMES = (contract.PORT_NAME_COORDINATOR, contract.PORT_NAME_METRICS)
"""Container port names the operator gives its own ports (a template may take them)."""


def _operator_port_names() -> str:
    return json.dumps(list(_OPERATOR_PORT_NAMES))


def _libtpu_ports() -> str:
    return json.dumps(sorted(contract.LIBTPU_PORTS))


def ports_words(ports: frozenset[int] = contract.LIBTPU_PORTS) -> str:
    """``8431-8438, 8471, 8476``: a set of ports in words, runs as ranges."""
    ordered = sorted(ports)
    runs: list[list[int]] = []
    for port in ordered:
        if runs and port == runs[-1][-1] + 1:
            runs[-1].append(port)
        else:
            runs.append([port])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


class PodSpecFields(ApiModel):
    model_config = {
        **ApiModel.model_config,
        "extra": "allow",
        "json_schema_extra": {
            **_PRESERVE,
            **rules(
                cel(
                    f"self.containers.exists(c, c.name == '{contract.WORKER_CONTAINER}')",
                    f'containers: one container must be named "{contract.WORKER_CONTAINER}" '
                    "(it gets the TPU chips and the worker env); rename the training container",
                    field_path=".containers",
                    reason="FieldValueRequired",
                ),
                cel(
                    "self.containers.all(c, !has(c.env) || c.env.all(e, !(e.name in "
                    f"{_identity_env()})))",
                    f"containers[].env: {', '.join(contract.IDENTITY_ENV)} differ per pod "
                    "and are set by the operator; remove them from the template",
                    field_path=".containers",
                    reason="FieldValueForbidden",
                ),
                cel(
                    "self.containers.all(c, !has(c.ports) || c.ports.all(p, "
                    f"!has(p.name) || !(p.name in {_operator_port_names()}) || "
                    f"!has(p.containerPort) || !(p.containerPort in {_libtpu_ports()})))",
                    f"containers[].ports: a port named {' or '.join(_OPERATOR_PORT_NAMES)} "
                    f"is the worker's {'/'.join(_OPERATOR_PORT_NAMES)} port and must not be "
                    f"one libtpu uses ({ports_words()}); pick another, e.g. "
                    f"{contract.DEFAULT_COORDINATOR_PORT} or {contract.DEFAULT_METRICS_PORT}",
                    field_path=".containers",
                    reason="FieldValueForbidden",
                ),
                cel(
                    "!has(self.restartPolicy) || self.restartPolicy == 'Never'",
                    "restartPolicy: worker pods run with restartPolicy Never (the operator "
                    "restarts the whole gang); leave it unset or set Never",
                    field_path=".restartPolicy",
                ),
            ),
        },
    }
    containers: list[ContainerFields] = Field(min_length=1, max_length=64)
    init_containers: list[ContainerFields] | None = Field(default=None, max_length=64)
    """Typed as the containers are, so that their quantities are checked at apply too."""
    restart_policy: str | None = None
    node_selector: dict[str, str] | None = Field(default=None, max_length=64)
    tolerations: list[Toleration] | None = Field(default=None, max_length=128)
    affinity: AffinityFields | None = None
    host_network: bool | None = None


class PodTemplateMetadata(ApiModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class PodTemplate(ApiModel):
    """A PodTemplateSpec (metadata and spec) for the worker pods."""

    model_config = {**ApiModel.model_config, "extra": "allow", "json_schema_extra": _PRESERVE}
    metadata: PodTemplateMetadata | None = None
    spec: PodSpecFields
