"""The TPU accelerator catalog: one record per generation, as data, and lookups over it.

Every other part (CRD validation rules, pod builder, worker MFU) reads TPU facts from here.
Facts per generation, with where they come from:

- GKE node label values, machine types and chips per VM, single- vs multi-host shapes:
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus,
  https://cloud.google.com/kubernetes-engine/docs/concepts/tpus,
  https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood,
  https://cloud.google.com/compute/docs/tpus/tpu-machines
- Topologies, TensorCores per chip, peak bf16 FLOP/s, HBM:
  https://cloud.google.com/tpu/docs/v4, https://cloud.google.com/tpu/docs/v5e,
  https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v6e,
  https://cloud.google.com/tpu/docs/tpu7x, https://cloud.google.com/tpu/docs/types-topologies
- Short accelerator types (``v5p-128``) and their default topologies:
  https://cloud.google.com/tpu/docs/supported-tpu-configurations; the per-size defaults of
  the larger 3-D shapes follow xpk's system characteristics
  (github.com/AI-Hypercomputer/xpk, src/xpk/core/system_characteristics.py), which also
  name every other size: the first valid topology of that chip count (``named_topologies``).
- Which 3-D topologies GKE accepts: xpk's ``generate_tpu_topologies`` (each dimension a
  multiple of 4 up to 256, at most ``max_cubes`` 4x4x4 cubes, A<=B<=C except for v4, where
  every ordering is valid: v4 8x4x4 and 4x8x4 are node pools of their own).
- TPU7x (Ironwood): tpu7x-standard-1t (1x1x1) and tpu7x-standard-4t (4 chips per VM, two
  TensorCores per chip, each its own JAX device), 9,216 chips (144 cubes) per pod; libtpu
  there takes its peers from TPU_PROCESS_ADDRESSES (``process_addresses``).
- JAX ``device_kind`` strings: jax/_src/tpu_info.py (formerly
  jax/_src/pallas/mosaic/tpu_info.py) in github.com/jax-ml/jax.

Short types count TensorCores for v4, v5p and TPU7x (v5p-128 is 64 chips, 4x4x4) and
chips for v5e and v6e (v6e-16 is 16 chips, 4x4). Hosts per slice = chips / chips per VM.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

TOPOLOGY_PATTERN = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")
SHORT_TYPE_PATTERN = re.compile(r"^(?P<prefix>[a-z0-9]+(?:[a-z]+)?)-(?P<count>[1-9][0-9]*)$")


@dataclass(frozen=True)
class CubeRule:
    """Large 3-D shapes: every dimension a multiple of ``unit``, sorted, at most ``max_cubes``."""

    unit: int = 4
    max_cubes: int = 64
    max_dim: int = 256
    nondecreasing: bool = True


@dataclass(frozen=True)
class Generation:
    """One TPU generation as GKE exposes it."""

    name: str
    accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    short_prefix: str  # prefix of the short accelerator type, e.g. "v5p" in v5p-128
    short_counts: Literal["chips", "tensorcores"]
    dims: int  # 2-D or 3-D topologies
    tensorcores_per_chip: int
    jax_devices_per_chip: int  # TPU7x exposes each TensorCore as its own JAX device
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_chip: int
    device_kinds: tuple[str, ...]  # jax Device.device_kind values
    machine_types: dict[str, int]  # GKE machine type -> chips per VM
    single_host: dict[str, int]  # single-host topology -> chips of its (one) VM
    multi_host_chips_per_vm: int
    small_topologies: tuple[str, ...]  # listed shapes (all of them for 2-D generations)
    cube_rule: CubeRule | None
    default_topology: dict[int, str]  # chips -> topology a short type resolves to
    extra_short_names: tuple[str, ...] = field(default=())
    # libtpu on this generation reads TPU_PROCESS_ADDRESSES / TPU_PROCESS_PORT (Ironwood).
    process_addresses: bool = False

    def short_type(self, chips: int) -> str:
        count = chips * self.tensorcores_per_chip if self.short_counts == "tensorcores" else chips
        return f"{self.short_prefix}-{count}"


_GI = 1024**3
_GB = 1000**3

# Canonical 3-D shape per chip count for v5p and TPU7x short types (xpk's defaults).
_CUBE_DEFAULTS = [
    "2x2x1",
    "2x2x2",
    "2x2x4",
    "2x4x4",
    "4x4x4",
    "4x4x8",
    "4x4x12",
    "4x8x8",
    "4x4x20",
    "4x8x12",
    "4x4x28",
    "8x8x8",
    "4x12x12",
    "4x8x20",
    "4x4x44",
    "8x8x12",
    "4x4x52",
    "4x8x28",
    "4x12x20",
    "8x8x16",
    "4x4x68",
    "8x12x12",
    "4x4x76",
    "8x8x20",
    "4x12x28",
    "4x8x44",
    "4x4x92",
    "8x12x16",
    "4x20x20",
    "4x8x52",
    "12x12x12",
    "8x8x28",
    "4x4x116",
    "8x12x20",
    "4x4x124",
    "8x16x16",
    "4x12x44",
    "4x8x68",
    "4x20x28",
    "12x12x16",
    "4x4x148",
    "4x8x76",
    "4x12x52",
    "8x16x20",
    "4x4x164",
    "8x12x28",
    "4x4x172",
    "8x8x44",
    "12x12x20",
    "4x8x92",
    "4x4x188",
    "12x16x16",
    "4x28x28",
    "8x20x20",
    "4x12x68",
    "8x8x52",
    "4x4x212",
    "12x12x24",
    "4x20x44",
    "8x16x28",
    "4x12x76",
    "4x8x116",
    "4x4x236",
    "12x16x20",
    "4x4x244",
    "4x8x124",
    "12x12x28",
    "16x16x16",
    "4x20x52",
    "8x12x44",
    "8x8x68",
    "4x12x92",
    "8x20x28",
    "12x16x24",
    "4x8x148",
    "12x20x20",
    "8x8x76",
    "4x28x44",
    "8x12x52",
    "16x16x20",
    "12x12x36",
    "4x8x164",
    "12x16x28",
    "4x20x68",
    "4x8x172",
    "4x12x116",
    "8x16x44",
    "12x20x24",
    "4x28x52",
    "8x8x92",
    "4x12x124",
    "4x8x188",
    "4x20x76",
    "16x16x24",
    "12x24x24",
    "16x20x28",
]
_V4_DEFAULTS = [
    "2x2x1",
    "2x2x2",
    "2x2x4",
    "2x4x4",
    "4x4x4",
    "4x4x8",
    "4x4x12",
    "4x8x8",
    "8x8x8",
    "8x8x12",
    "8x8x16",
    "8x16x16",
]
_PLANAR = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")


def _chips(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def _by_chips(topologies: list[str] | tuple[str, ...]) -> dict[int, str]:
    table: dict[int, str] = {}
    for topology in topologies:
        table.setdefault(_chips(topology), topology)
    return table


GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="v4",
        accelerator="tpu-v4-podslice",
        short_prefix="v4",
        short_counts="tensorcores",
        dims=3,
        tensorcores_per_chip=2,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=275e12,
        hbm_bytes_per_chip=32 * _GI,
        device_kinds=("TPU v4",),
        machine_types={"ct4p-hightpu-4t": 4},
        single_host={"2x2x1": 4},
        multi_host_chips_per_vm=4,
        small_topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_rule=CubeRule(unit=4, max_cubes=64, nondecreasing=False),
        default_topology=_by_chips(_V4_DEFAULTS),
    ),
    Generation(
        name="v5e",
        accelerator="tpu-v5-lite-podslice",
        short_prefix="v5litepod",
        short_counts="chips",
        dims=2,
        tensorcores_per_chip=1,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=197e12,
        hbm_bytes_per_chip=16 * _GB,
        device_kinds=("TPU v5 lite", "TPU v5e"),
        machine_types={"ct5lp-hightpu-1t": 1, "ct5lp-hightpu-4t": 4, "ct5lp-hightpu-8t": 8},
        single_host={"1x1": 1, "2x2": 4, "2x4": 8},
        multi_host_chips_per_vm=4,
        small_topologies=_PLANAR,
        cube_rule=None,
        default_topology=_by_chips(_PLANAR),
        extra_short_names=("v5e",),
    ),
    Generation(
        name="v5p",
        accelerator="tpu-v5p-slice",
        short_prefix="v5p",
        short_counts="tensorcores",
        dims=3,
        tensorcores_per_chip=2,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=459e12,
        hbm_bytes_per_chip=95 * _GI,
        device_kinds=("TPU v5", "TPU v5p"),
        machine_types={"ct5p-hightpu-4t": 4},
        single_host={"2x2x1": 4},
        multi_host_chips_per_vm=4,
        small_topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_rule=CubeRule(unit=4, max_cubes=140),
        default_topology=_by_chips(_CUBE_DEFAULTS),
    ),
    Generation(
        name="v6e",
        accelerator="tpu-v6e-slice",
        short_prefix="v6e",
        short_counts="chips",
        dims=2,
        tensorcores_per_chip=1,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=918e12,
        hbm_bytes_per_chip=32 * _GB,
        device_kinds=("TPU v6 lite", "TPU v6e"),
        machine_types={"ct6e-standard-1t": 1, "ct6e-standard-4t": 4, "ct6e-standard-8t": 8},
        single_host={"1x1": 1, "2x2": 4, "2x4": 8},
        multi_host_chips_per_vm=4,
        small_topologies=_PLANAR,
        cube_rule=None,
        default_topology=_by_chips(_PLANAR),
    ),
    Generation(
        name="tpu7x",
        accelerator="tpu7x",
        short_prefix="tpu7x",
        short_counts="tensorcores",
        dims=3,
        tensorcores_per_chip=2,
        jax_devices_per_chip=2,
        peak_bf16_flops_per_chip=2307e12,
        hbm_bytes_per_chip=192 * _GI,
        device_kinds=("TPU7x",),
        machine_types={"tpu7x-standard-1t": 1, "tpu7x-standard-4t": 4},
        single_host={"1x1x1": 1, "2x2x1": 4},
        multi_host_chips_per_vm=4,
        small_topologies=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_rule=CubeRule(unit=4, max_cubes=144),
        default_topology=_by_chips(["1x1x1", *_CUBE_DEFAULTS, "16x16x32", "16x24x24"]),
        process_addresses=True,
    ),
)

BY_ACCELERATOR: dict[str, Generation] = {g.accelerator: g for g in GENERATIONS}
BY_NAME: dict[str, Generation] = {g.name: g for g in GENERATIONS}


class CatalogError(ValueError):
    """A slice shape that no TPU generation supports; the message names the valid choices."""


@dataclass(frozen=True)
class SliceShape:
    """A resolved slice: generation, topology and how it maps onto VMs (hosts)."""

    generation: Generation
    topology: str
    chips_per_host: int
    dynamic: str | None = None
    """Ironwood dynamic slicing (``SuperSlice`` or ``SubSlice``): GKE's slice controller
    forms the slice out of 4x4x4 cubes when it runs, instead of a node pool of its own."""

    @property
    def accelerator(self) -> str:
        return self.generation.accelerator

    @property
    def chips(self) -> int:
        return _chips(self.topology)

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def machine_type(self) -> str:
        """The GKE machine type of the slice's VMs, e.g. ``ct6e-standard-4t``."""
        return next(
            m for m, chips in self.generation.machine_types.items() if chips == self.chips_per_host
        )

    @property
    def needs_pool(self) -> bool:
        """A node pool of its own: every multi-host slice except a dynamic one."""
        return self.multi_host and self.dynamic is None

    @property
    def short_type(self) -> str:
        """The accelerator type GKE and libtpu use, e.g. ``v5p-128`` (TPU_ACCELERATOR_TYPE)."""
        return self.generation.short_type(self.chips)

    @property
    def peak_bf16_flops(self) -> float:
        return self.chips * self.generation.peak_bf16_flops_per_chip


def valid_topologies(generation: Generation) -> tuple[str, ...]:
    """Every topology GKE accepts for ``generation``, smallest first."""
    return _valid_topologies(generation.name)


@cache
def _valid_topologies(name: str) -> tuple[str, ...]:
    generation = BY_NAME[name]
    found = list(generation.small_topologies)
    rule = generation.cube_rule
    if rule is not None:
        limit = rule.max_cubes
        top = min(limit, rule.max_dim // rule.unit)
        for a in range(1, top + 1):
            for b in range(a if rule.nondecreasing else 1, top + 1):
                if a * b > limit:
                    break
                for c in range(b if rule.nondecreasing else 1, top + 1):
                    if a * b * c > limit:
                        break
                    topology = f"{a * rule.unit}x{b * rule.unit}x{c * rule.unit}"
                    if topology not in found:
                        found.append(topology)
    return tuple(sorted(found, key=lambda t: (_chips(t), t)))


def describe_valid_topologies(generation: Generation) -> str:
    """A short human description of the valid topologies (for error messages)."""
    listed = ", ".join(generation.small_topologies)
    rule = generation.cube_rule
    if rule is None:
        return listed
    order = "A<=B<=C, " if rule.nondecreasing else ""
    return (
        f"{listed}, or AxBxC with {order}each a multiple of {rule.unit} up to "
        f"{rule.max_dim} and at most {rule.max_cubes * rule.unit**3} chips (e.g. 4x4x4, 4x8x8)"
    )


def generation_for(accelerator: str) -> Generation:
    try:
        return BY_ACCELERATOR[accelerator]
    except KeyError:
        raise CatalogError(
            f"unknown accelerator {accelerator!r}; valid: {', '.join(BY_ACCELERATOR)}"
        ) from None


def chips_per_host_choices(generation: Generation, topology: str) -> tuple[int, ...]:
    """Valid chips-per-VM values for a topology, the default first.

    A topology that fits one VM defaults to that single-host machine; v5e and v6e 2x4 may
    also run on two 4-chip VMs (a multi-host slice), selected with chipsPerHost=4.
    """
    chips = _chips(topology)
    single = generation.single_host.get(topology)
    choices: list[int] = []
    if single is not None:
        choices.append(single)
    if (
        chips > generation.multi_host_chips_per_vm
        and chips % generation.multi_host_chips_per_vm == 0
    ):
        choices.append(generation.multi_host_chips_per_vm)
    return tuple(dict.fromkeys(choices))


def shape(accelerator: str, topology: str, chips_per_host: int | None = None) -> SliceShape:
    """Resolve ``{accelerator, topology}``; raise CatalogError naming the valid choices."""
    generation = generation_for(accelerator)
    if topology not in valid_topologies(generation):
        raise CatalogError(
            f"topology {topology!r} is not valid for {accelerator}; valid: "
            f"{describe_valid_topologies(generation)}"
        )
    choices = chips_per_host_choices(generation, topology)
    if chips_per_host is None:
        chips_per_host = choices[0]
    elif chips_per_host not in choices:
        raise CatalogError(
            f"chipsPerHost {chips_per_host} is not valid for {accelerator} {topology}; "
            f"valid: {', '.join(map(str, choices))}"
        )
    return SliceShape(generation, topology, chips_per_host)


def _dims(topology: str) -> tuple[int, ...]:
    return tuple(int(d) for d in topology.split("x"))


def named_topologies(generation: Generation) -> dict[int, str]:
    """Chips -> the topology a short type of that size names, for every size GKE accepts.

    The generation's listed default where there is one, else the first valid topology in
    xpk's order (dimensions compared as numbers, first dimension first): v4-640 is 4x4x20,
    v5p-12544 is 4x8x196, as xpk names them.
    """
    return _named_topologies(generation.name)


@cache
def _named_topologies(name: str) -> dict[int, str]:
    generation = BY_NAME[name]
    named = dict(generation.default_topology)
    for topology in sorted(valid_topologies(generation), key=_dims):
        named.setdefault(_chips(topology), topology)
    return dict(sorted(named.items()))


@cache
def short_types() -> dict[str, tuple[str, str]]:
    """Every known short type -> (accelerator, topology)."""
    table: dict[str, tuple[str, str]] = {}
    for generation in GENERATIONS:
        prefixes = (generation.short_prefix, *generation.extra_short_names)
        for chips, topology in named_topologies(generation).items():
            for prefix in prefixes:
                count = (
                    chips * generation.tensorcores_per_chip
                    if generation.short_counts == "tensorcores"
                    else chips
                )
                table[f"{prefix}-{count}"] = (generation.accelerator, topology)
    return table


def from_short_type(short_type: str, chips_per_host: int | None = None) -> SliceShape:
    """Resolve a short accelerator type such as ``v5p-128`` or ``v6e-16``."""
    try:
        accelerator, topology = short_types()[short_type]
    except KeyError:
        match = SHORT_TYPE_PATTERN.match(short_type)
        prefix = match.group("prefix") if match else short_type
        sizes = sorted(
            int(t.rsplit("-", 1)[1]) for t in short_types() if t.startswith(prefix + "-")
        )
        if sizes:
            wanted = int(match.group("count")) if match else 0
            nearest = sorted(sizes, key=lambda n: (abs(n - wanted), n))[:2]
            hint = (
                f"{prefix} types go from {prefix}-{sizes[0]} to {prefix}-{sizes[-1]}; nearest: "
                + ", ".join(f"{prefix}-{n}" for n in sorted(nearest))
            )
        else:
            prefixes = sorted(
                {p for g in GENERATIONS for p in (g.short_prefix, *g.extra_short_names)}
            )
            hint = "known prefixes: " + ", ".join(prefixes)
        raise CatalogError(f"unknown TPU type {short_type!r}; {hint}") from None
    return shape(accelerator, topology, chips_per_host)


def generation_for_device_kind(device_kind: str) -> Generation | None:
    """The generation of a JAX device (``jax.devices()[0].device_kind``), if it is a TPU."""
    for generation in GENERATIONS:
        if device_kind in generation.device_kinds:
            return generation
    return None


def peak_bf16_flops_per_device(device_kind: str) -> float | None:
    """Peak bf16 FLOP/s of one JAX device of this kind, or None for non-TPU devices."""
    generation = generation_for_device_kind(device_kind)
    if generation is None:
        return None
    return generation.peak_bf16_flops_per_chip / generation.jax_devices_per_chip


# Ironwood dynamic slicing (docs/tasks/dynamic-slicing.md cites the
# sources): capacity comes as 4x4x4 cubes (reservation sub-blocks, 16 VMs of 4 chips);
# GKE's slice controller stitches cubes into a super-slice (every dimension a multiple of
# 4, A<=B<=C, at most 9,216 chips) or cuts one cube into sub-slices of these shapes.
DYNAMIC_SLICING_ACCELERATOR = "tpu7x"
DYNAMIC_SLICING_KINDS = ("SuperSlice", "SubSlice")
CUBE_TOPOLOGY = "4x4x4"
CUBE_CHIPS = 64
SUB_SLICE_TOPOLOGIES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")


def is_super_slice_topology(topology: str) -> bool:
    """AxBxC, each a multiple of 4, A<=B<=C, at most 144 cubes (the Slice CRD's rule)."""
    if TOPOLOGY_PATTERN.match(topology) is None:
        return False
    dims = _dims(topology)
    return (
        len(dims) == 3
        and all(d % 4 == 0 for d in dims)
        and dims[0] <= dims[1] <= dims[2]
        and _chips(topology) <= 144 * CUBE_CHIPS
    )


def dynamic_slicing_error(kind: str, accelerator: str, topology: str) -> str | None:
    """Why ``kind`` of dynamic slice cannot have this shape (None: it can)."""
    if accelerator != DYNAMIC_SLICING_ACCELERATOR:
        return (
            f"dynamicSlicing: {kind} is Ironwood's (accelerator tpu7x); {accelerator} "
            "slices run on node pools of their shape: remove dynamicSlicing"
        )
    if kind == "SubSlice" and topology not in SUB_SLICE_TOPOLOGIES:
        return (
            f"dynamicSlicing: a SubSlice is cut from one 4x4x4 cube: topology must be one "
            f"of {', '.join(SUB_SLICE_TOPOLOGIES)} (not {topology}); 4x4x4 and larger are "
            "SuperSlices"
        )
    if kind == "SuperSlice" and not is_super_slice_topology(topology):
        return (
            f"dynamicSlicing: a SuperSlice is made of whole 4x4x4 cubes: topology must be "
            f"AxBxC with each a multiple of 4 and A<=B<=C, at most 9216 chips (e.g. "
            f"4x4x4, 4x4x8, 8x8x8), not {topology}; smaller shapes are SubSlices"
        )
    if kind not in DYNAMIC_SLICING_KINDS:
        return f"dynamicSlicing: {kind} is not one of {', '.join(DYNAMIC_SLICING_KINDS)}"
    return None
