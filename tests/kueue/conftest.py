"""Fixtures for the Kueue tier: a real Kueue on the session's local cluster, the operator
run with ``--kueue`` as the chart's ServiceAccount with exactly the chart's RBAC for
``kueue.enabled`` (``ChartIdentity``), and one ClusterQueue + LocalQueue per test.

Kueue is built once (cached, ``localcluster/kueue.py``) and started per test module; it
is stopped (and its webhooks removed), and the ``--kueue`` operator with it, when the
module ends. Module scope, not package: ``tests/`` has no ``__init__.py`` files, so a
"package" fixture would live until the session ends and this operator would reconcile the
other tiers' TPUJobs next to theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.kueue import Kueue, tpu_queues
from localcluster.pools import default_pools
from tests.operator.support import Api, ChartIdentity, OperatorProcess, install_crds


@pytest.fixture(scope="module")
def kueue(cluster) -> Iterator[Kueue]:
    started = Kueue.start(cluster)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def kueue_operator(cluster, kueue, tmp_path_factory) -> Iterator[OperatorProcess]:
    install_crds(cluster)
    directory = Path(tmp_path_factory.mktemp("operator"))
    identity = ChartIdentity(
        cluster,
        directory,
        release="tpu-operator-kueue",
        namespace="tpu-operator-kueue",
        values={"kueue": {"enabled": True}},
    ).create()
    process = identity.operator(directory / "operator.log", ["--kueue"])
    process.start()
    yield process
    process.stop()
    identity.delete()


@pytest.fixture
def operator(kueue_operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The package's operator, restarted if an earlier test killed it."""
    if kueue_operator.process is None or kueue_operator.process.poll() is not None:
        kueue_operator.start()
    yield kueue_operator


@pytest.fixture
def tpu(cluster) -> Api:
    return Api(cluster)


@pytest.fixture
def queue(cluster, kueue: Kueue, namespace: str) -> Iterator[Callable[..., str]]:
    """``queue(chips=None, preemption=True, topology=True, flavor=None)``: a ClusterQueue
    for this test's namespace only and a LocalQueue ``tpu`` in it; returns the
    ClusterQueue's name. ``flavor(name, spec)`` may change a ResourceFlavor's spec and
    returns its new name (flavors are cluster-wide: a changed one needs a name of its
    own) or None to leave that flavor out."""
    made: list[str] = []
    flavors: list[str] = []

    def make(
        chips: int | None = None,
        *,
        topology: bool = True,
        flavor: Callable[[str, dict[str, Any]], str | None] | None = None,
        **options: Any,
    ) -> str:
        name = f"cq-{namespace}"[:63]
        docs = tpu_queues(
            default_pools(),
            cluster_queue=name,
            namespaces=[namespace],
            chips=chips,
            topology=topology,
            **options,
        )
        renamed: dict[str, str | None] = {}
        if flavor is not None:
            kept = []
            for doc in docs:
                if doc["kind"] == "ResourceFlavor":
                    old = doc["metadata"]["name"]
                    new = renamed[old] = flavor(old, doc["spec"])
                    if new is None:
                        continue
                    if new != old:
                        doc["metadata"]["name"] = new
                        flavors.append(new)  # this test's own: deleted with its queue
                kept.append(doc)
            docs = kept
        for doc in docs:
            if doc["kind"] == "ClusterQueue":
                doc["spec"]["namespaceSelector"] = {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace}
                }
                if flavor is not None:
                    for group in doc["spec"]["resourceGroups"]:
                        group["flavors"] = [
                            {**f, "name": renamed[f["name"]]}
                            for f in group["flavors"]
                            if renamed.get(f["name"]) is not None
                        ]
        kueue.apply(docs)
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")
    for name in flavors:
        cluster.kubectl("delete", "resourceflavor", name, "--ignore-not-found", "--wait=false")
