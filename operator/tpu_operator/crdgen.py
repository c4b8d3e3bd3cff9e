"""Generate the TPUJob and TPUSlice CRDs from the pydantic models.

Pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined,
``Optional`` unwrapped, titles and null defaults dropped, CEL rules and
preserve-unknown-fields markers kept. ``tpu-operator crds --write`` writes ``crds/`` and the
chart's ``crds/``; a unit test fails when the committed files differ from the models.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tpu_operator import contract
from tpu_operator.api.job import TPUJobRoot, TPUJobSpec, TPUJobStatus
from tpu_operator.api.slice import TPUSliceRoot, TPUSliceSpec, TPUSliceStatus

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTPUT_DIRS = (REPO_ROOT / "crds", REPO_ROOT / "charts" / "tpu-operator" / "crds")

_DROP = {"title", "additionalProperties"}
_SCALARS = (str, int, float, bool)


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-Schema node as a Kubernetes structural schema node."""
    node = copy.deepcopy(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        node = {**copy.deepcopy(target), **node}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types in a CRD: {options}")
        node = {**structural(options[0], defs), **node}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        # JSON Schema 2020 writes exclusive bounds as numbers; OpenAPI v3.0 as a flag.
        if isinstance(node.get(bound), (int, float)) and not isinstance(node[bound], bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    if node.get("default", 0) is None or not isinstance(node.get("default"), _SCALARS):
        node.pop("default", None)
    additional = node.get("additionalProperties")
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROP and k != "$defs"}
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {
            name: structural(prop, defs) for name, prop in node["properties"].items()
        }
    elif isinstance(additional, dict):
        out["additionalProperties"] = structural(additional, defs)
    if "items" in node:
        out["items"] = structural(node["items"], defs)
    if "description" in out:
        out["description"] = " ".join(out["description"].split())
    return dict(sorted(out.items()))


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def _columns(kind: str) -> list[dict[str, Any]]:
    common_tail = [
        {
            "name": "Age",
            "type": "date",
            "jsonPath": ".metadata.creationTimestamp",
        }
    ]
    if kind == contract.JOB_KIND:
        return [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {
                "name": "Workers",
                "type": "string",
                "jsonPath": ".status.ready",
                "description": "Ready workers of the current attempt",
            },
            {
                "name": "Slices",
                "type": "string",
                "jsonPath": ".status.slicesReady",
                "description": "Slices with every worker ready",
            },
            {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
            {"name": "Type", "type": "string", "jsonPath": ".status.shape.type"},
            {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
            {
                "name": "Tokens/s",
                "type": "number",
                "jsonPath": ".status.progress.tokensPerSecond",
            },
            {
                "name": "MFU",
                "type": "number",
                "jsonPath": ".status.progress.mfu",
                "priority": 1,
            },
            {
                "name": "Goodput",
                "type": "number",
                "jsonPath": ".status.goodput.fraction",
                "priority": 1,
            },
            {
                "name": "Queue",
                "type": "string",
                "jsonPath": ".status.queue.state",
                "description": "Kueue: Queued, Admitted, Evicted ... (docs/tasks/kueue.md)",
                "priority": 1,
            },
            {
                "name": "Message",
                "type": "string",
                "jsonPath": ".status.message",
                "priority": 1,
            },
            *common_tail,
        ]
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Workers", "type": "string", "jsonPath": ".status.ready"},
        {"name": "Type", "type": "string", "jsonPath": ".status.shape.type"},
        {"name": "Pool", "type": "string", "jsonPath": ".status.nodePool"},
        {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        *common_tail,
    ]


def crd(
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    root: type[BaseModel],
    spec: type[BaseModel],
    status: type[BaseModel],
) -> dict[str, Any]:
    root_rules = root.model_json_schema()["x-kubernetes-validations"]
    schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(spec),
            "status": model_schema(status),
        },
        "x-kubernetes-validations": root_rules,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{contract.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "tpu-operator"},
        },
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": [contract.CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _columns(kind),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object."""
    return {
        f"{contract.GROUP}_{contract.JOB_PLURAL}.yaml": crd(
            contract.JOB_KIND,
            contract.JOB_PLURAL,
            ["tpuj"],
            "TPUJob runs JAX training on one or more GKE TPU slices: the operator creates one "
            "TPUSlice per slice, wires the workers for jax.distributed and Megascale, and "
            "restarts the whole gang when a worker fails.",
            TPUJobRoot,
            TPUJobSpec,
            TPUJobStatus,
        ),
        f"{contract.GROUP}_{contract.SLICE_PLURAL}.yaml": crd(
            contract.SLICE_KIND,
            contract.SLICE_PLURAL,
            ["tpus"],
            "TPUSlice is one TPU slice running one gang of worker pods, one per TPU VM. "
            "TPUJobs create them; a standalone TPUSlice serves or runs interactively.",
            TPUSliceRoot,
            TPUSliceSpec,
            TPUSliceStatus,
        ),
    }


HEADER = "# Generated by `tpu-operator crds --write` from tpu_operator.api; do not edit.\n"


def render(obj: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=100)


def write(directories: tuple[Path, ...] = OUTPUT_DIRS) -> list[Path]:
    written = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        for name, obj in crds().items():
            path = directory / name
            path.write_text(render(obj))
            written.append(path)
    return written


def render_all() -> str:
    """Every CRD as one multi-document YAML stream (for `tpu-operator crds`)."""
    return "---\n".join(render(obj) for obj in crds().values())
