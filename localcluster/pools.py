"""Simulated GKE node pools, declared as data, and the Node objects they become.

A pool is one GKE node pool: TPU (``accelerator`` set) or plain CPU. A TPU pool whose
topology has as many chips as one VM is a single-host pool (any number of VMs, each its
own slice); otherwise it is one multi-host slice and ``vms * chips_per_vm`` must equal the
topology's chips, as GKE enforces. ``mode: run`` pools run pods as local processes;
``mode: simulate`` pools only report status (for scale runs).

The YAML format (``localcluster/pools.yaml`` is the default)::

    pools:
      - name: v5e-2x4              # node pool name; nodes are <name>-0, <name>-1, ...
        accelerator: tpu-v5-lite-podslice
        topology: 2x4
        vms: 2
        chips_per_vm: 4
        spot: false                # optional
        reservation: null          # optional: cloud.google.com/reservation-name
        machine_type: null         # optional: derived from accelerator and chips_per_vm
        autoscaling: false         # optional: the simulated cluster autoscaler may scale it
        initial_vms: null          # optional: VMs at start (0: scaled to zero; null: vms)
        taints: []                 # optional: extra node taints ({key, value, effect})
        dynamic_slicing: false     # optional: an Ironwood cube (tpu7x 4x4x4, 16 VMs) for
                                   # the slice controller stand-in (agent/slicecontroller.py)
        block: block-0             # optional: a cube's reservation block
                                   # (cloud.google.com/gce-topology-block)
        mode: run                  # run | simulate
        simulate:                  # optional, simulate mode only
          complete_after: null     # seconds until pods terminate (null: run forever)
          exit_code: 0
      - name: cpu
        vms: 2                     # no accelerator: a CPU pool
        cpu: "8"
        memory: 32Gi
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

DEFAULT_POOLS_FILE = Path(__file__).resolve().parent / "pools.yaml"

TPU_RESOURCE = "google.com/tpu"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
POOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
SPOT_LABEL = "cloud.google.com/gke-spot"
RESERVATION_LABEL = "cloud.google.com/reservation-name"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
MODE_LABEL = "localcluster.tpu-operator.dev/mode"
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
QUEUED_LABEL = "cloud.google.com/gke-queued"
MAX_RUN_LABEL = "cloud.google.com/gke-max-run-duration-seconds"
TERMINATION_ANNOTATION = "node.gke.io/machine-termination-datetime"

# GKE machine type prefix per accelerator label value; the suffix is <chips>t.
_MACHINE_PREFIX = {
    "tpu-v4-podslice": "ct4p-hightpu-",
    "tpu-v5-lite-podslice": "ct5lp-hightpu-",
    "tpu-v5p-slice": "ct5p-hightpu-",
    "tpu-v6e-slice": "ct6e-standard-",
    "tpu7x": "tpu7x-standard-",
}


class PoolError(ValueError):
    """A pool declaration is invalid; the message names the pool and the field."""


@dataclass(frozen=True)
class Simulate:
    """What simulate-mode pods do: run forever, or terminate after a while with a code."""

    complete_after: float | None = None
    exit_code: int = 0


@dataclass(frozen=True)
class Pool:
    """One GKE node pool (TPU when ``accelerator`` is set, else CPU)."""

    name: str
    vms: int = 1
    accelerator: str | None = None
    topology: str | None = None
    chips_per_vm: int = 4
    spot: bool = False
    reservation: str | None = None
    machine_type: str | None = None
    mode: Literal["run", "simulate"] = "run"
    simulate: Simulate = field(default_factory=Simulate)
    cpu: str = "8"
    memory: str = "32Gi"
    max_pods: int = 110
    zone: str = "us-central2-b"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    """Node taints besides the TPU one (GKE workload separation: ``{key, value, effect}``)."""
    autoscaling: bool = False
    """The simulated cluster autoscaler (``localcluster/agent/provisioner.py``) adds this
    pool's VMs for pending pods that fit them and removes them when idle; a multi-host TPU
    pool goes from 0 to ``vms`` VMs and back at once, as GKE scales TPU slices."""
    initial_vms: int | None = None
    """VMs registered at start (None: ``vms``; 0: a pool scaled to zero)."""
    auto_provisioned: bool = False
    """Created by the simulated node auto-provisioner (deleted once idle)."""
    dynamic_slicing: bool = False
    """An Ironwood cube for dynamic slicing (``localcluster/agent/slicecontroller.py``):
    tpu7x, 4x4x4, 16 VMs of 4 chips, provisioned without ICI links. Its nodes carry no
    topology label until the slice controller stand-in forms a Slice of them; they carry
    the partition id and state labels of the cube and of each sub-slice shape."""
    block: str = "block-0"
    """An Ironwood cube's reservation block: its nodes' ``cloud.google.com/gce-topology-block``
    label (Kueue's topology level above the cubes; a super-slice is formed within one)."""
    max_run_seconds: int | None = None
    """Flex-start VMs: taken back this long after they register (the simulated autoscaler
    taints them ``cloud.google.com/impending-node-termination`` shortly before); each
    node carries ``node.gke.io/machine-termination-datetime``."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def is_tpu(self) -> bool:
        return self.accelerator is not None

    def validate(self) -> None:
        where = f"pool {self.name!r}"
        if not self.name or not _dns_label(self.name):
            raise PoolError(f"{where}: name must be a DNS label (lowercase, digits, '-')")
        if self.vms < 1:
            raise PoolError(f"{where}: vms must be >= 1, got {self.vms}")
        if self.mode not in ("run", "simulate"):
            raise PoolError(f"{where}: mode must be 'run' or 'simulate', got {self.mode!r}")
        if self.initial_vms is not None and not 0 <= self.initial_vms <= self.vms:
            raise PoolError(f"{where}: initial_vms must be between 0 and vms ({self.vms})")
        if self.initial_count < self.vms and not self.autoscaling:
            raise PoolError(f"{where}: initial_vms below vms needs autoscaling: true")
        if not self.is_tpu:
            if self.topology:
                raise PoolError(f"{where}: topology is set but accelerator is not")
            return
        if not self.topology:
            raise PoolError(f"{where}: a TPU pool needs a topology, e.g. 2x4")
        chips = topology_chips(self.topology, where)
        if self.chips_per_vm < 1:
            raise PoolError(f"{where}: chips_per_vm must be >= 1")
        if chips != self.chips_per_vm and chips != self.vms * self.chips_per_vm:
            raise PoolError(
                f"{where}: topology {self.topology} has {chips} chips; a multi-host pool "
                f"needs vms * chips_per_vm == {chips} (got {self.vms} * {self.chips_per_vm}),"
                f" a single-host pool needs chips_per_vm == {chips}"
            )
        if self.dynamic_slicing and (
            self.accelerator != "tpu7x"
            or self.topology != "4x4x4"
            or self.vms != CUBE_VMS
            or self.chips_per_vm != 4
        ):
            raise PoolError(
                f"{where}: dynamic_slicing pools are Ironwood cubes: accelerator tpu7x, "
                f"topology 4x4x4, vms {CUBE_VMS}, chips_per_vm 4"
            )
        if self.multi_host and self.initial_count not in (0, self.vms):
            raise PoolError(f"{where}: a multi-host TPU pool starts with 0 or all its VMs")

    @property
    def initial_count(self) -> int:
        """VMs registered when the pool is added."""
        return self.vms if self.initial_vms is None else self.initial_vms

    @property
    def multi_host(self) -> bool:
        return self.is_tpu and topology_chips(self.topology or "1", self.name) > self.chips_per_vm

    @property
    def gke_machine_type(self) -> str:
        if self.machine_type:
            return self.machine_type
        if self.accelerator:
            prefix = _MACHINE_PREFIX.get(self.accelerator, f"{self.accelerator}-")
            return f"{prefix}{self.chips_per_vm}t"
        return f"e2-standard-{self.cpu}"

    def node_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.vms)]

    def node_labels(self, node_name: str) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            # The kubelet registers these too; without them the node-lifecycle controller
            # adds them to every node (a GET and a PATCH per node: minutes of apiserver
            # work when thousands of simulated nodes register at once).
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/region": self.zone.rsplit("-", 1)[0],
            "topology.kubernetes.io/zone": self.zone,
            POOL_LABEL: self.name,
            INSTANCE_TYPE_LABEL: self.gke_machine_type,
            MODE_LABEL: self.mode,
        }
        if self.accelerator:
            labels[ACCELERATOR_LABEL] = self.accelerator
            labels[TOPOLOGY_LABEL] = self.topology or ""
        if self.dynamic_slicing:
            del labels[TOPOLOGY_LABEL]  # set by the slice controller on a formed Slice
            labels[TOPOLOGY_MODE_LABEL] = "PROVISION_ONLY"
            labels[BLOCK_LABEL] = self.block
            index = int(node_name.rsplit("-", 1)[1])
            for shape, pid in cube_partitions(self.name, index).items():
                labels[f"{PARTITION_PREFIX}{shape}-id"] = pid
                labels[f"{PARTITION_PREFIX}{shape}-state"] = "HEALTHY"
        if self.spot:
            labels[SPOT_LABEL] = "true"
            labels["cloud.google.com/gke-provisioning"] = "spot"
        if self.reservation:
            labels[RESERVATION_LABEL] = self.reservation
        labels.update(self.labels)
        return labels

    def node_manifest(
        self, node_name: str, internal_ip: str, kubelet_version: str = ""
    ) -> dict[str, Any]:
        """The Node a kubelet of this pool would register (status included)."""
        capacity = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.max_pods),
            "ephemeral-storage": "100Gi",
        }
        if self.accelerator:
            capacity[TPU_RESOURCE] = str(self.chips_per_vm)
        metadata: dict[str, Any] = {"name": node_name, "labels": self.node_labels(node_name)}
        if self.max_run_seconds:
            ends = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.max_run_seconds)
            metadata["annotations"] = {TERMINATION_ANNOTATION: ends.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": metadata,
            "spec": {
                "providerID": f"gce://localcluster/{self.zone}/{node_name}",
                "taints": ([dict(TPU_TAINT)] if self.accelerator else [])
                + [dict(taint) for taint in self.taints],
            },
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                "addresses": [
                    {"type": "InternalIP", "address": internal_ip},
                    {"type": "Hostname", "address": node_name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "osImage": "localcluster node agent",
                    "kernelVersion": "",
                    "containerRuntimeVersion": "localcluster://process",
                    "kubeletVersion": kubelet_version,
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["labels"] = dict(self.labels)
        data["taints"] = [dict(taint) for taint in self.taints]
        return data


CUBE_VMS = 16
TOPOLOGY_MODE_LABEL = "cloud.google.com/gke-accelerator-topology-mode"
PARTITION_PREFIX = "cloud.google.com/gke-tpu-partition-"
BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUB_SLICE_SHAPES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")


def cube(name: str, **fields: Any) -> Pool:
    """An Ironwood cube for dynamic slicing (``Pool.dynamic_slicing``): tpu7x 4x4x4, 16 VMs
    of 4 chips, simulated pods unless ``fields`` say otherwise."""
    settings: dict[str, Any] = {"mode": "simulate", **fields}
    return Pool(
        name=name,
        accelerator="tpu7x",
        topology="4x4x4",
        vms=CUBE_VMS,
        chips_per_vm=4,
        dynamic_slicing=True,
        **settings,
    )


def cube_partitions(pool: str, index: int) -> dict[str, str]:
    """shape -> id of the partitions VM ``index`` of cube ``pool`` belongs to.

    The cube's 16 VMs (2x2x1 chips each) form a 2x2x4 grid: VM i sits at x = i % 2,
    y = i // 2 % 2, z = i // 4. A 2x2x2 partition is two VMs along z, 2x2x4 the four VMs
    of one (x, y), 2x4x4 the eight of one x. (GKE documents the labels, not this layout.)
    """
    x, y, z = index % 2, index // 2 % 2, index // 4
    keys = {
        "2x2x1": f"{index}",
        "2x2x2": f"{x}{y}{z // 2}",
        "2x2x4": f"{x}{y}",
        "2x4x4": f"{x}",
        "4x4x4": "",
    }
    return {
        shape: hashlib.sha256(f"{pool}/{shape}/{key}".encode()).hexdigest()[:32]
        for shape, key in keys.items()
    }


def topology_chips(topology: str, where: str = "topology") -> int:
    try:
        dims = [int(part) for part in topology.split("x")]
    except ValueError:
        raise PoolError(f"{where}: topology {topology!r} is not like 2x4 or 2x2x2") from None
    if not 2 <= len(dims) <= 3 or min(dims) < 1:
        raise PoolError(f"{where}: topology {topology!r} is not like 2x4 or 2x2x2")
    return math.prod(dims)


def _dns_label(name: str) -> bool:
    return (
        len(name) <= 50
        and name[0].isalnum()
        and name[-1].isalnum()
        and all(c.islower() or c.isdigit() or c == "-" for c in name)
    )


_FIELDS = set(Pool.__dataclass_fields__)


def pool_from_dict(data: Mapping[str, Any]) -> Pool:
    unknown = set(data) - _FIELDS
    name = data.get("name", "?")
    if unknown:
        raise PoolError(
            f"pool {name!r}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}"
        )
    values = dict(data)
    if isinstance(values.get("simulate"), Mapping):
        values["simulate"] = Simulate(**values["simulate"])
    if values.get("taints") is not None:
        values["taints"] = tuple(dict(taint) for taint in values["taints"])
    for key in ("cpu", "memory"):
        if key in values:
            values[key] = str(values[key])
    try:
        return Pool(**values)
    except TypeError as error:
        raise PoolError(f"pool {name!r}: {error}") from None


def load_pools(path: Path | str = DEFAULT_POOLS_FILE) -> list[Pool]:
    """Pools of a YAML pool file (format in this module's docstring)."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    pools = [pool_from_dict(item) for item in document.get("pools", [])]
    check_unique(pools)
    return pools


def dump_pools(pools: Iterable[Pool]) -> str:
    return yaml.safe_dump({"pools": [pool.to_dict() for pool in pools]}, sort_keys=False)


def default_pools() -> list[Pool]:
    return load_pools(DEFAULT_POOLS_FILE)


def check_unique(pools: Sequence[Pool]) -> None:
    seen: set[str] = set()
    for pool in pools:
        if pool.name in seen:
            raise PoolError(f"pool {pool.name!r} is declared twice")
        seen.add(pool.name)
