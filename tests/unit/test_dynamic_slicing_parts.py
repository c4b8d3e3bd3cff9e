"""Ironwood dynamic slicing, the pure parts: the shape a TPUJob may ask for, the cubes a
slice is formed of, the GKE Slice object, the pods' contract, cube health as node loss,
and the slice controller stand-in's verdicts (localcluster/agent/slicecontroller.py)."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster import pools
from localcluster.agent.slicecontroller import assess
from localcluster.pools import Pool, PoolError
from tpu_operator import catalog, contract
from tpu_operator.api.job import JobSliceSpec
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.placement import dynamic
from tpu_operator.runtime.caches import Caches
from tpu_operator.state.views import node_view

pytestmark = pytest.mark.unit

CUBE_ID = contract.partition_id_label("4x4x4")
CUBE_STATE = contract.partition_state_label("4x4x4")


def shape(topology: str, kind: str) -> catalog.SliceShape:
    return JobSliceSpec(accelerator="tpu7x", topology=topology, dynamic_slicing=kind).resolve()  # type: ignore[arg-type]


def cube_nodes(pool: str, state: str = "HEALTHY", ready: bool = True) -> list[dict[str, Any]]:
    """The Node objects of one cube, labelled as the local cluster labels them."""
    cube = pools.cube(pool)
    nodes = []
    for name in cube.node_names():
        labels = cube.node_labels(name)
        labels[CUBE_STATE] = state
        nodes.append(
            {
                "metadata": {"name": name, "labels": labels},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                    "allocatable": {"google.com/tpu": "4"},
                },
            }
        )
    return nodes


# -- the shape ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topology", "kind", "hosts", "partitions"),
    [
        ("4x4x4", "SuperSlice", 16, 1),
        ("4x4x8", "SuperSlice", 32, 2),
        ("8x8x8", "SuperSlice", 128, 8),
        ("2x2x1", "SubSlice", 1, 1),
        ("2x2x2", "SubSlice", 2, 1),
        ("2x4x4", "SubSlice", 8, 1),
    ],
)
def test_a_dynamic_shape_resolves_without_a_pool_of_its_own(topology, kind, hosts, partitions):
    resolved = shape(topology, kind)
    assert resolved.dynamic == kind
    assert resolved.hosts == hosts
    assert not resolved.needs_pool
    assert dynamic.partitions_needed(resolved) == partitions
    # The same topology as a fixed slice takes a node pool of its shape.
    fixed = JobSliceSpec(accelerator="tpu7x", topology=topology).resolve()
    assert fixed.dynamic is None and fixed.needs_pool == fixed.multi_host


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {"accelerator": "tpu7x", "topology": "4x4x8", "dynamic_slicing": "SubSlice"},
            ["SubSlice", "2x2x1, 2x2x2, 2x2x4, 2x4x4", "not 4x4x8"],
        ),
        (
            {"accelerator": "tpu7x", "topology": "2x2x2", "dynamic_slicing": "SuperSlice"},
            ["SuperSlice", "multiple of 4", "not 2x2x2"],
        ),
        (
            {"accelerator": "tpu-v5p-slice", "topology": "4x4x4", "dynamic_slicing": "SuperSlice"},
            ["tpu7x", "remove dynamicSlicing"],
        ),
        (
            {"type": "tpu7x-128", "dynamic_slicing": "SuperSlice"},
            ["accelerator: tpu7x and a topology"],
        ),
    ],
)
def test_a_shape_that_cannot_be_sliced_so_says_why(fields, words):
    with pytest.raises(catalog.CatalogError) as error:
        JobSliceSpec(**fields).resolve()
    for word in words:
        assert word in str(error.value)


def test_super_slice_topologies_follow_the_slice_crd():
    assert catalog.is_super_slice_topology("4x4x4")
    assert catalog.is_super_slice_topology("4x8x8")
    assert not catalog.is_super_slice_topology("4x8x4")  # A<=B<=C
    assert not catalog.is_super_slice_topology("4x4x6")  # multiples of 4
    assert not catalog.is_super_slice_topology("24x24x20")  # order
    assert catalog.is_super_slice_topology("16x24x24")  # 9,216 chips
    assert not catalog.is_super_slice_topology("16x24x28")  # more than 9,216


# -- the cubes ---------------------------------------------------------------------------


def views(*cubes: list[dict[str, Any]]):
    return [node_view(n) for cube in cubes for n in cube]


def test_a_super_slice_takes_free_healthy_cubes_in_id_order():
    nodes = views(cube_nodes("a"), cube_nodes("b", state="UNHEALTHY"), cube_nodes("c"))
    found = dynamic.partitions(nodes, "4x4x4")
    assert len(found) == 3
    choice = dynamic.choose(shape("4x4x8", "SuperSlice"), found, busy={})
    healthy = sorted(pid for pid, p in found.items() if p.states == frozenset({"HEALTHY"}))
    assert choice.ids == tuple(healthy)


def test_cubes_held_by_other_slices_or_degraded_ones_count_as_they_should():
    nodes = views(cube_nodes("a"), cube_nodes("b", state="DEGRADED"))
    found = dynamic.partitions(nodes, "4x4x4")
    ids = sorted(found)
    # DEGRADED may form a slice; a cube another Slice holds may not.
    busy = dynamic.busy_nodes(nodes, {ids[0]: "other"})
    assert len(busy) == 16
    choice = dynamic.choose(shape("4x4x4", "SuperSlice"), found, busy)
    assert choice.ids == (ids[1],)
    none = dynamic.choose(shape("4x4x8", "SuperSlice"), found, busy)
    assert none.ids is None
    assert "needs 2 free healthy 4x4x4 cubes" in none.message
    assert f"{ids[0]} (Slice other)" in none.message


def test_a_cube_with_a_vm_not_ready_or_missing_is_not_used():
    short = cube_nodes("a")[:15]
    not_ready = cube_nodes("b", ready=False)
    found = dynamic.partitions(views(short, not_ready), "4x4x4")
    choice = dynamic.choose(shape("4x4x4", "SuperSlice"), found, busy={})
    assert choice.ids is None
    assert "15 of its 16 VMs" in choice.message
    assert "a VM not ready or cordoned" in choice.message


def test_without_partition_labels_the_message_names_the_slice_controller():
    choice = dynamic.choose(shape("2x2x2", "SubSlice"), {}, busy={})
    assert choice.ids is None
    assert "is the slice controller enabled?" in choice.message


def test_a_sub_slice_takes_one_partition_of_its_own_shape():
    nodes = views(cube_nodes("a"))
    found = dynamic.partitions(nodes, "2x2x2")
    assert len(found) == 8 and all(len(p.nodes) == 2 for p in found.values())
    first = sorted(found)[0]
    busy = dynamic.busy_nodes(nodes, {first: "x"})
    choice = dynamic.choose(shape("2x2x2", "SubSlice"), found, busy)
    assert choice.ids == (sorted(found)[1],)
    # A sub-slice anywhere in a cube keeps super-slices off the whole cube, and the
    # reverse: the levels share nodes.
    cube = dynamic.partitions(nodes, "4x4x4")
    blocked = dynamic.choose(shape("4x4x4", "SuperSlice"), cube, busy)
    assert blocked.ids is None and "(Slice x)" in blocked.message
    whole = dynamic.busy_nodes(nodes, {next(iter(cube)): "big"})
    assert dynamic.choose(shape("2x2x2", "SubSlice"), found, whole).ids is None


def test_a_sub_slice_is_not_cut_from_an_unhealthy_cube():
    # GKE marks the cube UNHEALTHY; the labels of its 2x2x2 partitions still say HEALTHY.
    nodes = views(cube_nodes("a", state="UNHEALTHY"))
    found = dynamic.partitions(nodes, "2x2x2")
    choice = dynamic.choose(shape("2x2x2", "SubSlice"), found, busy={})
    assert choice.ids is None and "state UNHEALTHY" in choice.message


def test_a_node_of_an_unusable_cube_is_lost_to_the_slice_on_it():
    healthy, bad = cube_nodes("a"), cube_nodes("b", state="UNHEALTHY")
    degraded = cube_nodes("c", state="DEGRADED")
    incomplete = cube_nodes("d", state="INCOMPLETE")
    assert not dynamic.cube_lost(node_view(healthy[0]))
    assert not dynamic.cube_lost(node_view(degraded[0]))
    assert dynamic.cube_lost(node_view(bad[0]))
    assert dynamic.cube_lost(node_view(incomplete[0]))
    by_name = {n["metadata"]["name"]: [node_view(n)] for n in healthy + bad}
    caches = Caches(
        pods={},
        slices={},
        jobs={},
        nodes={("node", name): views for name, views in by_name.items()},
    )
    lost = caches.not_ready_nodes([healthy[0]["metadata"]["name"], bad[0]["metadata"]["name"]])
    assert lost == {bad[0]["metadata"]["name"]}


# -- the Slice and the pods --------------------------------------------------------------


def test_slice_names_fit_gke_and_differ_per_namespace_and_attempt():
    long = "a" * 60
    name = dynamic.slice_name("ml", long, 12)
    assert len(name) <= dynamic.MAX_SLICE_NAME
    assert name.endswith("-a12") and name[0] == "a"
    assert dynamic.slice_name("ml", "train-0", 1) != dynamic.slice_name("other", "train-0", 1)
    assert dynamic.slice_name("ml", "train-0", 1) != dynamic.slice_name("ml", "train-0", 2)


def test_the_slice_object_is_what_gke_documents():
    body = dynamic.slice_body("s-a1", shape("4x4x8", "SuperSlice"), ["p0", "p1"], "ml", "t-0")
    assert body["apiVersion"] == "accelerator.gke.io/v1beta1" and body["kind"] == "Slice"
    assert body["spec"] == {"type": "tpu7x", "topology": "4x4x8", "partitionIds": ["p0", "p1"]}
    assert body["metadata"]["annotations"][contract.ANNOTATION_SLICE_OWNER] == "ml/t-0"
    selector = dynamic.owner_selector("ml", "t-0")
    key, value = selector.split("=")
    assert body["metadata"]["labels"][key] == value


@pytest.mark.parametrize(
    ("condition", "ready", "failed"),
    [
        (None, False, False),
        ({"type": "Ready", "status": "False", "reason": "ACTIVATING"}, False, False),
        ({"type": "Ready", "status": "True", "reason": "ACTIVE"}, True, False),
        ({"type": "Ready", "status": "True", "reason": "ACTIVE_DEGRADED"}, True, False),
        ({"type": "Ready", "status": "False", "reason": "FAILED"}, False, True),
        ({"type": "Ready", "status": "False", "reason": "SliceCreationFailed"}, False, True),
    ],
)
def test_slice_state_reads_the_ready_condition(condition, ready, failed):
    body = {"status": {"conditions": [condition]}} if condition else {}
    state = dynamic.slice_state(body)
    assert (state.ready, state.failed) == (ready, failed)


def test_pods_of_a_dynamic_slice_select_it_and_carry_its_topology():
    resolved = shape("4x4x8", "SuperSlice")
    wiring = PodWiring(
        job_name="train",
        service="train",
        slice_name="train-0",
        shape=resolved,
        num_slices=1,
        slice_index=0,
        worker_index=3,
        attempt=1,
    )
    pod = worker_pod(
        namespace="ml",
        wiring=wiring,
        template={"spec": {"containers": [{"name": "worker", "image": "x"}]}},
        owner=Owner(contract.API_VERSION, contract.SLICE_KIND, "train-0", "u"),
        placement=NodePlacement(dynamic_slice="train-0-abc123-a1"),
    )
    selector = pod["spec"]["nodeSelector"]
    assert selector[contract.NODE_LABEL_TPU_SLICE] == "train-0-abc123-a1"
    assert selector[contract.NODE_LABEL_ACCELERATOR] == "tpu7x"
    assert selector[contract.NODE_LABEL_TOPOLOGY] == "4x4x8"
    assert contract.NODE_LABEL_NODEPOOL not in selector
    assert pod["metadata"]["annotations"][contract.ANNOTATION_SLICE_TOPOLOGY] == "4x4x8"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["TPU_ACCELERATOR_TYPE"] == "tpu7x-256"
    # A fixed slice's pods carry neither.
    fixed = worker_pod(
        namespace="ml",
        wiring=wiring,
        template={"spec": {"containers": [{"name": "worker", "image": "x"}]}},
        owner=Owner(contract.API_VERSION, contract.SLICE_KIND, "train-0", "u"),
        placement=NodePlacement(node_pool="p"),
    )
    assert contract.NODE_LABEL_TPU_SLICE not in fixed["spec"]["nodeSelector"]
    assert contract.ANNOTATION_SLICE_TOPOLOGY not in (fixed["metadata"].get("annotations") or {})


# -- the local cluster's stand-ins -------------------------------------------------------


def labels_of(*cubes: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"]["labels"] for cube in cubes for n in cube}


def test_stand_in_forms_a_slice_of_the_named_cubes_only():
    a, b = cube_nodes("a"), cube_nodes("b")
    nodes = labels_of(a, b)
    ids = sorted({labels[CUBE_ID] for labels in nodes.values()})
    verdict = assess({"type": "tpu7x", "topology": "4x4x8", "partitionIds": ids}, nodes, {})
    assert verdict.ready and verdict.reason == "ACTIVE" and len(verdict.nodes) == 32
    one = assess({"type": "tpu7x", "topology": "4x4x4", "partitionIds": ids[:1]}, nodes, {})
    assert one.ready and set(one.nodes) == {
        n for n, labels in nodes.items() if labels[CUBE_ID] == ids[0]
    }


def test_stand_in_refuses_what_gke_refuses():
    nodes = labels_of(cube_nodes("a"), cube_nodes("b", state="UNHEALTHY"))
    ids = sorted({labels[CUBE_ID] for labels in nodes.values()})
    wrong_count = assess({"topology": "4x4x8", "partitionIds": ids[:1]}, nodes, {})
    assert (wrong_count.ready, wrong_count.reason) == (False, "SliceCreationFailed")
    unknown = assess({"topology": "4x4x4", "partitionIds": ["nope"]}, nodes, {})
    assert unknown.reason == "SliceCreationFailed"
    held = assess({"topology": "4x4x4", "partitionIds": ids[:1]}, nodes, {ids[0]: "other"})
    assert held.reason == "SliceCreationFailed" and "other" in held.message
    in_held = next(labels for labels in nodes.values() if labels[CUBE_ID] == ids[0])
    sub = in_held[contract.partition_id_label("2x2x1")]
    inside = assess({"topology": "2x2x1", "partitionIds": [sub]}, nodes, {ids[0]: "big"})
    assert inside.reason == "SliceCreationFailed" and "big" in inside.message
    unhealthy = [
        i
        for i in ids
        if any(
            labels[CUBE_ID] == i and labels[CUBE_STATE] == "UNHEALTHY" for labels in nodes.values()
        )
    ]
    failed = assess({"topology": "4x4x4", "partitionIds": unhealthy}, nodes, {})
    assert (failed.ready, failed.reason) == (False, "FAILED")


def test_stand_in_sub_slices_and_degraded_cubes():
    nodes = labels_of(cube_nodes("a", state="DEGRADED"))
    pid = next(iter(nodes.values()))[contract.partition_id_label("2x2x4")]
    verdict = assess({"topology": "2x2x4", "partitionIds": [pid]}, nodes, {})
    assert verdict.ready and verdict.reason == "ACTIVE_DEGRADED" and len(verdict.nodes) == 4


def test_a_cube_pool_is_an_ironwood_cube():
    with pytest.raises(PoolError, match="Ironwood cubes"):
        Pool(name="c", accelerator="tpu7x", topology="2x2x2", vms=2, dynamic_slicing=True)
    cube = Pool(name="c", accelerator="tpu7x", topology="4x4x4", vms=16, dynamic_slicing=True)
    labels = cube.node_labels("c-0")
    assert contract.NODE_LABEL_TOPOLOGY not in labels  # until a Slice is formed
    for sub in (*catalog.SUB_SLICE_TOPOLOGIES, "4x4x4"):
        assert labels[contract.partition_state_label(sub)] == "HEALTHY"
    # Every partition of a shape has the VMs its chips need.
    for sub in catalog.SUB_SLICE_TOPOLOGIES:
        ids = [cube.node_labels(n)[contract.partition_id_label(sub)] for n in cube.node_names()]
        vms = catalog.shape("tpu7x", sub).chips // 4
        assert all(ids.count(i) == vms for i in ids)
