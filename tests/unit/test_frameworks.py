"""Frameworks on TPUJob pods: the example manifests and the env each framework reads.

Every manifest in examples/ is read with the API models, and the worker pods the operator
would create for it are built with the real pod builder; the tests then check that the
variables TensorFlow's TPUStrategy, PyTorch/XLA and JAX on Ironwood read (docs/tasks/frameworks.md)
are set, per worker, with the values those frameworks expect.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_operator import catalog, contract
from tpu_operator.api.job import TPUJobSpec
from tpu_operator.api.slice import TPUSliceSpec
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring, Ports

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# torch_xla/_internal/tpu.py (github.com/pytorch/xla), version(): how PyTorch/XLA reads the
# TPU generation from TPU_ACCELERATOR_TYPE when TPU_SKIP_MDS_QUERY is set.
TORCH_XLA_ACCELERATOR_TYPE = re.compile(r"^(?:v|tpu)(\d)([A-Za-z]?){7}-(\d+)$")


def workloads(path: Path) -> list[dict[str, Any]]:
    """The TPUJob and TPUSlice documents of an example file (which may hold other objects)."""
    return [
        d
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") in (contract.JOB_KIND, contract.SLICE_KIND)
    ]


def manifest(name: str) -> dict[str, Any]:
    [body] = workloads(EXAMPLES / name)
    return body


WORKLOADS = [
    (f"{path.relative_to(EXAMPLES)}:{body['metadata']['name']}", body)
    for path in sorted(EXAMPLES.rglob("*.yaml"))
    for body in workloads(path)
]


def pods(body: dict[str, Any]) -> list[tuple[PodWiring, dict[str, Any]]]:
    """Every worker pod of attempt 1 of a TPUJob or standalone TPUSlice manifest."""
    name = body["metadata"]["name"]
    if body["kind"] == contract.JOB_KIND:
        job = TPUJobSpec.model_validate(body["spec"])
        shape, num_slices, given = job.slice.resolve(), job.num_slices, job.ports
        slice_names = [contract.slice_name(name, i) for i in range(num_slices)]
    else:
        standalone = TPUSliceSpec.model_validate(body["spec"])
        shape, num_slices, given = standalone.resolve(), 1, standalone.ports
        slice_names = [name]
    ports = Ports(given.coordinator, given.megascale, given.metrics) if given else Ports()
    owner = Owner(contract.API_VERSION, body["kind"], name, "uid")
    built = []
    for index, slice_name in enumerate(slice_names):
        for worker in range(shape.hosts):
            wiring = PodWiring(
                job_name=name,
                service=name,
                slice_name=slice_name,
                shape=shape,
                num_slices=num_slices,
                slice_index=index,
                worker_index=worker,
                attempt=1,
                ports=ports,
                slice_names=tuple(slice_names),
            )
            pod = worker_pod(
                namespace="ml",
                wiring=wiring,
                template=body["spec"]["template"],
                owner=owner,
                placement=NodePlacement(),
            )
            built.append((wiring, pod))
    return built


def worker_env(pod: dict[str, Any]) -> dict[str, str]:
    """The worker container's literal env values (the last entry of a name wins)."""
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    return {e["name"]: e["value"] for e in worker["env"] if "value" in e}


def script(pod: dict[str, Any]) -> str:
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    return "\n".join(worker.get("command", []) + worker.get("args", []))


@pytest.mark.parametrize("body", [b for _, b in WORKLOADS], ids=[i for i, _ in WORKLOADS])
def test_every_example_reads_and_builds(body):
    assert body["apiVersion"] == contract.API_VERSION
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", body["metadata"]["name"])
    containers = body["spec"]["template"]["spec"]["containers"]
    assert contract.WORKER_CONTAINER in [c["name"] for c in containers]
    for container in containers:  # the CRD rejects per-pod identity env in templates
        assert not {e["name"] for e in container.get("env", [])} & set(contract.IDENTITY_ENV)
    built = pods(body)
    assert built
    for wiring, pod in built:
        assert worker_env(pod)[contract.ENV_TPU_WORKER_ID] == str(wiring.worker_index)


def test_tensorflow_tpustrategy_gets_the_single_host_contract():
    [(wiring, pod)] = pods(manifest("tensorflow-tpustrategy.yaml"))  # one VM, one pod
    shape = wiring.shape
    assert not shape.multi_host and wiring.num_slices == 1
    assert shape.generation.name != "tpu7x"  # TensorFlow is not supported on TPU7x
    env = worker_env(pod)
    # TPUClusterResolver(tpu="local") uses the chips of this VM; libtpu takes the slice
    # from the env instead of the metadata server.
    assert 'TPUClusterResolver(tpu="local")' in script(pod)
    assert env[contract.ENV_TPU_SKIP_MDS_QUERY] == "true"
    assert env[contract.ENV_TPU_ACCELERATOR_TYPE] == shape.short_type == "v5litepod-4"
    assert env[contract.ENV_TPU_TOPOLOGY] == "2x2"
    assert env[contract.ENV_TPU_WORKER_ID] == "0"
    assert env[contract.ENV_TPU_WORKER_HOSTNAMES] == "tf-tpustrategy-0-0.tf-tpustrategy"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[contract.TPU_RESOURCE] == "4"  # every chip of the VM


def test_pytorch_xla_gets_what_torch_xla_reads():
    built = pods(manifest("pytorch-xla.yaml"))
    assert len(built) == 4  # v6e-16: one process per VM
    leader = built[0][0].hostnames()[0]
    for wiring, pod in built:
        env = worker_env(pod)
        assert env["PJRT_DEVICE"] == "TPU"
        assert env[contract.ENV_TPU_SKIP_MDS_QUERY]  # torch_xla: read the env, not metadata
        match = TORCH_XLA_ACCELERATOR_TYPE.match(env[contract.ENV_TPU_ACCELERATOR_TYPE])
        assert match and match.group(1) == "6"
        assert env[contract.ENV_TPU_WORKER_ID] == str(wiring.worker_index)
        hostnames = env[contract.ENV_TPU_WORKER_HOSTNAMES].split(",")
        assert len(hostnames) == wiring.shape.hosts
        assert hostnames[wiring.worker_index] == f"{wiring.pod_name}.pytorch-xla"
        # xla:// meets at MASTER_ADDR:MASTER_PORT: worker 0 of slice 0, a port of its own.
        assert env["MASTER_ADDR"] == leader == "pytorch-xla-0-0.pytorch-xla"
        master_port = int(env["MASTER_PORT"])
        assert master_port not in contract.RESERVED_PORTS
        assert master_port != contract.DEFAULT_METRICS_PORT


@pytest.mark.parametrize(
    ("generation", "version"), [("v4", 4), ("v5e", 5), ("v5p", 5), ("v6e", 6), ("tpu7x", 7)]
)
def test_torch_xla_parses_every_accelerator_type(generation, version):
    """TPU_ACCELERATOR_TYPE is spelled as Cloud TPU spells it, which torch_xla parses."""
    named = catalog.named_topologies(catalog.BY_NAME[generation])
    for topology in named.values():
        shape = catalog.shape(catalog.BY_NAME[generation].accelerator, topology)
        match = TORCH_XLA_ACCELERATOR_TYPE.match(shape.short_type)
        assert match and int(match.group(1)) == version, shape.short_type


def test_ironwood_example_gets_process_addresses_per_slice():
    built = pods(manifest("tpu7x-multislice.yaml"))
    assert len(built) == 2 * 16  # two tpu7x-128 slices of 16 VMs
    for wiring, pod in built:
        env = worker_env(pod)
        addresses = env[contract.ENV_TPU_PROCESS_ADDRESSES].split(",")
        assert addresses == [f"{h}:{contract.DEFAULT_TPU_PROCESS_PORT}" for h in wiring.hostnames()]
        assert all(a.startswith(f"ironwood-{wiring.slice_index}-") for a in addresses)
        assert env[contract.ENV_TPU_PROCESS_PORT] == str(contract.DEFAULT_TPU_PROCESS_PORT)
        assert env[contract.ENV_MEGASCALE_SLICE_ID] == str(wiring.slice_index)
        assert env[contract.ENV_JAX_COORDINATOR_ADDRESS] == "ironwood-0-0.ironwood:8482"


def test_v6e_jax_example_runs_one_process_per_vm_of_a_v6e_16():
    built = pods(manifest("v6e-jax.yaml"))
    assert len(built) == 4  # 4x4: four ct6e-standard-4t VMs of 4 chips
    for wiring, pod in built:
        env = worker_env(pod)
        assert env[contract.ENV_TPU_ACCELERATOR_TYPE] == "v6e-16"
        assert env[contract.ENV_TPU_TOPOLOGY] == "4x4"
        assert env[contract.ENV_NUM_PROCESSES] == "4"
        assert env[contract.ENV_PROCESS_ID] == str(wiring.worker_index)
        selector = pod["spec"]["nodeSelector"]
        assert selector[contract.NODE_LABEL_ACCELERATOR] == "tpu-v6e-slice"
        assert selector[contract.NODE_LABEL_TOPOLOGY] == "4x4"
        worker = pod["spec"]["containers"][0]
        assert worker["resources"]["limits"][contract.TPU_RESOURCE] == "4"
        assert worker["command"] == ["tpu-worker", "demo"]
