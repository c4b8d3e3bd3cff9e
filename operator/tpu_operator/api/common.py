"""Pieces shared by the TPUJob and TPUSlice models: base config, conditions, k8s extensions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields ignored.

    Unknown fields never reach the operator (the apiserver prunes or, with kubectl's
    strict field validation, rejects them), so ignoring them keeps an older operator
    working with objects written against a newer schema.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API stores it: camelCase keys, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def rules(*validations: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL ``x-kubernetes-validations``."""
    return {"x-kubernetes-validations": list(validations)}


def cel(
    rule: str,
    message: str = "",
    *,
    message_expression: str = "",
    field_path: str = "",
    reason: str = "",
) -> dict[str, str]:
    """One CEL validation rule with its message (static or computed)."""
    entry = {"rule": rule}
    if message:
        entry["message"] = message
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A standard Kubernetes condition."""

    type: str
    """Condition type, e.g. Ready, Running, Succeeded, Failed, Suspended, Invalid."""
    status: ConditionStatus
    reason: str = ""
    """One CamelCase word saying why the condition has its status."""
    message: str = ""
    """Human-readable details: what happened and what to do."""
    last_transition_time: str | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The .metadata.generation the condition was computed from."""


class Failure(ApiModel):
    """Why an attempt ended, as observed on its first failed worker."""

    attempt: int
    reason: str
    """What ended the attempt: Failed (non-zero exit), Evicted, NodeLost, PodDeleted,
    Stalled, SupervisorUnreachable or InPlaceRestartTimeout; a slice's own failure can also
    be InvalidPodTemplate."""
    message: str = ""
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    counted: bool = True
    """Whether this failure counted against failurePolicy.maxRestarts."""
    time: str | None = None
