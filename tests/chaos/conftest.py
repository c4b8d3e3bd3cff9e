"""Fixtures of the chaos tier: a cluster of its own, the seed, a namespace per test.

The seed comes from ``TPU_CHAOS_SEED`` (else a random one); it is printed at the start
and added to every failure report, so ``TPU_CHAOS_SEED=<seed> pytest -m chaos`` replays
the same schedule of faults and kill points.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster
from tests.operator.support import Api, install_crds, scratch_namespace

SEED = int(os.environ.get("TPU_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
GRACE_SECONDS = 60.0
"""Node-monitor grace period (GKE's is 40-50 s): an apiserver outage plus a lease interval
must not make the node-lifecycle controller mark the nodes NotReady."""


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.get_closest_marker("chaos") for item in session.items):
        print(f"\nchaos tier: TPU_CHAOS_SEED={SEED}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and item.get_closest_marker("chaos"):
        report.sections.append(("chaos seed", f"replay with TPU_CHAOS_SEED={SEED}"))


@pytest.fixture(scope="package")
def chaos_cluster() -> Iterator[Cluster]:
    """A cluster of its own (the default pools): the faults never disturb other tests."""
    directory = Path(__file__).resolve().parents[2] / ".localcluster" / f"test-chaos-{os.getpid()}"
    cluster = Cluster.start(directory, node_monitor_grace_period=GRACE_SECONDS, fresh=True)
    try:
        install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def tpu(chaos_cluster: Cluster) -> Api:
    return Api(chaos_cluster)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The tier's seed mixed with the test's name: each test has its own schedule."""
    return random.Random(f"{SEED}:{request.node.name}").randrange(2**31)


@pytest.fixture
def chaos_namespace(tpu: Api) -> Iterator[str]:
    yield from scratch_namespace(tpu, f"chaos-{uuid.uuid4().hex[:6]}")
