"""Shared fixtures: one local cluster per test session, one namespace per test.

The cluster starts only when a test asks for it (directly or through ``namespace``,
``kubectl``, ``api``, ``k8s``), so unit tests never pay for it. It runs in the
foreground of the pytest process (its components die with pytest, even on SIGKILL) in
``.localcluster/test-<pid>``; the directory is kept after the session for its logs and
removed by a later session once its processes are gone.

``LOCALCLUSTER_ATTACH=<dir>`` reuses a cluster started with ``python -m localcluster up``
instead (fast edit-test loops); it is left running.

Fixtures:

- ``cluster`` (session): :class:`localcluster.Cluster` (``.kubectl``, ``.agent``,
  ``.kubeconfig``, ``.server``, ``.logs_dir``, ``.pod_log(ns, pod, container)``).
- ``api`` (session): :class:`localcluster.api.SyncApi`, raw JSON requests as admin.
- ``k8s`` (session): a ``kubernetes.client.ApiClient`` for the cluster.
- ``namespace`` (function): a fresh namespace (its ``default`` ServiceAccount exists),
  deleted after the test.
- ``kubectl`` (function): ``kubectl(*args, input=None, check=True)`` in that namespace.
- ``wait_until``: :func:`localcluster.testing.wait_until` (poll, clear timeout message).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster
from localcluster.api import SyncApi
from localcluster.layout import Layout, read_state, recorded_processes
from localcluster.testing import wait_until as _wait_until

REPO = Path(__file__).resolve().parent.parent
TEST_CLUSTERS = REPO / ".localcluster"
TIERS = ("unit", "integration", "e2e", "kueue", "chaos")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test belongs to a tier: the README's test command selects by tier, so an
    unmarked test would silently never run."""
    untiered = [i.nodeid for i in items if not any(i.get_closest_marker(t) for t in TIERS)]
    if untiered:
        raise pytest.UsageError(
            f"tests without a tier marker ({', '.join(TIERS)}): {', '.join(untiered)}; "
            "add e.g. `pytestmark = pytest.mark.unit` to the module"
        )


def _remove_stale_test_clusters() -> None:
    for directory in TEST_CLUSTERS.glob("test-*"):
        records = recorded_processes(read_state(Layout(directory)))
        if not any(record.alive() for record in records.values()):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    attach = os.environ.get("LOCALCLUSTER_ATTACH")
    if attach:
        yield Cluster.attach(attach)
        return
    _remove_stale_test_clusters()
    started = Cluster.start(TEST_CLUSTERS / f"test-{os.getpid()}", fresh=True)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> SyncApi:
    return cluster.api()


@pytest.fixture(scope="session")
def k8s(cluster: Cluster) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, api: SyncApi) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    _wait_until(
        lambda: api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        timeout=30,
        message=f"the default ServiceAccount of namespace {name}",
    )
    try:
        yield name
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def kubectl(cluster: Cluster, namespace: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(
        *args: str,
        input: str | dict[str, Any] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        text = json.dumps(input) if isinstance(input, dict) else input
        return cluster.kubectl(f"--namespace={namespace}", *args, input=text, check=check)

    return run


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    return _wait_until
