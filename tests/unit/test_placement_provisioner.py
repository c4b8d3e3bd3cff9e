"""The simulated GKE node auto-provisioner's decisions (pure parts of
localcluster/agent/provisioner.py): which pods trigger, which pool NAP would create."""

from __future__ import annotations

from typing import Any

import pytest

from localcluster.agent.provisioner import (
    Autoprovisioning,
    fits,
    nap_pool,
    node_shape,
    pending_tpu_pod,
    plan_nap,
    tolerates,
)
from localcluster.pools import Pool

pytestmark = pytest.mark.unit

CONFIG = Autoprovisioning(mode="simulate")
SEPARATION = "tpu-operator.dev/slice-pool"


def tpu_pod(
    name: str,
    chips: int,
    selector: dict[str, str],
    tolerations: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [
                {"key": "google.com/tpu", "operator": "Equal", "value": "present"},
                *(tolerations or []),
            ],
            "containers": [{"name": "w", "resources": {"limits": {"google.com/tpu": chips}}}],
            **spec,
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def v6e(topology: str, **extra: str) -> dict[str, str]:
    return {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": topology,
        **extra,
    }


def separated(name: str, claim: str, chips: int = 4, topology: str = "4x4") -> dict[str, Any]:
    toleration = {"key": SEPARATION, "operator": "Equal", "value": claim, "effect": "NoSchedule"}
    return tpu_pod(name, chips, v6e(topology, **{SEPARATION: claim}), [toleration])


def test_only_unschedulable_tpu_pods_trigger():
    pod = tpu_pod("a", 4, v6e("4x4"))
    assert pending_tpu_pod(pod)
    assert not pending_tpu_pod({**pod, "status": {"phase": "Pending"}})  # not tried yet
    assert not pending_tpu_pod(tpu_pod("b", 0, v6e("4x4")))
    assert not pending_tpu_pod(tpu_pod("c", 4, {}))


def test_a_multi_host_pod_gets_a_whole_slice_pool_with_the_machine_type_of_its_chips():
    pool = nap_pool(tpu_pod("a", 4, v6e("4x4")), CONFIG)
    assert isinstance(pool, Pool)
    assert (pool.vms, pool.chips_per_vm, pool.gke_machine_type) == (4, 4, "ct6e-standard-4t")
    assert pool.auto_provisioned and pool.mode == "simulate"
    single = nap_pool(tpu_pod("b", 8, v6e("2x4")), CONFIG)
    assert isinstance(single, Pool)
    assert (single.vms, single.gke_machine_type, single.multi_host) == (
        1,
        "ct6e-standard-8t",
        False,
    )
    two = nap_pool(tpu_pod("c", 4, v6e("2x4")), CONFIG)
    assert isinstance(two, Pool) and (two.vms, two.multi_host) == (2, True)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (tpu_pod("a", 2, v6e("4x4")), "no tpu-v6e-slice machine type has 2 chips"),
        (tpu_pod("b", 4, v6e("4x4", team="ml")), "without tolerating a taint of that key"),
        (tpu_pod("c", 4, v6e("4x4", **{"cloud.google.com/gke-nodepool": "p"})), "node pool p"),
        (
            tpu_pod("d", 4, v6e("4x4", **{"cloud.google.com/gke-placement-group": "x"})),
            "does not create node pools for label",
        ),
        (tpu_pod("e", 4, {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}), "without"),
    ],
)
def test_pods_nap_cannot_serve_say_why(pod, why):
    result = nap_pool(pod, CONFIG)
    assert isinstance(result, str) and why in result


def test_workload_separation_labels_and_taints_the_pool():
    pool = nap_pool(separated("a", "j-0-abc"), CONFIG)
    assert isinstance(pool, Pool)
    labels, taints, _ = node_shape(pool)
    assert labels[SEPARATION] == "j-0-abc"
    assert {"key": SEPARATION, "value": "j-0-abc", "effect": "NoSchedule"} in taints
    assert fits(separated("b", "j-0-abc"), labels, taints, 4)
    assert not fits(separated("c", "k-0-def"), labels, taints, 4)  # another slice's pod
    plain = tpu_pod("d", 4, v6e("4x4"))
    assert not fits(plain, labels, taints, 4)  # does not tolerate the taint


def test_spot_and_reservation_come_from_the_selectors():
    pool = nap_pool(
        tpu_pod(
            "a",
            4,
            v6e(
                "4x4",
                **{
                    "cloud.google.com/gke-spot": "true",
                    "cloud.google.com/reservation-name": "r1",
                },
            ),
        ),
        CONFIG,
    )
    assert isinstance(pool, Pool) and (pool.spot, pool.reservation) == (True, "r1")
    on_demand = tpu_pod(
        "b",
        4,
        v6e("4x4"),
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "cloud.google.com/gke-spot",
                                    "operator": "NotIn",
                                    "values": ["true"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
    )
    made = nap_pool(on_demand, CONFIG)
    assert isinstance(made, Pool) and made.spot is False


def test_pods_of_one_slice_share_a_pool_and_slices_get_one_each():
    pods = [separated(f"s{s}-{w}", f"claim-{s}") for s in range(2) for w in range(4)]
    plans, refused = plan_nap(pods, CONFIG)
    assert not refused
    assert len(plans) == 2
    for pool, uids in plans:
        assert pool.vms == 4 and len(uids) == 4
        assert pool.name.startswith("nap-ct6e-standard-4t-")
        assert len({u.split("-")[1] for u in uids}) == 1  # one slice's pods per pool
    # without a label of their own, 8 identical pods make two pools any pod may land in
    same = [tpu_pod(f"p{i}", 4, v6e("4x4")) for i in range(8)]
    plans, _ = plan_nap(same, CONFIG)
    assert [len(uids) for _, uids in plans] == [4, 4]
    singles, _ = plan_nap([tpu_pod(f"x{i}", 8, v6e("2x4")) for i in range(3)], CONFIG)
    assert [(p.vms, len(u)) for p, u in singles] == [(3, 3)]


def test_toleration_matching():
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates([{"operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "value": "v"}], taint)
    assert not tolerates([{"key": "k", "value": "w"}], taint)
    assert not tolerates([{"key": "k", "operator": "Exists", "effect": "NoExecute"}], taint)


FLEX = "cloud.google.com/gke-flex-start"
QUEUED = "cloud.google.com/gke-queued"
MAX_RUN = "cloud.google.com/gke-max-run-duration-seconds"


def test_a_flex_start_pod_gets_flex_start_vms_of_its_run_duration():
    pod = tpu_pod("f", 4, v6e("4x4", **{FLEX: "true", MAX_RUN: "3600"}))
    pool = nap_pool(pod, CONFIG)
    assert isinstance(pool, Pool), pool
    labels, taints, _ = node_shape(pool)
    assert labels[FLEX] == "true" and labels[MAX_RUN] == "3600"
    assert pool.max_run_seconds == 3600
    assert [t["key"] for t in taints] == ["google.com/tpu"]
    # Without a run duration, GKE's seven days.
    default = nap_pool(tpu_pod("g", 4, v6e("4x4", **{FLEX: "true"})), CONFIG)
    assert isinstance(default, Pool) and default.max_run_seconds == 7 * 24 * 3600
    ordinary = nap_pool(tpu_pod("h", 4, v6e("4x4")), CONFIG)
    assert isinstance(ordinary, Pool) and ordinary.max_run_seconds is None


def test_queued_nodes_come_only_from_a_provisioning_request():
    queued = {"key": QUEUED, "operator": "Exists", "effect": "NoSchedule"}
    pod = tpu_pod("q", 4, v6e("4x4", **{QUEUED: "true"}), [queued])
    refused = nap_pool(pod, CONFIG)
    assert isinstance(refused, str) and "ProvisioningRequests only" in refused
    pool = nap_pool(pod, CONFIG, queued=True, max_run_seconds=600)
    assert isinstance(pool, Pool), pool
    labels, taints, _ = node_shape(pool)
    assert labels[QUEUED] == "true" and labels[FLEX] == "true"
    assert {"key": QUEUED, "value": "true", "effect": "NoSchedule"} in taints
    assert pool.max_run_seconds == 600
    assert fits(pod, labels, taints, 4)
