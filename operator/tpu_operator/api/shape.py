"""Slice shape fields (``type`` or ``accelerator`` + ``topology``) and their CEL rules.

The rules are generated from the accelerator catalog, so ``kubectl apply`` rejects a shape
the catalog does not know with a message naming the field and the valid choices, and the
operator resolves the same fields with the same catalog (``resolve``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal, get_args

from pydantic import Field

from tpu_operator import catalog
from tpu_operator.api.common import ApiModel, cel

Accelerator = Literal[
    "tpu-v4-podslice", "tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x"
]
assert set(get_args(Accelerator)) == set(catalog.BY_ACCELERATOR), "catalog and API disagree"
DynamicSlicing = Literal["SuperSlice", "SubSlice"]
assert get_args(DynamicSlicing) == catalog.DYNAMIC_SLICING_KINDS, "catalog and API disagree"


def _literal(value: Any) -> str:
    """A CEL literal for a JSON-compatible Python value."""
    return json.dumps(value, separators=(",", ":"))


def _topologies_by_accelerator() -> str:
    return _literal({g.accelerator: list(catalog.valid_topologies(g)) for g in catalog.GENERATIONS})


def _descriptions() -> str:
    return _literal(
        {g.accelerator: catalog.describe_valid_topologies(g) for g in catalog.GENERATIONS}
    )


def _single_host() -> str:
    return _literal({g.accelerator: sorted(g.single_host) for g in catalog.GENERATIONS})


def _type_info() -> str:
    """short type -> [chips, hosts at the default chips per VM]."""
    table = {}
    for short, (accelerator, topology) in catalog.short_types().items():
        resolved = catalog.shape(accelerator, topology)
        table[short] = [resolved.chips, resolved.hosts]
    return _literal(table)


def _ambiguous() -> tuple[dict[str, list[str]], list[str], list[int]]:
    """Shapes that fit two machine types: accelerator -> topologies, short types, choices."""
    by_accelerator: dict[str, list[str]] = {}
    choices: set[int] = set()
    for generation in catalog.GENERATIONS:
        for topology in generation.single_host:
            options = catalog.chips_per_host_choices(generation, topology)
            if len(options) > 1:
                by_accelerator.setdefault(generation.accelerator, []).append(topology)
                choices.update(options)
    types = sorted(
        short
        for short, (accelerator, topology) in catalog.short_types().items()
        if topology in by_accelerator.get(accelerator, [])
    )
    return by_accelerator, types, sorted(choices)


MULTI_HOST_CHIPS_PER_VM = {g.multi_host_chips_per_vm for g in catalog.GENERATIONS}
assert {4} == MULTI_HOST_CHIPS_PER_VM, "the CEL host count assumes 4-chip multi-host VMs"


def chips_expr(s: str) -> str:
    """CEL: number of chips of the shape at path ``s``."""
    parts = f"{s}.topology.split('x')"
    product = f"int({parts}[0]) * int({parts}[1]) * (size({parts}) == 3 ? int({parts}[2]) : 1)"
    return f"(has({s}.type) ? {_type_info()}[{s}.type][0] : {product})"


def hosts_expr(s: str) -> str:
    """CEL: hosts (VMs) of the shape at path ``s``; mirrors SliceShape.hosts."""
    default_hosts = (
        f"(has({s}.type) ? {_type_info()}[{s}.type][1] : "
        f"({s}.topology in {_single_host()}[{s}.accelerator] ? 1 : {chips_expr(s)} / 4))"
    )
    return f"(has({s}.chipsPerHost) ? {chips_expr(s)} / {s}.chipsPerHost : {default_hosts})"


def shape_rules() -> list[dict[str, str]]:
    """CEL rules for an object holding the shape fields (evaluated at that object)."""
    known_types = _literal(sorted(catalog.short_types()))
    ambiguous, ambiguous_types, choices = _ambiguous()
    return [
        cel(
            "has(self.type) != has(self.accelerator)",
            "set either type (e.g. v5p-128, v5litepod-16, v6e-16) or accelerator and "
            "topology (e.g. tpu-v5p-slice and 4x4x4), not both and not neither",
        ),
        cel(
            "has(self.accelerator) == has(self.topology)",
            "accelerator and topology go together: set both (e.g. tpu-v5p-slice, 4x4x4)",
        ),
        cel(
            f"!has(self.type) || self.type in {known_types}",
            message_expression=(
                "'type: ' + self.type + ' is not a known TPU type; use the form v4-N, v5p-N "
                "(N = TensorCores, 2 per chip), v5litepod-N, v6e-N (N = chips) or tpu7x-N, "
                "e.g. v5p-128 (4x4x4), v5litepod-16 (4x4), v6e-256 (16x16)'"
            ),
            field_path=".type",
            reason="FieldValueInvalid",
        ),
        cel(
            f"!has(self.accelerator) || self.topology in "
            f"{_topologies_by_accelerator()}[self.accelerator]",
            message_expression=(
                f"'topology: ' + self.topology + ' is not valid for ' + self.accelerator + "
                f"'; valid: ' + {_descriptions()}[self.accelerator]"
            ),
            field_path=".topology",
            reason="FieldValueInvalid",
        ),
        cel(
            "!has(self.chipsPerHost) || ((has(self.accelerator) ? "
            f"(self.accelerator in {_literal(ambiguous)} && "
            f"self.topology in {_literal(ambiguous)}[self.accelerator]) : "
            f"self.type in {_literal(ambiguous_types)}) && "
            f"self.chipsPerHost in {_literal(choices)})",
            "chipsPerHost only chooses the machine type where a topology fits two: v5e and "
            "v6e 2x4 run on one 8-chip VM (chipsPerHost: 8, the default) or two 4-chip VMs "
            "(chipsPerHost: 4); leave it unset otherwise",
            field_path=".chipsPerHost",
        ),
        *dynamic_slicing_rules(),
    ]


def dynamic_slicing_rules() -> list[dict[str, str]]:
    """``dynamicSlicing``: Ironwood only, with the shapes each kind can have."""
    acc = catalog.DYNAMIC_SLICING_ACCELERATOR
    subs = list(catalog.SUB_SLICE_TOPOLOGIES)
    small = list(catalog.BY_ACCELERATOR[acc].small_topologies)
    return [
        cel(
            f"!has(self.dynamicSlicing) || (has(self.accelerator) && self.accelerator == '{acc}')",
            "dynamicSlicing (Ironwood dynamic slicing) needs accelerator: tpu7x with a "
            "topology, e.g. 4x4x8 (SuperSlice) or 2x2x2 (SubSlice); other accelerators and "
            "short types run on node pools of their shape",
            field_path=".dynamicSlicing",
        ),
        cel(
            "!has(self.dynamicSlicing) || self.dynamicSlicing != 'SubSlice' || "
            f"!has(self.topology) || self.topology in {_literal(subs)}",
            message_expression=(
                "'dynamicSlicing: a SubSlice is cut from one 4x4x4 cube, so topology must "
                f"be one of {', '.join(subs)}, not ' + self.topology + "
                "' (4x4x4 and larger are SuperSlices)'"
            ),
            field_path=".topology",
            reason="FieldValueInvalid",
        ),
        cel(
            "!has(self.dynamicSlicing) || self.dynamicSlicing != 'SuperSlice' || "
            f"!has(self.topology) || !(self.topology in {_literal(small)})",
            message_expression=(
                "'dynamicSlicing: a SuperSlice is made of whole 4x4x4 cubes, so topology "
                "must be AxBxC with each a multiple of 4 and A<=B<=C (e.g. 4x4x4, 4x4x8, "
                "8x8x8), not ' + self.topology + ' (smaller shapes are SubSlices)'"
            ),
            field_path=".topology",
            reason="FieldValueInvalid",
        ),
    ]


class ShapeFields(ApiModel):
    """The TPU slice shape: a short ``type`` or an ``accelerator`` with a ``topology``."""

    type: str | None = Field(default=None, max_length=32, pattern=r"^[a-z0-9]+-[0-9]+$")
    """Short TPU type, as Cloud TPU names it: v4-N, v5p-N and tpu7x-N count TensorCores
    (v5p-128 = 64 chips = 4x4x4); v5litepod-N and v6e-N count chips (v6e-16 = 4x4)."""
    accelerator: Accelerator | None = None
    """GKE accelerator (node label cloud.google.com/gke-tpu-accelerator)."""
    topology: str | None = Field(
        default=None, max_length=16, pattern=r"^[1-9][0-9]*x[1-9][0-9]*(x[1-9][0-9]*)?$"
    )
    """Chip topology, e.g. 2x4, 4x4 (v5e, v6e) or 2x2x2, 4x4x4 (v4, v5p, tpu7x)."""
    chips_per_host: int | None = Field(default=None, ge=1, le=8)
    """Chips per VM where a topology fits two machine types (v5e/v6e 2x4: 8 or 4)."""
    dynamic_slicing: DynamicSlicing | None = None
    """(tpu7x only) Ironwood dynamic slicing: GKE's slice controller forms the slice when
    it runs out of 4x4x4 cubes (reservation sub-blocks) instead of the slice taking a node
    pool of its shape. SuperSlice: whole cubes stitched together (topology AxBxC, each a
    multiple of 4, A<=B<=C, e.g. 4x4x8). SubSlice: part of one cube (2x2x1, 2x2x2, 2x2x4
    or 2x4x4). The operator forms a Slice (accelerator.gke.io) of healthy cubes for each
    attempt; docs/tasks/dynamic-slicing.md."""

    def resolve(self) -> catalog.SliceShape:
        """The catalog shape; raises CatalogError with the valid choices."""
        if self.type is not None:
            if self.dynamic_slicing is not None:
                raise catalog.CatalogError(
                    "dynamicSlicing needs accelerator: tpu7x and a topology, not a type"
                )
            return catalog.from_short_type(self.type, self.chips_per_host)
        if self.accelerator is None or self.topology is None:
            raise catalog.CatalogError("set type, or accelerator and topology")
        resolved = catalog.shape(self.accelerator, self.topology, self.chips_per_host)
        if self.dynamic_slicing is None:
            return resolved
        error = catalog.dynamic_slicing_error(self.dynamic_slicing, self.accelerator, self.topology)
        if error:
            raise catalog.CatalogError(error)
        return replace(resolved, dynamic=self.dynamic_slicing)


def valid_shape_expr(s: str) -> str:
    """CEL: the shape at ``s`` is one the catalog knows (guards the lookups of other rules)."""
    return (
        f"(has({s}.type) ? {s}.type in {_literal(sorted(catalog.short_types()))} : "
        f"(has({s}.accelerator) && has({s}.topology) && "
        f"{s}.topology in {_topologies_by_accelerator()}[{s}.accelerator]))"
    )


def name_rule(shape_path: str, suffix_digits: str, kind: str) -> dict[str, str]:
    """CEL at an object's root: its name keeps every pod hostname within 63 characters.

    Pod names are ``<name>-<worker>`` for a TPUSlice and ``<name>-<slice>-<worker>`` for a
    TPUJob (``suffix_digits`` counts the extra ``-<slice>`` characters).
    """
    hosts = hosts_expr(shape_path)
    pattern = "<name>-<worker>" if suffix_digits == "0" else "<name>-<slice>-<worker>"
    length = f"size(self.metadata.name) + {suffix_digits} + 1 + size(string({hosts} - 1))"
    return cel(
        f"!{valid_shape_expr(shape_path)} || {length} <= 63",
        f"metadata.name is too long: every worker pod's hostname ({pattern}) must fit in "
        f"63 characters; shorten the {kind} name",
        reason="FieldValueInvalid",
    )


def dns_label_rule(kind: str) -> dict[str, str]:
    return cel(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name: a {kind} name is also its headless Service's name, so it must be a "
        "DNS label: lowercase letters, digits and '-', starting with a letter",
    )
