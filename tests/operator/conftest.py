"""Fixtures for the operator's integration tests: CRDs installed, the operator running as
the chart's ServiceAccount with exactly the chart's RBAC (``ChartIdentity``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localcluster.agent.client import AgentError
from localcluster.pools import Pool
from tests.operator.support import Api, ChartIdentity, OperatorProcess, install_crds

RELEASE = "tpu-operator-it"
"""The release (and namespace) the package's operator's identity is rendered for: not the
end-to-end tier's, whose helm release would collide with these ClusterRoles."""


@pytest.fixture(scope="session")
def crds(cluster) -> None:
    install_crds(cluster)


@pytest.fixture(scope="package")
def identity(cluster, tmp_path_factory) -> Iterator[ChartIdentity]:
    """The chart's ServiceAccount and RBAC (default values: in-place restarts on)."""
    directory = Path(tmp_path_factory.mktemp("identity"))
    made = ChartIdentity(cluster, directory, release=RELEASE, namespace=RELEASE).create()
    yield made
    made.delete()


@pytest.fixture(scope="package")
def operator(cluster, crds, identity, tmp_path_factory) -> Iterator[OperatorProcess]:
    """One operator process for this package's tests, acting as the chart's ServiceAccount;
    stopped before other packages (the end-to-end tests run the operator from the Helm
    chart and must not meet a second one)."""
    directory = Path(tmp_path_factory.mktemp("operator"))
    log_path = directory / "operator.log"
    key = directory / "control.key"
    key.write_bytes(b"tests-control-master-key-0123456789")
    # Progress every 2 s instead of 30 s, so that the progress tests need not wait; a key
    # file, as the chart mounts one, so that a restarted operator can still command the
    # supervisors of running jobs.
    process = identity.operator(
        log_path,
        ["--progress-publish-seconds=2", "--in-place-restarts", f"--control-key-file={key}"],
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def tpu(cluster) -> Api:
    """TPUJob, TPUSlice and pod helpers over the admin client."""
    return Api(cluster)


@pytest.fixture
def running_operator(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session's operator, restarted if an earlier test killed it; its log on failure."""
    if operator.process is None or operator.process.poll() is not None:
        operator.start()
    yield operator


@pytest.fixture
def tpu_pools(cluster, namespace) -> Iterator[Callable[[int], list[str]]]:
    """``tpu_pools(n)``: n fresh v4 2x2x2 pools (2 VMs each; ``topology`` and ``vms`` for
    another v4 shape), named uniquely for this
    test (pods left over by a test stay pinned to its pools' names, so a later test never
    reuses one); removed after the test, the namespace's jobs and slices deleted first."""
    added: list[str] = []

    def add(count: int, topology: str = "2x2x2", vms: int = 2) -> list[str]:
        tag = uuid.uuid4().hex[:4]
        names = [f"ho{tag}-{chr(ord('a') + i)}" for i in range(count)]
        for name in names:
            cluster.agent.add_pool(
                Pool(
                    name=name,
                    vms=vms,
                    accelerator="tpu-v4-podslice",
                    topology=topology,
                    chips_per_vm=4,
                )
            )
            added.append(name)
        return names

    yield add
    cluster.kubectl(
        "delete", "tpujobs,tpuslices", "--all", "-n", namespace, "--wait=false", check=False
    )
    for name in added:
        try:
            cluster.agent.remove_pool(name)
        except AgentError as error:
            if error.status != 404:
                raise
