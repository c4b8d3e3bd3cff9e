"""Node pools as the operator sees them, and the choice of pools for a job's slices (pure).

Mechanism: a multi-host GKE TPU node pool is one slice (its VMs share the ICI fabric and
are created and repaired together), so each multi-host slice gets a node pool to itself.
The operator picks free pools whose accelerator, topology and chips per VM match, for all
slices of a job at once (all or nothing: a multislice job never holds half its pools while
waiting for the rest), records the choice in the job's status before any pod exists, and
pins the slice's pods to the pool with a ``cloud.google.com/gke-nodepool`` node selector.
The scheduler then only has to fit pods into nodes of one known pool, so there is no
leader pod placed first and no followers rejected and retried, as with JobSet's exclusive
placement. Single-host slices need no pool of their own: the scheduler spreads them over
the VMs of matching pools, one pod per VM through the ``google.com/tpu`` request.

Chips per VM matter because v5e and v6e 2x4 exist as one 8-chip VM or two 4-chip VMs: a
pool is matched on its machine type (``node.kubernetes.io/instance-type``, or the chips
its nodes offer), so a slice is never given a pool whose VMs cannot take its pods.

When no free pool fits and the request may provision (``placement.provisioning: Auto``),
the slice gets a claim reference instead (``placement/provisioning.py``): its pods ask GKE
to create a pool for it alone, and the claim is replaced by that pool's name once its
nodes appear (``resolve_claim``). A job that leaves ``provisioning`` unset gets the
operator's ``--default-provisioning`` (``with_default``). A recorded pool that loses all
its nodes (GKE deletes the pools it created once they are empty) is given up for a new
claim before the slice's next pods, or kept with a message saying why (``vanished_pools``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tpu_operator import contract
from tpu_operator.api.capacity import CAPACITY_WORDS, JobPlacement
from tpu_operator.api.policy import LABEL_KEY, LABEL_VALUE, Placement
from tpu_operator.catalog import GENERATIONS, SliceShape
from tpu_operator.placement.provisioning import claim_of, claim_ref
from tpu_operator.state.views import NodeView

CHIPS_BY_MACHINE_TYPE: dict[str, int] = {
    machine: chips for g in GENERATIONS for machine, chips in g.machine_types.items()
}
"""GKE TPU machine type -> chips per VM (the catalog's table, by machine type)."""


def chips_of_node(node: NodeView) -> int | None:
    """Chips per VM of a node: from its machine type, else what its device plugin offers."""
    if node.machine_type and node.machine_type in CHIPS_BY_MACHINE_TYPE:
        return CHIPS_BY_MACHINE_TYPE[node.machine_type]
    return node.tpu_chips if node.tpu_chips > 0 else None


@dataclass
class PoolView:
    """One node pool, aggregated from its nodes' labels."""

    name: str
    accelerator: str | None
    topology: str | None
    nodes: int = 0
    ready: int = 0
    spot: bool = False
    reservation: str | None = None
    chips_per_vm: int | None = None
    """Chips of each VM (None: no node said)."""
    machine_type: str | None = None
    slice_pool: str | None = None
    """The slice-pool label of a pool GKE created for a slice's pods (its taint's value)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The labels every node of the pool carries (spare pools are selected by them)."""
    ends: float | None = None
    """The earliest time GKE takes back one of its VMs (Unix time), if its nodes say
    (flex-start VMs: ``NodeView.terminates_at``)."""

    @property
    def capacity(self) -> str | None:
        """How GKE obtained the pool's VMs, as ``placement.capacity`` names it: from the
        labels GKE puts on flex-start and queued-provisioning nodes (None: on-demand, Spot
        or reserved VMs)."""
        if self.labels.get(contract.NODE_LABEL_QUEUED) == "true":
            return "QueuedProvisioning"
        if self.labels.get(contract.NODE_LABEL_FLEX_START) == "true":
            return "FlexStart"
        return None

    def describe_vms(self) -> str:
        if self.machine_type:
            return f"{self.chips_per_vm}-chip VMs ({self.machine_type})"
        return f"{self.chips_per_vm}-chip VMs"


def pools_from_nodes(nodes: Iterable[NodeView]) -> dict[str, PoolView]:
    pools: dict[str, PoolView] = {}
    # Per pool, the labels of the last node compared: the nodes of a pool usually share
    # one labels object (``views.pool_labels``), and comparing it again changes nothing.
    seen: dict[str, Mapping[str, str]] = {}
    for node in nodes:
        if not node.pool or not node.accelerator:
            continue
        pool = pools.get(node.pool)
        if pool is None:
            pool = pools[node.pool] = PoolView(
                node.pool,
                node.accelerator,
                node.topology,
                spot=node.spot,
                reservation=node.reservation,
                labels=dict(node.labels),
            )
            seen[node.pool] = node.labels
        elif pool.labels and node.labels is not seen[node.pool]:
            pool.labels = {k: v for k, v in pool.labels.items() if node.labels.get(k) == v}
            seen[node.pool] = node.labels
        pool.nodes += 1
        pool.ready += int(node.ready and not node.unschedulable)
        chips = chips_of_node(node)
        if chips is not None and (pool.chips_per_vm is None or node.machine_type):
            pool.chips_per_vm = chips
        if node.terminates_at is not None:
            ends = node.terminates_at
            pool.ends = ends if pool.ends is None else min(pool.ends, ends)
        pool.machine_type = pool.machine_type or node.machine_type
        pool.slice_pool = pool.slice_pool or node.slice_pool
    return pools


@dataclass(frozen=True)
class Spares:
    """Node pools held in reserve: by name, or by labels all their nodes carry (any of
    ``selectors`` matches). A first placement never takes them; a slice moving off a
    broken pool takes one first (``Request.replacing``)."""

    names: frozenset[str] = frozenset()
    selectors: tuple[tuple[tuple[str, str], ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.names or self.selectors)

    def holds(self, pool: PoolView) -> bool:
        return pool.name in self.names or any(
            all(pool.labels.get(key) == value for key, value in selector)
            for selector in self.selectors
        )

    def __or__(self, other: Spares) -> Spares:
        return Spares(self.names | other.names, self.selectors + other.selectors)


NO_SPARES = Spares()


def spares_of(names: Iterable[str] = (), match_labels: Mapping[str, str] | None = None) -> Spares:
    """The spares named by ``names`` and, when given, selected by ``match_labels``."""
    selectors = (tuple(sorted(match_labels.items())),) if match_labels else ()
    return Spares(frozenset(names), selectors)


def job_spares(placement: JobPlacement | None, held: Iterable[str] = ()) -> Spares:
    """A job's own spares: ``spec.placement.spares``, and the pools it holds as spares in
    place of the spares its slices took (``held``: ``status.spareNodePools``)."""
    spares = placement.spares if placement is not None else None
    if spares is None:
        return spares_of(held) if held else NO_SPARES
    return spares_of(
        [*(spares.node_pools or ()), *held],
        spares.selector.match_labels if spares.selector else None,
    )


def parse_selector(text: str) -> dict[str, str]:
    """``key=value,key2=value2`` (the operator's --spare-node-pool-selector) as labels;
    ValueError naming what is wrong."""
    labels: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"{part!r} is not key=value (e.g. example.com/pool-role=spare)")
        if not re.match(LABEL_KEY, key):
            raise ValueError(f"{key!r} is not a label key (e.g. example.com/pool-role)")
        if len(value) > 63 or not re.match(LABEL_VALUE, value):
            raise ValueError(
                f"{value!r} (label {key}) is not a label value: at most 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit"
            )
        if key in labels:
            raise ValueError(f"label {key} is given twice")
        labels[key] = value
    return labels


@dataclass(frozen=True)
class Request:
    """What one slice needs from a pool."""

    shape: SliceShape
    spot: bool | None = None
    reservation: str | None = None
    pinned: str | None = None
    provision: bool | None = False
    """No free pool fits: ask GKE to create one (a claim) instead of waiting (None: the
    job did not say; the operator's default decides, ``with_default``)."""
    claim: str | None = None
    """The slice-pool label value this slice's pods use when GKE creates its pool."""
    leaves: str | None = None
    """The pool the slice moves off (a free choice never takes it back)."""
    spares: Spares = NO_SPARES
    """Pools held in reserve: not taken unless ``replacing``."""
    replacing: bool = False
    """The slice replaces one on a broken pool: a spare first, then any free pool."""
    others: Spares = NO_SPARES
    """Pools other jobs hold in reserve (their ``spec.placement.spares``): never taken,
    unless ``spares`` (this job's own, or the operator's) holds them too."""
    capacity: str | None = None
    """``placement.capacity``: only a pool of VMs GKE obtained that way (None: only one
    of on-demand, Spot or reserved VMs)."""
    fresh: bool = False
    """Capacity that comes as new VMs (flex-start, queued provisioning): a pool GKE
    creates for this slice, never a free pool that exists (one of another capacity mode,
    or a queued-provisioning pool another request booked)."""


def provisions(setting: str | None, default: str) -> bool:
    """Whether a slice may ask GKE for a pool: its ``placement.provisioning``, else the
    operator's ``--default-provisioning``."""
    return (setting or default) == "Auto"


def with_default(requests: list[Request], default: str) -> list[Request]:
    """``requests`` with an unsaid ``provision`` decided by the operator's default."""
    return [
        r if r.provision is not None else replace(r, provision=provisions(None, default))
        for r in requests
    ]


@dataclass
class Allocation:
    pools: list[str] | None
    """Pool (or claim reference) per request, in request order; None when the job must
    wait."""
    message: str = ""
    """Why the job waits (which pools exist and why none fits)."""
    provisioning: list[int] = field(default_factory=list)
    """Indexes of the requests that got a claim: GKE is to create their pools."""
    spares: list[int] = field(default_factory=list)
    """Indexes of the requests that got a spare pool."""


def shape_words(shape: SliceShape) -> str:
    """``tpu-v6e-slice 2x4 (2 VMs of 4 chips)``: what a slice needs, in words."""
    vms = "1 VM" if shape.hosts == 1 else f"{shape.hosts} VMs"
    return f"{shape.accelerator} {shape.topology} ({vms} of {shape.chips_per_host} chips)"


def _wrong_machine(pool: PoolView, shape: SliceShape) -> str | None:
    """Why the pool's VMs cannot take the slice's pods (chips per VM), or None."""
    if pool.chips_per_vm is None or pool.chips_per_vm == shape.chips_per_host:
        return None
    return (
        f"{pool.name} has {pool.describe_vms()}; the slice needs "
        f"{shape.chips_per_host}-chip VMs (chipsPerHost {shape.chips_per_host})"
    )


def _unfit(pool: PoolView, request: Request, held_by: str | None) -> str | None:
    """Why a pool of the right shape cannot take the slice, or None if it can."""
    shape = request.shape
    if pool.name == request.leaves:
        return f"{pool.name} is the pool the slice moves off"
    if request.others.holds(pool) and not request.spares.holds(pool):
        return f"{pool.name} is a spare another TPUJob holds in reserve (spec.placement.spares)"
    if not request.replacing and request.spares.holds(pool):
        return f"{pool.name} is a spare pool (kept to replace a slice on a broken pool)"
    wrong = _wrong_machine(pool, shape)
    if wrong:
        return wrong
    if held_by:
        return f"{pool.name} is held by {held_by}"
    if pool.nodes < shape.hosts:
        return f"{pool.name} has {pool.nodes} of the {shape.hosts} VMs the slice needs"
    unhealthy = pool_unhealthy(pool)
    if unhealthy:
        return unhealthy
    if request.spot is not None and pool.spot != request.spot:
        return f"{pool.name} is {'spot' if pool.spot else 'on-demand'}"
    if request.reservation and pool.reservation != request.reservation:
        return f"{pool.name} is not in reservation {request.reservation}"
    if pool.capacity != request.capacity:
        return f"{pool.name} is of {_capacity_words(pool.capacity)} VMs"
    return None


def _capacity_words(capacity: str | None) -> str:
    return CAPACITY_WORDS.get(capacity, capacity) if capacity else "on-demand, Spot or reserved"


def pool_unhealthy(pool: PoolView) -> str | None:
    """Why a pool is unhealthy (a VM not ready or cordoned: being repaired, upgraded or
    lost), if it is. An unhealthy pool is given to no slice until it is healthy again."""
    if pool.ready >= pool.nodes:
        return None
    return (
        f"{pool.name} has {pool.nodes - pool.ready} of its {pool.nodes} VMs not ready or cordoned"
    )


def _pinned_mismatch(pool: PoolView | None, shape: SliceShape) -> str | None:
    """Why a pinned pool that has nodes cannot run the slice (a pool without nodes yet is
    taken as given: the cluster autoscaler creates them for the pending pods)."""
    if pool is None or pool.nodes == 0:
        return None
    if (pool.accelerator, pool.topology) != (shape.accelerator, shape.topology):
        return f"it is {pool.accelerator} {pool.topology}; the slice needs {shape_words(shape)}"
    if pool.chips_per_vm is not None and pool.chips_per_vm != shape.chips_per_host:
        return f"its VMs are {pool.describe_vms()}; the slice needs {shape_words(shape)}"
    return None


ShapeKey = tuple[str | None, str | None]
"""A pool's or a slice's (accelerator, topology)."""


def pools_by_shape(pools: Mapping[str, PoolView]) -> dict[ShapeKey, tuple[PoolView, ...]]:
    """The pools of each (accelerator, topology), smallest first, then by name: the order
    in which a free choice tries them (``allocate``). Built once per node change
    (``reconcile/pools.tpu_pools_by_shape``), so that a choice reads the pools of its
    slice's shape alone instead of sorting every pool of the cluster each time: with
    1,000 jobs, 681 pools for every allocation."""
    groups: dict[ShapeKey, list[PoolView]] = {}
    for pool in pools.values():
        groups.setdefault((pool.accelerator, pool.topology), []).append(pool)
    return {
        key: tuple(sorted(group, key=lambda p: (p.nodes, p.name))) for key, group in groups.items()
    }


def allocate(
    requests: list[Request],
    pools: Mapping[str, PoolView],
    held: Mapping[str, str],
    by_shape: Mapping[ShapeKey, Sequence[PoolView]] | None = None,
) -> Allocation:
    """Pick a distinct free pool for every request, or explain why not.

    ``held`` maps pool name -> holder (``namespace/job``) for pools already taken; it is
    only looked up pool by pool, never enumerated, so a holder may compute it lazily:
    ``in`` for the pools a choice passes over, ``get`` (the holder's name) only for the
    message of a request that waits. Pinned pools are taken as given: a pinned pool may
    not exist yet (the cluster autoscaler creates its nodes for the pending pods), but it
    must not be held, and a pinned pool whose nodes are of another shape or machine type
    is refused. A request that may provision gets a claim reference when no free pool
    fits. ``by_shape``: ``pools_by_shape(pools)``, when the caller keeps it.
    """
    shapes = pools_by_shape(pools) if by_shape is None else by_shape
    chosen: dict[int, str] = {}
    provisioning: list[int] = []
    spare: list[int] = []
    taken: set[str] = set()  # by earlier requests of this allocation
    # Pinned pools first, so that no free choice takes a pool another slice pins.
    order = sorted(range(len(requests)), key=lambda i: (not requests[i].pinned, i))
    for index in order:
        request = requests[index]
        if request.pinned:
            holder = held.get(request.pinned) or (
                "another slice of this job" if request.pinned in taken else None
            )
            if holder:
                return Allocation(
                    None, f"slice {index}: pinned node pool {request.pinned} is held by {holder}"
                )
            mismatch = _pinned_mismatch(pools.get(request.pinned), request.shape)
            if mismatch:
                return Allocation(
                    None,
                    f"slice {index}: pinned node pool {request.pinned} cannot run it: {mismatch}",
                )
            chosen[index] = request.pinned
            taken.add(request.pinned)
            continue
        candidates: Sequence[PoolView] = (
            ()
            if request.fresh
            else shapes.get((request.shape.accelerator, request.shape.topology), ())
        )
        if request.replacing:  # a spare first; the sort is stable: smallest, then by name
            candidates = sorted(candidates, key=lambda p: not request.spares.holds(p))
        for pool in candidates:
            if pool.name in taken or pool.name in held or _unfit(pool, request, None):
                continue
            chosen[index] = pool.name
            taken.add(pool.name)
            if request.replacing and request.spares.holds(pool):
                spare.append(index)
            break
        else:
            if request.provision and request.claim:
                chosen[index] = claim_ref(request.claim)
                provisioning.append(index)
                continue
            reasons = [
                problem
                for pool in candidates
                if (
                    problem := _unfit(
                        pool,
                        request,
                        held.get(pool.name) or ("this job" if pool.name in taken else None),
                    )
                )
            ]
            if not pools:
                why = "the cluster has no TPU node pools"
            elif reasons:
                why = "; ".join(reasons)
            else:
                kinds = sorted(
                    {
                        f"{p.accelerator} {p.topology}"
                        + (f" of {p.chips_per_vm}-chip VMs" if p.chips_per_vm else "")
                        for p in pools.values()
                    }
                )
                why = "no node pool has that shape; the pools are " + ", ".join(kinds)
            hint = (
                ""
                if request.provision
                else " (placement.provisioning: Auto lets GKE create "
                "one: node auto-provisioning, Autopilot)"
            )
            return Allocation(
                None,
                f"waiting for a free node pool for slice {index} ({shape_words(request.shape)})"
                f": {why}{hint}",
            )
    return Allocation(
        [chosen[i] for i in range(len(requests))],
        provisioning=sorted(provisioning),
        spares=sorted(spare),
    )


def resolve_claim(
    claim: str, shape: SliceShape, pools: Mapping[str, PoolView]
) -> tuple[str | None, str]:
    """The pool GKE created for ``claim``, once all its VMs are there: (name, "") or
    (None, why not yet). A pool of another shape or machine type is never taken."""
    for pool in sorted(pools.values(), key=lambda p: p.name):
        if pool.slice_pool != claim:
            continue
        if (pool.accelerator, pool.topology) != (shape.accelerator, shape.topology):
            return None, (
                f"node pool {pool.name} carries the slice's label but is {pool.accelerator} "
                f"{pool.topology}"
            )
        wrong = _wrong_machine(pool, shape)
        if wrong:
            return None, wrong
        if pool.nodes < shape.hosts:
            return None, f"node pool {pool.name} has {pool.nodes} of its {shape.hosts} VMs"
        return pool.name, ""
    return None, "GKE has not created its node pool yet"


@dataclass(frozen=True)
class MachineChoice:
    """The machine type chosen for a shape that fits two, and what to say about it."""

    shape: SliceShape
    note: str = ""
    """Why this machine type, for the status and events (empty: nothing was chosen)."""
    waiting: str = ""
    """Set when the cluster has neither machine type and the job may not ask GKE for
    one: the job waits, and this message names both machine types."""


def machine_words(shape: SliceShape) -> str:
    """``ct6e-standard-4t (2 VMs of 4 chips)``: a machine type and how the slice uses it."""
    vms = "1 VM" if shape.hosts == 1 else f"{shape.hosts} VMs"
    return f"{shape.machine_type} ({vms} of {shape.chips_per_host} chips)"


def choose_machine(
    options: list[SliceShape],
    pools: Mapping[str, PoolView],
    held: Mapping[str, str],
    free_vms: Mapping[str, int],
    *,
    spot: bool | None = None,
    reservation: str | None = None,
    provision: bool = False,
) -> MachineChoice:
    """The machine type for a shape that fits two (v5e/v6e 2x4: one 8-chip VM or two 4-chip
    VMs) when the user did not say: the one the cluster has; with both, the one that can
    start now (a free pool, a free VM), the default first. With neither, the default when
    the job may ask GKE for a pool (``provision``: node auto-provisioning creates the
    machine type its pods ask for), else the job waits for a pool of either type.

    ``options`` are the shapes in the catalog's order (default first); ``free_vms`` maps
    pool name -> its ready VMs without an unfinished worker pod (single-host use).
    """

    def usable(pool: PoolView, option: SliceShape) -> bool:
        return (
            (pool.accelerator, pool.topology) == (option.accelerator, option.topology)
            and pool.chips_per_vm == option.chips_per_host
            and (spot is None or pool.spot == spot)
            and (not reservation or pool.reservation == reservation)
        )

    kinds = {o.chips_per_host: [p for p in pools.values() if usable(p, o)] for o in options}
    present = [o for o in options if kinds[o.chips_per_host]]
    head = options[0]
    if not present:
        both = " or ".join(machine_words(o) for o in options)
        where = f"{head.accelerator} {head.topology}" + (
            " spot" if spot else " on-demand" if spot is False else ""
        )
        where += f" in reservation {reservation}" if reservation else ""
        if provision:
            why = (
                f"the cluster has no {where} pool of either machine type, {both}; "
                f"its pods ask GKE for {head.machine_type}, the default"
            )
            return MachineChoice(head, f"{shape_words(head)}: {why}")
        waiting = (
            f"waiting for a {where} node pool of either machine type, {both}: the cluster "
            f"has neither (slice.chipsPerHost picks one; placement.provisioning: Auto lets "
            f"GKE create the default, {head.machine_type})"
        )
        return MachineChoice(head, waiting=waiting)

    def words(option: SliceShape) -> str:
        machines = sorted({p.machine_type for p in kinds[option.chips_per_host] if p.machine_type})
        named = f" ({', '.join(machines)})" if machines else ""
        return f"{option.chips_per_host}-chip VMs{named}"

    if len(present) == 1:
        only = present[0]
        why = f"the cluster's {only.accelerator} {only.topology} pools have {words(only)}"
        return MachineChoice(only, f"{shape_words(only)}: {why}")
    for option in present:
        if option.multi_host:
            free = allocate([Request(option, spot, reservation)], pools, held).pools is not None
        else:
            free = any(free_vms.get(p.name, 0) > 0 for p in kinds[option.chips_per_host])
        if free:
            why = f"the cluster has both machine types and {words(option)} are free now"
            return MachineChoice(option, f"{shape_words(option)}: {why}")
    why = f"the cluster has both machine types, neither free now; taking {words(head)}"
    return MachineChoice(head, f"{shape_words(head)}: {why}")


@dataclass(frozen=True)
class PoolGone:
    """A slice's recorded node pool that has no nodes: what to do about it."""

    index: int
    pool: str
    reclaim: bool
    """True: the slice asks GKE for a new pool (a new claim replaces the record);
    False: it keeps the pool and waits for its nodes."""
    message: str


def vanished_pools(
    refs: list[str],
    pools: Mapping[str, PoolView],
    *,
    pinned: list[str] | None,
    provision: bool,
    created: Collection[int] = (),
) -> list[PoolGone]:
    """The recorded pools (``refs``, one per slice) that have no nodes left, and what to
    do about each. ``created``: the slices whose pods of the current attempt exist already
    (pinned to the pool by name; a new pool can only be given to the slice's next pods).

    A pool without nodes was deleted (node auto-provisioning deletes the pools it created
    once their nodes are gone; a user may delete any pool) or scaled to zero by the
    cluster autoscaler; the Kubernetes API cannot tell which. So:

    - a pool the user pinned (``placement.nodePools``) is kept: the autoscaler scales it
      up for the pending pods if it still exists; the message says it has no nodes;
    - a pool the operator chose, when the slice may provision and its pods are not created
      yet: the slice asks GKE for a new pool of its own (a claim), since a deleted pool
      never comes back and pods pinned to it by name would wait forever;
    - otherwise the pool is kept, with a message saying so and what to do.

    Claim references are not pools yet and are left alone.
    """
    gone: list[PoolGone] = []
    for index, ref in enumerate(refs):
        if not ref or claim_of(ref) is not None or ref in pools:
            continue
        if pinned and index < len(pinned) and pinned[index] == ref:
            why = (
                "waiting for the cluster autoscaler to add them (if the pool was deleted, "
                "re-create it or pin another pool in placement.nodePools)"
            )
            gone.append(PoolGone(index, ref, False, _gone(index, "pinned node pool", ref, why)))
        elif provision and index not in created:
            why = "GKE deleted it or scaled it to zero; its pods ask GKE for a new pool"
            gone.append(PoolGone(index, ref, True, _gone(index, "node pool", ref, why)))
        elif provision:
            why = (
                "waiting for the cluster autoscaler to add them; the slice's next attempt "
                "asks GKE for a new pool"
            )
            gone.append(PoolGone(index, ref, False, _gone(index, "node pool", ref, why)))
        else:
            why = (
                "waiting for the cluster autoscaler to add them (a deleted pool does not "
                "come back: placement.provisioning: Auto lets GKE create a new one)"
            )
            gone.append(PoolGone(index, ref, False, _gone(index, "node pool", ref, why)))
    return gone


def _gone(index: int, what: str, pool: str, why: str) -> str:
    return f"slice {index}: {what} {pool} has no nodes; {why}"


def requests_for(
    shape: SliceShape,
    placement: Placement | None,
    count: int,
    claims: list[str] | None = None,
    admitted_capacity: bool = False,
) -> list[Request]:
    """What each of ``count`` slices of ``shape`` needs from a pool; ``claims`` are the
    slice-pool label values the slices use if GKE is to create their pools.

    A flex-start or queued-provisioning slice (``placement.capacity``) asks GKE for a
    pool of its own unless ``placement.provisioning`` says otherwise: that capacity comes
    as new VMs. Whatever it says, a slice only takes a pool of the capacity it asks for
    (``PoolView.capacity``). ``admitted_capacity``: Kueue admits the job, whose ProvisioningRequest
    admission check has the queued capacity provisioned before it admits: the slices take
    those pools as existing ones."""
    pins = placement.node_pools if placement and placement.node_pools else None
    setting = placement.provisioning if placement else None
    provision = None if setting is None else setting == "Auto"
    capacity = placement.capacity if placement else None
    fresh = False
    if setting is None and capacity is not None:
        provision = fresh = not (admitted_capacity and capacity == "QueuedProvisioning")
    return [
        Request(
            shape,
            spot=placement.spot if placement else None,
            reservation=placement.reservation if placement else None,
            pinned=pins[i] if pins else None,
            provision=provision if claims is not None else False,
            claim=claims[i] if claims else None,
            capacity=capacity,
            fresh=fresh and claims is not None,
        )
        for i in range(count)
    ]
