"""The labels a node's view keeps (``views.pool_labels``): its pool's, shared by every node
carrying the same ones, without the hostname only one node has."""

from __future__ import annotations

import gc
import json
import weakref
from typing import Any

import pytest

from tpu_operator.placement.pools import pools_from_nodes
from tpu_operator.state.views import node_view

pytestmark = pytest.mark.unit


def _node(name: str, pool: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "cloud.google.com/gke-nodepool": pool,
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                "cloud.google.com/gke-tpu-topology": "2x2x1",
                **labels,
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _decoded(document: dict[str, Any]) -> dict[str, Any]:
    """As a watch event brings it: equal text, strings of its own."""
    return json.loads(json.dumps(document))


def test_nodes_with_the_same_labels_share_one_labels_dict_without_their_hostnames():
    view_a, view_b = (node_view(_decoded(_node(n, "pool-a", role="spare"))) for n in "ab")
    assert view_a.labels is view_b.labels
    assert "kubernetes.io/hostname" not in view_a.labels
    assert view_a.labels["cloud.google.com/gke-nodepool"] == "pool-a"
    other = node_view(_decoded(_node("c", "pool-a", role="main")))
    assert other.labels is not view_a.labels and other.labels["role"] == "main"


def test_a_shared_labels_dict_is_dropped_with_the_last_view_holding_it():
    view = node_view(_node("a", "pool-gone", role="once"))
    held = weakref.ref(view.labels)  # type: ignore[arg-type]
    del view
    gc.collect()
    assert held() is None
    again = node_view(_node("b", "pool-gone", role="once"))
    assert again.labels == {
        "cloud.google.com/gke-nodepool": "pool-gone",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x1",
        "role": "once",
    }


def test_a_pool_of_one_node_has_the_labels_of_a_larger_pool():
    """A spare selector matches a one-VM pool as it matches a larger one: the hostname,
    which only the one-VM pool's nodes would all have shared, is no pool label."""
    pools = pools_from_nodes(
        [
            node_view(_node("single-0", "single", role="spare")),
            node_view(_node("multi-0", "multi", role="spare")),
            node_view(_node("multi-1", "multi", role="spare")),
        ]
    )
    assert {name: dict(p.labels) for name, p in pools.items()} == {
        name: {
            "cloud.google.com/gke-nodepool": name,
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
            "cloud.google.com/gke-tpu-topology": "2x2x1",
            "role": "spare",
        }
        for name in ("single", "multi")
    }
