"""How one worker pod is wired into its job: identity, peers and the contract env.

``PodWiring`` holds everything that differs between the pods of a job; ``contract_env``
turns it into the env list of the pod contract (see ``tpu_operator.contract``). The
worker tests build their process env with this same function, so the operator and the
worker can never disagree on names or values.

On generations whose libtpu takes its peers from ``TPU_PROCESS_ADDRESSES`` (Ironwood,
``Generation.process_addresses``) every worker also gets that list (``host:port`` of each
worker of its own slice, so it differs per slice in a multislice job) and
``TPU_PROCESS_PORT``. The port is ``Ports.tpu_process``; a template that sets
``TPU_PROCESS_PORT`` to a number moves the addresses with it (``with_template_env``), as
LWS and the KubeRay TPU webhook do.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tpu_operator import contract
from tpu_operator.catalog import SliceShape


@dataclass(frozen=True)
class Ports:
    coordinator: int = contract.DEFAULT_COORDINATOR_PORT
    megascale: int = contract.DEFAULT_MEGASCALE_PORT
    metrics: int = contract.DEFAULT_METRICS_PORT
    # libtpu's TPU_PROCESS_PORT where the generation uses TPU_PROCESS_ADDRESSES.
    tpu_process: int = contract.DEFAULT_TPU_PROCESS_PORT


@dataclass(frozen=True)
class PodWiring:
    """Where one worker sits in its job."""

    job_name: str  # the job (or standalone slice) the gang belongs to
    service: str  # headless Service that gives pods their DNS names
    slice_name: str
    shape: SliceShape
    num_slices: int
    slice_index: int
    worker_index: int
    attempt: int
    ports: Ports = Ports()
    # Name of slice i of the gang; defaults to contract.slice_name(job_name, i).
    slice_names: tuple[str, ...] = ()
    # The slices (by index in the job) the attempt runs on when an elastic job runs on
    # fewer than num_slices; empty: all of them.
    world: tuple[int, ...] = ()

    @property
    def pod_name(self) -> str:
        return contract.pod_name(self.slice_name, self.worker_index)

    def slice_name_of(self, index: int) -> str:
        if self.slice_names:
            return self.slice_names[index]
        return contract.slice_name(self.job_name, index)

    def hostnames(self) -> list[str]:
        """DNS names of this slice's workers, ordered by worker id."""
        return _worker_hostnames(self.slice_name, self.service, self.shape.hosts).split(",")

    def process_addresses(self) -> list[str]:
        """``host:port`` of this slice's workers for TPU_PROCESS_ADDRESSES, by worker id."""
        return self.process_addresses_value().split(",")

    def hostnames_value(self) -> str:
        """TPU_WORKER_HOSTNAMES: every worker's DNS name, comma-separated."""
        return _worker_hostnames(self.slice_name, self.service, self.shape.hosts)

    def process_addresses_value(self) -> str:
        """TPU_PROCESS_ADDRESSES: every worker's ``host:port``, comma-separated."""
        return _process_addresses(
            self.slice_name, self.service, self.shape.hosts, self.ports.tpu_process
        )

    @property
    def world_size(self) -> int:
        """Slices the attempt runs on: num_slices, or fewer when ``world`` names them."""
        return len(self.world) if self.world else self.num_slices

    @property
    def rank(self) -> int:
        """This slice's place in the attempt's world (its MEGASCALE_SLICE_ID)."""
        return self.world.index(self.slice_index) if self.world else self.slice_index

    @property
    def leader_host(self) -> str:
        """DNS name of the world's first slice's worker 0: the JAX and Megascale
        coordinator."""
        first = self.world[0] if self.world else 0
        return contract.pod_dns_name(contract.pod_name(self.slice_name_of(first), 0), self.service)

    @property
    def process_id(self) -> int:
        return contract.global_process_id(self.rank, self.shape.hosts, self.worker_index)

    @property
    def num_processes(self) -> int:
        return self.world_size * self.shape.hosts


# Every pod of a slice carries the same peer lists, as long as the slice has hosts: built
# once per slice rather than once per pod (at 1,024 hosts, once per pod made building a
# slice's pods quadratic: 5 % of the operator's CPU while it created them).
@functools.lru_cache(maxsize=256)
def _worker_hostnames(slice_name: str, service: str, hosts: int) -> str:
    return ",".join(
        contract.pod_dns_name(contract.pod_name(slice_name, w), service) for w in range(hosts)
    )


@functools.lru_cache(maxsize=256)
def _process_addresses(slice_name: str, service: str, hosts: int, port: int) -> str:
    return ",".join(
        f"{host}:{port}" for host in _worker_hostnames(slice_name, service, hosts).split(",")
    )


def _value(name: str, value: object) -> dict[str, object]:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> dict[str, object]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def contract_env(wiring: PodWiring) -> list[dict[str, object]]:
    """The pod contract's env for one worker, in a stable order."""
    shape = wiring.shape
    env = [
        _value(contract.ENV_TPU_WORKER_ID, wiring.worker_index),
        _value(contract.ENV_TPU_WORKER_HOSTNAMES, wiring.hostnames_value()),
        _value(contract.ENV_TPU_SKIP_MDS_QUERY, "true"),
        _value(contract.ENV_TPU_ACCELERATOR_TYPE, shape.short_type),
        _value(contract.ENV_TPU_TOPOLOGY, shape.topology),
    ]
    if shape.generation.process_addresses:
        env += [
            _value(contract.ENV_TPU_PROCESS_ADDRESSES, wiring.process_addresses_value()),
            _value(contract.ENV_TPU_PROCESS_PORT, wiring.ports.tpu_process),
        ]
    if wiring.world_size > 1:
        env += [
            _value(contract.ENV_MEGASCALE_NUM_SLICES, wiring.world_size),
            _value(contract.ENV_MEGASCALE_SLICE_ID, wiring.rank),
            _value(contract.ENV_MEGASCALE_COORDINATOR_ADDRESS, wiring.leader_host),
            _value(contract.ENV_MEGASCALE_PORT, wiring.ports.megascale),
        ]
    env += [
        _value(
            contract.ENV_JAX_COORDINATOR_ADDRESS,
            f"{wiring.leader_host}:{wiring.ports.coordinator}",
        ),
        _value(contract.ENV_PROCESS_ID, wiring.process_id),
        _value(contract.ENV_NUM_PROCESSES, wiring.num_processes),
        _value(contract.ENV_JOB_NAME, wiring.job_name),
        _value(contract.ENV_SLICE_INDEX, wiring.rank),
        _value(contract.ENV_NUM_SLICES, wiring.world_size),
        _value(contract.ENV_HOSTS_PER_SLICE, shape.hosts),
        _value(contract.ENV_CHIPS_PER_HOST, shape.chips_per_host),
        _value(contract.ENV_RESTART_ATTEMPT, wiring.attempt),
        _value(contract.ENV_COORDINATOR_PORT, wiring.ports.coordinator),
        _value(contract.ENV_METRICS_PORT, wiring.ports.metrics),
        _field(contract.ENV_POD_NAME, "metadata.name"),
        _field(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
        _field(contract.ENV_POD_IP, "status.podIP"),
        _field(contract.ENV_NODE_NAME, "spec.nodeName"),
    ]
    return env


def world_env(wiring: PodWiring) -> dict[str, str]:
    """The env of a start command (``contract.START_ENV``) that moves a pod's next
    training process into ``wiring``'s world: the attempt, the process and slice ids and
    counts and the coordinators as ``contract_env`` gives them, and an empty value (unset)
    for each Megascale variable a single-slice world has none of. A pod that stays while
    its job runs on other slices keeps its name, so every other contract variable of the
    pod holds as it is."""
    values = {str(e["name"]): str(e["value"]) for e in contract_env(wiring) if "value" in e}
    return {name: values.get(name, "") for name in contract.START_ENV}


def with_template_env(wiring: PodWiring, template_env: Iterable[Mapping[str, object]]) -> PodWiring:
    """``wiring`` with the TPU process port a template's worker env sets, if it sets one.

    The last entry of that name counts, as in Kubernetes, and only a literal port number
    (``$(VAR)`` references and ``valueFrom`` cannot be resolved here); anything else keeps
    the default, and the template's entry then overrides TPU_PROCESS_PORT alone.
    """
    values = [
        e.get("value") for e in template_env if e.get("name") == contract.ENV_TPU_PROCESS_PORT
    ]
    value = values[-1] if values else None
    # ASCII digits only ("²".isdigit() is true) and at most 5 of them (int() refuses
    # digit strings over 4300 characters): anything else is left to the apiserver.
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5):
        return wiring
    port = int(value)
    if not 0 < port <= 65535:
        return wiring
    ports = dataclasses.replace(wiring.ports, tpu_process=port)
    return dataclasses.replace(wiring, ports=ports)


def resolved_env(wiring: PodWiring, pod_ip: str, namespace: str = "default") -> dict[str, str]:
    """The contract env as a process would see it (downward-API fields filled in).

    For running workers outside Kubernetes (tests, benchmarks) with exactly the env the
    operator gives a pod.
    """
    fields = {
        "metadata.name": wiring.pod_name,
        "metadata.namespace": namespace,
        "status.podIP": pod_ip,
        "spec.nodeName": f"local-{wiring.slice_name}-{wiring.worker_index}",
    }
    resolved: dict[str, str] = {}
    for item in contract_env(wiring):
        if "value" in item:
            resolved[str(item["name"])] = str(item["value"])
        else:
            source = item["valueFrom"]
            assert isinstance(source, dict)
            resolved[str(item["name"])] = fields[source["fieldRef"]["fieldPath"]]
    return resolved
