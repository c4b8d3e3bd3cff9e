"""Placement (pure): pools matched on chips per VM, claims of pools GKE creates, the
machine type of a shape that fits two, and the pod fields they turn into."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest

from tpu_operator import catalog, contract
from tpu_operator.api.capacity import JobPlacement
from tpu_operator.api.policy import Placement
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.placement.pools import (
    PoolView,
    Request,
    allocate,
    choose_machine,
    job_spares,
    parse_selector,
    pools_by_shape,
    pools_from_nodes,
    provisions,
    requests_for,
    resolve_claim,
    spares_of,
    vanished_pools,
    with_default,
)
from tpu_operator.placement.provisioning import (
    SLICE_POOL_LABEL,
    claim_of,
    claim_ref,
    claim_value,
)
from tpu_operator.reconcile.pools import slice_pool_values
from tpu_operator.runtime.metrics import OperatorMetrics
from tpu_operator.state.views import NodeView, node_view, pod_view

pytestmark = pytest.mark.unit

V6E_8_4 = catalog.from_short_type("v6e-8", 4)  # two 4-chip VMs
V6E_8_8 = catalog.from_short_type("v6e-8")  # one 8-chip VM
V5P_16 = catalog.from_short_type("v5p-16")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def node(name: str, pool: str, chips: int, machine: str | None = None, **extra) -> NodeView:
    fields = {
        "name": name,
        "pool": pool,
        "accelerator": "tpu-v6e-slice",
        "topology": "2x4",
        "ready": True,
        "unschedulable": False,
        "spot": False,
        "reservation": None,
        "tpu_chips": chips,
        "machine_type": machine,
    }
    return NodeView(**{**fields, **extra})


def v6e(name: str, vms: int, chips: int, **extra) -> PoolView:
    return PoolView(name, "tpu-v6e-slice", "2x4", nodes=vms, ready=vms, chips_per_vm=chips, **extra)


def test_chips_per_vm_come_from_the_machine_type_before_the_device_plugin():
    pools = pools_from_nodes(
        [
            node("a", "p8", 0, "ct6e-standard-8t"),  # device plugin not registered yet
            node("b", "p4", 4),
            node("c", "p4", 4, slice_pool="claim-1"),
        ]
    )
    assert (pools["p8"].chips_per_vm, pools["p8"].machine_type) == (8, "ct6e-standard-8t")
    assert (pools["p4"].chips_per_vm, pools["p4"].nodes, pools["p4"].slice_pool) == (
        4,
        2,
        "claim-1",
    )


def test_a_pool_whose_vms_cannot_take_the_pods_is_never_chosen():
    pools = {"p8": v6e("p8", 2, 8, machine_type="ct6e-standard-8t"), "p4": v6e("p4", 2, 4)}
    assert allocate([Request(V6E_8_4)], pools, {}).pools == ["p4"]
    waiting = allocate([Request(V6E_8_4)], pools, {"p4": "TPUJob ml/a"})
    assert waiting.pools is None
    assert "p8 has 8-chip VMs (ct6e-standard-8t); the slice needs 4-chip VMs" in waiting.message
    assert "placement.provisioning: Auto" in waiting.message


def test_a_pool_without_chips_information_still_matches():
    pools = {"old": PoolView("old", "tpu-v5p-slice", "2x2x2", nodes=2, ready=2)}
    assert allocate([Request(V5P_16)], pools, {}).pools == ["old"]


def test_pinned_pools_are_refused_only_when_their_nodes_show_another_machine():
    pools = {"p8": v6e("p8", 2, 8), "empty": v6e("empty", 0, 8)}
    refused = allocate([Request(V6E_8_4, pinned="p8")], pools, {})
    assert refused.pools is None
    assert "pinned node pool p8 cannot run it: its VMs are 8-chip VMs" in refused.message
    assert allocate([Request(V6E_8_4, pinned="empty")], pools, {}).pools == ["empty"]
    assert allocate([Request(V6E_8_4, pinned="unknown")], pools, {}).pools == ["unknown"]


def test_provisioning_gives_claims_only_to_slices_without_a_free_pool():
    pools = {"a": PoolView("a", "tpu-v5p-slice", "2x2x2", nodes=2, ready=2)}
    requests = [Request(V5P_16, provision=True, claim=f"c{i}") for i in range(3)]
    result = allocate(requests, pools, {})
    assert result.pools == ["a", "auto:c1", "auto:c2"]
    assert result.provisioning == [1, 2]
    # without provisioning the job waits, all or nothing
    assert allocate([Request(V5P_16)] * 3, pools, {}).pools is None


def test_a_claim_resolves_to_the_complete_pool_carrying_its_label():
    shape = V5P_16
    partial = {"nap": PoolView("nap", "tpu-v5p-slice", "2x2x2", nodes=1, slice_pool="c0")}
    assert resolve_claim("c0", shape, partial) == (None, "node pool nap has 1 of its 2 VMs")
    assert resolve_claim("c0", shape, {}) == (None, "GKE has not created its node pool yet")
    done = {
        "other": PoolView("other", "tpu-v5p-slice", "2x2x2", nodes=2, slice_pool="c9"),
        "nap": PoolView("nap", "tpu-v5p-slice", "2x2x2", nodes=2, slice_pool="c0"),
    }
    assert resolve_claim("c0", shape, done) == ("nap", "")
    wrong = {"nap": v6e("nap", 2, 8, slice_pool="c0")}
    name, why = resolve_claim("c0", V6E_8_4, wrong)
    assert name is None and "8-chip VMs" in why


def test_claim_values_are_unique_valid_labels_and_never_pool_names():
    first = claim_value("a" * 63, "uid-1", 1023)
    assert LABEL_VALUE.match(first) and len(first) <= 63
    assert len(claim_ref(first)) <= 63  # fits TPUSlice spec.nodePool
    assert claim_value("job", "uid-1", 0) != claim_value("job", "uid-1", 1)
    assert claim_value("job", "uid-1", 0) != claim_value("job", "uid-2", 0)
    assert claim_of(claim_ref("x-0-abc")) == "x-0-abc"
    assert claim_of("nap-ct6e-standard-4t-1a2b") is None and claim_of(None) is None


@pytest.mark.parametrize(
    ("present", "free", "held", "provision", "expected"),
    [
        ({}, {}, {}, True, 8),  # neither, GKE may create one: the default
        ({"p4": 4}, {}, {}, False, 4),  # only 4-chip VMs
        ({"p4": 4}, {}, {}, True, 4),  # ... even where GKE could create the default
        ({"p8": 8}, {}, {}, False, 8),
        ({"p8": 8, "p4": 4}, {"p8": 1}, {}, False, 8),  # both free: the default
        ({"p8": 8, "p4": 4}, {}, {}, False, 4),  # the 8-chip VM is busy, the 4-chip pool free
        ({"p8": 8, "p4": 4}, {}, {"p4": "x"}, False, 8),  # none free: the default
    ],
)
def test_the_machine_type_of_a_shape_that_fits_two(present, free, held, provision, expected):
    pools = {n: v6e(n, 2 if c == 4 else 1, c) for n, c in present.items()}
    choice = choose_machine([V6E_8_8, V6E_8_4], pools, held, free, provision=provision)
    assert choice.shape.chips_per_host == expected
    assert choice.note and not choice.waiting


def test_with_neither_machine_type_a_job_that_may_not_provision_waits_naming_both():
    choice = choose_machine([V6E_8_8, V6E_8_4], {}, {}, {})
    assert not choice.note
    assert choice.waiting == (
        "waiting for a tpu-v6e-slice 2x4 node pool of either machine type, "
        "ct6e-standard-8t (1 VM of 8 chips) or ct6e-standard-4t (2 VMs of 4 chips): the "
        "cluster has neither (slice.chipsPerHost picks one; placement.provisioning: Auto "
        "lets GKE create the default, ct6e-standard-8t)"
    )
    # pools of the other kind, or of the right shape but not spot, do not count
    pools = {"p4": v6e("p4", 2, 4, spot=False)}
    spot = choose_machine([V6E_8_8, V6E_8_4], pools, {}, {}, spot=True)
    assert spot.waiting.startswith("waiting for a tpu-v6e-slice 2x4 spot node pool")
    asked = choose_machine([V6E_8_8, V6E_8_4], pools, {}, {}, spot=True, provision=True)
    assert not asked.waiting and asked.shape.chips_per_host == 8
    assert asked.note.endswith(
        "the cluster has no tpu-v6e-slice 2x4 spot pool of either machine type, "
        "ct6e-standard-8t (1 VM of 8 chips) or ct6e-standard-4t (2 VMs of 4 chips); its "
        "pods ask GKE for ct6e-standard-8t, the default"
    )


def test_v5e_2x4_names_its_own_machine_types():
    options = [catalog.from_short_type("v5litepod-8", c) for c in (8, 4)]
    assert [o.machine_type for o in options] == ["ct5lp-hightpu-8t", "ct5lp-hightpu-4t"]
    assert "ct5lp-hightpu-8t (1 VM of 8 chips) or ct5lp-hightpu-4t" in (
        choose_machine(options, {}, {}, {}).waiting
    )


def test_the_machine_type_honours_spot_and_reservation():
    pools = {"p8": v6e("p8", 1, 8, spot=True), "p4": v6e("p4", 2, 4)}
    choice = choose_machine([V6E_8_8, V6E_8_4], pools, {}, {"p8": 1}, spot=False)
    assert choice.shape.chips_per_host == 4
    assert "pools have 4-chip VMs" in choice.note


def wiring(shape: catalog.SliceShape) -> PodWiring:
    return PodWiring(
        job_name="j",
        service="j",
        slice_name="j-0",
        shape=shape,
        num_slices=1,
        slice_index=0,
        worker_index=0,
        attempt=1,
    )


def build(placement: NodePlacement) -> dict:
    template = {"spec": {"containers": [{"name": "worker", "image": "w"}]}}
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, "j-0", "u")
    return worker_pod(
        namespace="ml", wiring=wiring(V5P_16), template=template, owner=owner, placement=placement
    )


def test_pods_of_a_claim_select_its_label_and_tolerate_its_taint():
    pod = build(NodePlacement(slice_pool="j-0-abc"))
    selector = pod["spec"]["nodeSelector"]
    assert selector[SLICE_POOL_LABEL] == "j-0-abc"
    assert contract.NODE_LABEL_NODEPOOL not in selector
    toleration = {
        "key": SLICE_POOL_LABEL,
        "operator": "Equal",
        "value": "j-0-abc",
        "effect": "NoSchedule",
    }
    assert toleration in pod["spec"]["tolerations"]
    view = pod_view({**pod, "status": {}})
    assert view is not None and view.pool == "auto:j-0-abc"
    # once the pool exists the pods are pinned to it by name and still tolerate its taint
    named = build(NodePlacement(node_pool="nap-1", slice_pool="j-0-abc"))
    assert named["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] == "nap-1"
    assert SLICE_POOL_LABEL not in named["spec"]["nodeSelector"]
    assert toleration in named["spec"]["tolerations"]
    assert pod_view({**named, "status": {}}).pool == "nap-1"  # type: ignore[union-attr]
    plain = build(NodePlacement(node_pool="p"))
    assert not any(t.get("key") == SLICE_POOL_LABEL for t in plain["spec"]["tolerations"])


def test_node_view_reads_machine_type_and_slice_pool():
    view = node_view(
        {
            "metadata": {
                "name": "n",
                "labels": {
                    contract.NODE_LABEL_NODEPOOL: "nap-1",
                    contract.NODE_LABEL_ACCELERATOR: "tpu-v6e-slice",
                    "node.kubernetes.io/instance-type": "ct6e-standard-4t",
                    SLICE_POOL_LABEL: "j-0-abc",
                },
            },
            "status": {"allocatable": {contract.TPU_RESOURCE: "4"}},
        }
    )
    assert (view.machine_type, view.slice_pool, view.tpu_chips) == (
        "ct6e-standard-4t",
        "j-0-abc",
        4,
    )


def test_pools_without_nodes_what_each_slice_does():
    pools = {"live": v6e("live", 2, 4)}
    refs = ["live", "auto:j-1-abc", "gone-a", "gone-b", "pinned"]
    pins = ["x", "y", "z", "w", "pinned"]

    def decide(provision, created=(), pinned=pins):
        gone = vanished_pools(refs, pools, pinned=pinned, provision=provision, created=created)
        return {g.pool: g.reclaim for g in gone}, {g.pool: g.message for g in gone}

    # pools with nodes and claims are left alone; a pinned pool is never given up
    reclaim, messages = decide(True)
    assert reclaim == {"gone-a": True, "gone-b": True, "pinned": False}
    assert messages["pinned"] == (
        "slice 4: pinned node pool pinned has no nodes; waiting for the cluster autoscaler to "
        "add them (if the pool was deleted, re-create it or pin another pool in "
        "placement.nodePools)"
    )
    assert messages["gone-a"] == (
        "slice 2: node pool gone-a has no nodes; GKE deleted it or scaled it to zero; its pods "
        "ask GKE for a new pool"
    )
    # pods of the attempt already pinned to it by name: only the next attempt moves
    reclaim, messages = decide(True, created={2})
    assert reclaim == {"gone-a": False, "gone-b": True, "pinned": False}
    assert messages["gone-a"].endswith("the slice's next attempt asks GKE for a new pool")
    # without provisioning nothing is given up, and the message says what would help
    reclaim, messages = decide(False, pinned=None)
    assert reclaim == {"gone-a": False, "gone-b": False, "pinned": False}
    assert "placement.provisioning: Auto lets GKE create a new one" in messages["pinned"]


def test_the_operator_default_decides_only_what_the_request_leaves_open():
    assert provisions(None, "Auto") and provisions("Auto", "ExistingPools")
    assert not provisions(None, "ExistingPools") and not provisions("ExistingPools", "Auto")
    open_, yes, no = (Request(V5P_16, provision=p, claim="c") for p in (None, True, False))
    assert [r.provision for r in with_default([open_, yes, no], "Auto")] == [True, True, False]
    assert [r.provision for r in with_default([open_, yes, no], "ExistingPools")] == [
        False,
        True,
        False,
    ]
    # an unsaid request that gets a claim, through allocate, only under the Auto default
    assert allocate(with_default([open_], "Auto"), {}, {}).pools == ["auto:c"]
    assert allocate(with_default([open_], "ExistingPools"), {}, {}).pools is None


def test_renewed_claim_values_differ_per_attempt_and_stay_labels():
    meta = {"name": "x" * 60, "uid": "u-1", "generation": 3}
    first = slice_pool_values(meta, 2)
    renewed = [slice_pool_values(meta, 2, renewal=a) for a in (2, 3)]
    assert len({*first, *renewed[0], *renewed[1]}) == 6
    for value in [*first, *renewed[0], *renewed[1]]:
        assert len(value) <= 63 and LABEL_VALUE.match(value)


def test_requests_leave_provisioning_open_unless_the_job_says():
    def provision(placement, claims=("c",)):
        return requests_for(V5P_16, placement, 1, list(claims) if claims else None)[0].provision

    assert provision(None) is None and provision(Placement()) is None
    assert provision(Placement(provisioning="Auto")) is True
    assert provision(Placement(provisioning="ExistingPools")) is False
    assert provision(Placement(provisioning="Auto"), claims=None) is False


def test_an_unhealthy_pool_is_given_to_no_slice():
    pools = {
        "broken": PoolView("broken", "tpu-v5p-slice", "2x2x2", nodes=2, ready=1),
        "spare": PoolView("spare", "tpu-v5p-slice", "2x2x2", nodes=3, ready=3),
    }
    assert allocate([Request(V5P_16)], pools, {}).pools == ["spare"]
    waiting = allocate([Request(V5P_16)], pools, {"spare": "TPUJob ml/a"})
    assert waiting.pools is None
    assert "broken has 1 of its 2 VMs not ready or cordoned" in waiting.message


def test_pinned_pools_are_placed_before_free_choices():
    pools = {n: PoolView(n, "tpu-v5p-slice", "2x2x2", nodes=2, ready=2) for n in ("a", "b")}
    # Slice 0 chooses freely, slice 1 pins "a": slice 0 must not take it first.
    assert allocate([Request(V5P_16), Request(V5P_16, pinned="a")], pools, {}).pools == [
        "b",
        "a",
    ]


def test_unhealthy_pools_are_a_metric_of_the_acting_replica():
    metrics = OperatorMetrics()
    pools = [
        PoolView("broken", "tpu-v5p-slice", "2x2x2", nodes=4, ready=1),
        PoolView("fine", "tpu-v5p-slice", "2x2x2", nodes=2, ready=2),
    ]
    metrics.watch_pools(lambda: pools)
    leading = [False]
    metrics.watch_leadership(lambda: leading[0])
    assert "tpu_operator_node_pool_unready_vms{" not in generate_latest(metrics.registry).decode()
    leading[0] = True
    served = generate_latest(metrics.registry).decode()
    assert 'tpu_operator_node_pool_unready_vms{node_pool="broken"} 3.0' in served
    assert 'node_pool="fine"' not in served


def v5p(name: str, vms: int = 2, ready: int | None = None, **labels: str) -> PoolView:
    return PoolView(
        name,
        "tpu-v5p-slice",
        "2x2x2",
        nodes=vms,
        ready=vms if ready is None else ready,
        labels=labels,
    )


BY_NAME = spares_of(["a-spare"])
BY_LABEL = spares_of(match_labels={"role": "spare"})


@pytest.mark.parametrize(
    ("pools", "held", "request_", "chosen", "spare", "words"),
    [
        # A first placement never takes a spare, named or selected by label ...
        ([v5p("a-spare"), v5p("b")], {}, Request(V5P_16, spares=BY_NAME), "b", [], ""),
        ([v5p("a", role="spare"), v5p("b")], {}, Request(V5P_16, spares=BY_LABEL), "b", [], ""),
        # ... and waits rather than take one, saying why.
        (
            [v5p("a-spare"), v5p("b")],
            {"b": "TPUJob ml/x"},
            Request(V5P_16, spares=BY_NAME),
            None,
            [],
            "a-spare is a spare pool (kept to replace a slice on a broken pool)",
        ),
        # A pool labelled otherwise is no spare.
        ([v5p("a", role="main")], {}, Request(V5P_16, spares=BY_LABEL), "a", [], ""),
        # A slice moving off a broken pool takes a spare first, though another pool is free
        # and would come first by size and name.
        (
            [v5p("a"), v5p("z-spare")],
            {},
            Request(V5P_16, spares=spares_of(["z-spare"]), replacing=True, leaves="broken"),
            "z-spare",
            [0],
            "",
        ),
        # With its spare held or unhealthy, it takes any other free pool.
        (
            [v5p("a"), v5p("z-spare")],
            {"z-spare": "TPUJob ml/x"},
            Request(V5P_16, spares=spares_of(["z-spare"]), replacing=True),
            "a",
            [],
            "",
        ),
        (
            [v5p("a"), v5p("z-spare", ready=1)],
            {},
            Request(V5P_16, spares=spares_of(["z-spare"]), replacing=True),
            "a",
            [],
            "",
        ),
        # Another job's spare is taken by no one else, not even to replace a slice ...
        (
            [v5p("a-spare")],
            {},
            Request(V5P_16, others=spares_of(["a-spare"]), replacing=True),
            None,
            [],
            "a-spare is a spare another TPUJob holds in reserve",
        ),
        # ... unless this job's own spares (or the operator's) name it too.
        (
            [v5p("a-spare")],
            {},
            Request(V5P_16, spares=BY_NAME, others=spares_of(["a-spare"]), replacing=True),
            "a-spare",
            [0],
            "",
        ),
        # The pool it leaves is never a choice, spare or not.
        (
            [v5p("a-spare")],
            {},
            Request(V5P_16, spares=BY_NAME, replacing=True, leaves="a-spare"),
            None,
            [],
            "a-spare is the pool the slice moves off",
        ),
    ],
)
def test_spare_pools_are_kept_for_replacing_a_slice_on_a_broken_pool(
    pools, held, request_, chosen, spare, words
):
    allocation = allocate([request_], {p.name: p for p in pools}, held)
    assert allocation.pools == (None if chosen is None else [chosen])
    assert allocation.spares == spare
    assert words in allocation.message


@pytest.mark.parametrize(
    ("pools", "held", "request_", "chosen"),
    [
        # The smallest free pool of the slice's shape, then the first by name ...
        ([v5p("c", vms=3), v5p("b", vms=3), v5p("d")], {}, Request(V5P_16), "d"),
        ([v5p("c", vms=3), v5p("b", vms=3)], {}, Request(V5P_16), "b"),
        ([v5p("c"), v5p("b"), v5p("a")], {"a": "TPUJob ml/x"}, Request(V5P_16), "b"),
        # ... never one of another shape, however free and small.
        ([v6e("a", 2, 4), v5p("z", vms=3)], {}, Request(V5P_16), "z"),
        ([v6e("a", 2, 4)], {}, Request(V5P_16), None),
        ([v6e("a", 2, 4), v5p("z")], {}, Request(V6E_8_4), "a"),
        # Capacity that comes as new VMs takes no pool that exists.
        ([v5p("a")], {}, Request(V5P_16, fresh=True), None),
        # Replacing a slice: a spare first, then the smallest, then by name.
        (
            [v5p("a"), v5p("c-spare", vms=3), v5p("b-spare", vms=3)],
            {},
            Request(V5P_16, spares=spares_of(["b-spare", "c-spare"]), replacing=True),
            "b-spare",
        ),
    ],
)
def test_a_free_choice_takes_the_smallest_pool_of_the_slices_shape(pools, held, request_, chosen):
    """The same choice whether ``allocate`` groups the pools by shape itself or is given
    the grouping the operator keeps per node change (``pools_by_shape``)."""
    by_name = {p.name: p for p in pools}
    for index in (None, pools_by_shape(by_name)):
        allocation = allocate([request_], by_name, held, index)
        assert allocation.pools == (None if chosen is None else [chosen])


def test_a_pool_carries_the_labels_all_its_nodes_share():
    pools = pools_from_nodes(
        [
            node("a", "p", 4, labels={"role": "spare", "kubernetes.io/hostname": "a"}),
            node("b", "p", 4, labels={"role": "spare", "kubernetes.io/hostname": "b"}),
            node("c", "q", 4, labels={"role": "spare"}),
            node("d", "q", 4, labels={"role": "main"}),
        ]
    )
    assert pools["p"].labels == {"role": "spare"}
    assert pools["q"].labels == {}
    assert BY_LABEL.holds(pools["p"]) and not BY_LABEL.holds(pools["q"])


def test_node_labels_reach_the_node_view():
    view = node_view(
        {
            "metadata": {
                "name": "n",
                "labels": {"role": "spare", contract.NODE_LABEL_NODEPOOL: "p"},
            },
            "status": {},
        }
    )
    assert view.labels["role"] == "spare" and view.pool == "p"


def test_a_job_names_its_spares_by_pool_and_by_label():
    placement = JobPlacement.model_validate(
        {"spares": {"nodePools": ["s1"], "selector": {"matchLabels": {"role": "spare"}}}}
    )
    spares = job_spares(placement)
    assert spares.holds(v5p("s1")) and spares.holds(v5p("x", role="spare"))
    assert not spares.holds(v5p("x", role="main"))
    assert not job_spares(None) and not job_spares(JobPlacement())
    assert (spares | spares_of(["s2"])).holds(v5p("s2"))


@pytest.mark.parametrize(
    ("text", "labels", "error"),
    [
        ("role=spare", {"role": "spare"}, None),
        (" example.com/role=spare , tier=b ", {"example.com/role": "spare", "tier": "b"}, None),
        ("", {}, None),
        ("role", None, "'role' is not key=value"),
        ("=spare", None, "is not key=value"),
        ("Bad Key=x", None, "'Bad Key' is not a label key"),
        ("role=no spaces", None, "'no spaces' (label role) is not a label value"),
        ("role=a,role=b", None, "label role is given twice"),
    ],
)
def test_the_operator_spare_selector_is_parsed_with_clear_errors(text, labels, error):
    if error is None:
        assert parse_selector(text) == labels
        return
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_selector(text)


@pytest.mark.parametrize(
    ("value", "when"),
    [
        ("2026-11-27T10:00:00Z", 1795773600.0),
        ("2026-11-27T11:00:00+01:00", 1795773600.0),
        ("2026-11-27T10:00:00", 1795773600.0),  # no zone: UTC, as GKE writes it
        ("next tuesday", None),  # not a time: no end is assumed
        ("", None),
        (None, None),
    ],
)
def test_a_flex_start_vm_says_when_it_is_taken_back(value, when):
    annotations = {} if value is None else {contract.NODE_ANNOTATION_TERMINATION: value}
    view = node_view(
        {
            "metadata": {
                "name": "n",
                "labels": {contract.NODE_LABEL_NODEPOOL: "flex-1"},
                "annotations": annotations,
            },
        }
    )
    assert view.terminates_at == when


def test_a_pool_ends_when_its_first_vm_is_taken_back():
    def node(name: str, pool: str, ends: float | None) -> NodeView:
        return NodeView(
            name, pool, "tpu-v6e-slice", "4x4", True, False, False, None, 4, terminates_at=ends
        )

    pools = pools_from_nodes([node("a", "p", 30.0), node("b", "p", 20.0), node("c", "q", None)])
    ends = {name: pool.ends for name, pool in pools.items() if pool.ends is not None}
    assert ends == {"p": 20.0}
