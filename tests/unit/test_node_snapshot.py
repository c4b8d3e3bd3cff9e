"""The node snapshot the reconcilers read: rebuilt only after a node event, derived
values (node pools) computed once per snapshot."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.unit.test_gang import pod
from tpu_operator.placement.pools import pools_from_nodes
from tpu_operator.runtime.caches import Caches
from tpu_operator.state.gang import Member, assess
from tpu_operator.state.views import NodeView

pytestmark = pytest.mark.unit


def node(name: str, pool: str = "p", ready: bool = True, notice: str | None = None) -> NodeView:
    return NodeView(
        name,
        pool,
        "tpu-v5p-slice",
        "2x2x1",
        ready,
        False,
        False,
        None,
        4,
        disruption_notice=notice,
    )


def caches_with(*nodes: NodeView) -> tuple[Caches, defaultdict[Any, list[Any]]]:
    index: defaultdict[Any, list[Any]] = defaultdict(list)
    for view in nodes:
        index[("node", view.name)].append(view)
        index[("tpu",)].append(view)
    return Caches(pods={}, slices={}, jobs={}, nodes=index), index


def test_lookups_follow_the_index_once_a_node_event_says_it_changed():
    caches, index = caches_with(node("a"), node("b", ready=False))
    assert caches.node("a") == node("a")
    assert caches.not_ready_nodes(["a", "b", "gone", None]) == {"b", "gone"}
    index[("node", "c")].append(node("c"))
    assert caches.node("c") is None  # the snapshot stands until the event arrives
    caches.nodes_changed()
    assert caches.node("c") == node("c")
    assert {n.name for n in caches.tpu_nodes()} == {"a", "b", "c"}


def test_derived_values_are_computed_once_per_snapshot():
    caches, index = caches_with(node("a", pool="p1"), node("b", pool="p2"))
    calls: list[int] = []

    def build(nodes: list[NodeView]) -> dict[str, Any]:
        calls.append(len(nodes))
        return pools_from_nodes(nodes)

    first = caches.from_nodes("pools", build)
    assert caches.from_nodes("pools", build) is first
    assert sorted(first) == ["p1", "p2"] and calls == [2]
    index[("node", "c")].append(node("c", pool="p3"))
    caches.nodes_changed()
    assert sorted(caches.from_nodes("pools", build)) == ["p1", "p2", "p3"]
    assert calls == [2, 3]


def test_noticed_nodes_are_the_nodes_with_a_notice_as_of_the_last_node_event():
    notice = "maintenance scheduled at 1795399137"
    caches, index = caches_with(node("a"), node("b", notice=notice))
    assert caches.noticed_nodes() == {"b": notice}
    index[("node", "a")] = [node("a", notice="terminating")]
    assert caches.noticed_nodes() == {"b": notice}  # until the event arrives
    caches.nodes_changed()
    assert caches.noticed_nodes() == {"a": "terminating", "b": notice}
    index[("node", "b")] = [node("b")]  # the maintenance is over
    caches.nodes_changed()
    assert caches.noticed_nodes() == {"a": "terminating"}


def test_terminating_nodes_are_those_taken_back_before_a_time():
    def ending(name: str, at: float | None) -> NodeView:
        return NodeView(
            name, "p", "tpu-v5p-slice", "2x2x1", True, False, False, None, 4, terminates_at=at
        )

    caches, _ = caches_with(ending("a", 300.0), ending("b", 100.0), ending("c", None))
    assert caches.terminating_nodes(50.0) == {}
    assert caches.terminating_nodes(200.0) == {"b": 100.0}
    assert caches.terminating_nodes(300.0) == {"b": 100.0}  # before, not at
    assert caches.terminating_nodes(1e12) == {"b": 100.0, "a": 300.0}


def test_a_node_of_an_unusable_ironwood_cube_is_lost_and_says_why():
    """Ready, but in a cube GKE marked UNHEALTHY: lost to the pods on it, and their
    failure names the cube's state rather than "the node is not ready"."""
    cube = {"4x4x4": ("c1", "UNHEALTHY"), "2x2x2": ("p1", "HEALTHY")}
    sick = NodeView("c-0", "cube", "tpu7x", "", True, False, False, None, 4, partitions=cube)
    caches, _ = caches_with(sick, node("a"), node("b", ready=False))
    lost = caches.not_ready_nodes(["c-0", "a", "b"])
    assert lost == {"c-0", "b"}
    failures = [
        gang.failure
        for gang in (
            assess(
                attempt=1,
                members=[Member(0, 0, "j-0-0")],
                pods=[pod("j-0-0", node=name)],
                not_ready_nodes=lost,
            )
            for name in ("c-0", "b")
        )
    ]
    assert [f.message for f in failures if f is not None] == [
        "pod j-0-0 on node c-0: its Ironwood cube is UNHEALTHY "
        "(cloud.google.com/gke-tpu-partition-4x4x4-state)",
        "pod j-0-0 on node b: the node is not ready",
    ]
