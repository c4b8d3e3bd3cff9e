"""The Kueue Workload of a TPUJob and the queue state read from it (builders/workload.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tpu_operator import contract
from tpu_operator.api.job import JobSliceSpec
from tpu_operator.builders.workload import (
    Assignment,
    Priority,
    admission_assignment,
    apply_assignment,
    build_workload,
    clear_admission,
    flavor_names,
    node_pools_of,
    queue_state,
    reclaimable_pods,
    reclaimable_status,
    reported_reclaimable,
    slice_node_selector,
    with_condition,
    workload_name,
    workload_outdated,
)

pytestmark = pytest.mark.unit

TEMPLATE = {
    "metadata": {"labels": {"team": "a"}},
    "spec": {
        "containers": [
            {"name": "worker", "image": "w", "resources": {"requests": {"cpu": "1"}}},
            {"name": "sidecar", "image": "s"},
        ]
    },
}


def job(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "u-1",
            "labels": {contract.LABEL_KUEUE_QUEUE: "tpu", **(labels or {})},
        }
    }


def shape(type_: str) -> Any:
    return JobSliceSpec.model_validate({"type": type_}).resolve()


def test_one_pod_set_covers_every_worker_of_every_slice_with_its_chips():
    wl = build_workload(job(), TEMPLATE, shape("v5p-16"), 3)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["spec"]["queueName"] == "tpu"
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 6  # 3 slices x 2 hosts
    worker, sidecar = pod_set["template"]["spec"]["containers"]
    assert worker["resources"]["requests"] == {"cpu": "1", "google.com/tpu": "4"}
    assert worker["resources"]["limits"] == {"google.com/tpu": "4"}
    assert "resources" not in sidecar
    assert pod_set["template"]["spec"]["nodeSelector"] == {
        contract.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice",
        contract.NODE_LABEL_TOPOLOGY: "2x2x2",
    }
    # Each slice of 2 hosts inside one node pool.
    assert pod_set["topologyRequest"] == {
        "podSetSliceRequiredTopology": contract.NODE_LABEL_NODEPOOL,
        "podSetSliceSize": 2,
    }
    (owner,) = wl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TPUJob", "train", True)
    assert TEMPLATE["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}}


def test_single_host_slices_and_no_topology_have_no_topology_request():
    assert (
        "topologyRequest"
        not in build_workload(job(), TEMPLATE, shape("v5litepod-4"), 2)["spec"]["podSets"][0]
    )
    assert (
        "topologyRequest"
        not in build_workload(job(), TEMPLATE, shape("v5p-16"), 1, topology=False)["spec"][
            "podSets"
        ][0]
    )


def test_priority_class_and_value():
    wl = build_workload(job(), TEMPLATE, shape("v5litepod-4"), 1, priority=Priority("high", 100))
    assert wl["spec"]["priorityClassRef"]["name"] == "high"
    assert wl["spec"]["priority"] == 100


def test_name_is_short_and_stable():
    assert workload_name("train", "u-1") == workload_name("train", "u-1")
    assert workload_name("train", "u-1") != workload_name("train", "u-2")
    assert len(workload_name("x" * 63, "u")) <= 63


def test_a_changed_template_or_count_makes_the_workload_outdated():
    wl = build_workload(job(), TEMPLATE, shape("v5p-16"), 1)
    assert not workload_outdated(wl, build_workload(job(), TEMPLATE, shape("v5p-16"), 1))
    assert workload_outdated(wl, build_workload(job(), TEMPLATE, shape("v5p-16"), 2))
    other = {**TEMPLATE, "spec": {"containers": [{"name": "worker", "image": "w"}]}}
    assert workload_outdated(wl, build_workload(job(), other, shape("v5p-16"), 1))
    moved = build_workload(job({contract.LABEL_KUEUE_QUEUE: "other"}), TEMPLATE, shape("v5p-16"), 1)
    assert workload_outdated(wl, moved)


def cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason or type_, "message": message}


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {
            "name": "workers",
            "flavors": {"google.com/tpu": "v5p"},
            "count": 4,
            "topologyAssignment": {
                "levels": [contract.NODE_LABEL_NODEPOOL],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"individual": {"prefix": "v5p-", "roots": ["a", "b"]}}],
                        "podCounts": {"universal": 2},
                    }
                ],
            },
        }
    ],
}


def test_queue_states():
    assert queue_state(None).state == "Missing"
    pending = {
        "spec": {},
        "status": {"conditions": [cond("QuotaReserved", "False", "Pending", "insufficient quota")]},
    }
    state = queue_state(pending)
    assert (state.state, state.reason, state.message) == ("Queued", "Pending", "insufficient quota")
    admitted = {
        "status": {
            "admission": ADMISSION,
            "conditions": [cond("QuotaReserved"), cond("Admitted")],
        }
    }
    state = queue_state(admitted, hosts=2, slices=2)
    assert state.admitted and state.assignment is not None
    assert state.assignment.cluster_queue == "cq"
    assert state.assignment.flavors == {"google.com/tpu": "v5p"}
    assert state.assignment.node_pools == ["v5p-a", "v5p-b"]
    reserved = {"status": {"admission": ADMISSION, "conditions": [cond("QuotaReserved")]}}
    assert queue_state(reserved).state == "Reserved"
    evicted = {
        "status": {
            "admission": ADMISSION,
            "conditions": [
                cond("QuotaReserved"),
                cond("Admitted"),
                cond("Evicted", reason="Preempted", message="by a higher priority"),
            ],
        }
    }
    state = queue_state(evicted)
    assert (state.state, state.reason, state.admission_held) == ("Evicted", "Preempted", True)
    finished = {"status": {"conditions": [cond("Finished", reason="Succeeded")]}}
    assert queue_state(finished).state == "Finished"


def test_admission_check_updates_go_into_the_pod_template():
    assignment = Assignment(
        labels={"l": "1"},
        annotations={"a": "2"},
        node_selector={"zone": "z"},
        tolerations=[{"key": "k", "operator": "Exists"}],
    )
    result = apply_assignment(TEMPLATE, assignment)
    assert result["metadata"]["labels"] == {"team": "a", "l": "1"}
    assert result["metadata"]["annotations"] == {"a": "2"}
    assert result["spec"]["nodeSelector"] == {"zone": "z"}
    assert result["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert apply_assignment(TEMPLATE, Assignment()) is TEMPLATE


def test_topology_assignment_that_does_not_split_into_slices_gives_no_pools():
    ragged = {
        "topologyAssignment": {
            "levels": [contract.NODE_LABEL_NODEPOOL],
            "slices": [
                {
                    "domainCount": 2,
                    "valuesPerLevel": [{"individual": {"roots": ["a", "b"]}}],
                    "podCounts": {"individual": [3, 1]},
                }
            ],
        }
    }
    assert node_pools_of(ragged, hosts=2, slices=2) == []
    assert node_pools_of({}, hosts=2, slices=2) == []


def test_clearing_the_admission_of_a_preempted_workload_requeues_it():
    wl = {
        "metadata": {"generation": 1},
        "status": {
            "admission": ADMISSION,
            "conditions": [
                cond("QuotaReserved"),
                cond("Admitted"),
                cond("Evicted", reason="Preempted"),
            ],
        },
    }
    status = clear_admission(wl, "2026-01-01T00:00:00Z")
    assert status["admission"] is None
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert by_type["Evicted"]["status"] == "True"  # Kueue's to clear


def test_with_condition_is_none_when_nothing_changes():
    wl = {"status": {"conditions": [cond("PodsReady", reason="PodsReady")]}}
    assert with_condition(wl, "PodsReady", True, "PodsReady", "", "t") is None
    changed = with_condition(wl, "PodsReady", False, "WaitForPodsStart", "", "t")
    assert changed is not None and changed[0]["status"] == "False"


def test_hostname_level_assignment_maps_to_node_pools_through_the_nodes():
    assignment = {
        "topologyAssignment": {
            "levels": ["kubernetes.io/hostname"],
            "slices": [
                {
                    "domainCount": 4,
                    "valuesPerLevel": [
                        {"individual": {"prefix": "v5p-", "roots": ["b-0", "b-1", "a-0", "a-1"]}}
                    ],
                    "podCounts": {"universal": 1},
                }
            ],
        }
    }
    pool_of = {"v5p-a-0": "v5p-a", "v5p-a-1": "v5p-a", "v5p-b-0": "v5p-b", "v5p-b-1": "v5p-b"}
    assert node_pools_of(assignment, hosts=2, slices=2, pool_of=pool_of) == ["v5p-b", "v5p-a"]
    assert node_pools_of(assignment, hosts=2, slices=2) == []  # nodes unknown
    assert node_pools_of(assignment, hosts=2, slices=2, pool_of={"v5p-a-0": "v5p-a"}) == []


# What admission adds to the pods: flavors' node labels and tolerations, admission checks'
# podSetUpdates, merged as Kueue's podset.Merge (builders/workload.admission_assignment).
TPU_SELECTOR = {
    contract.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice",
    contract.NODE_LABEL_TOPOLOGY: "2x2x2",
}
V5P = {"nodeLabels": dict(TPU_SELECTOR)}
ZONE = "topology.kubernetes.io/zone"
TAINTED = {"key": "example.com/team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}


def admitted_workload(
    flavors: dict[str, str] | None = None, checks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    assignment = {"name": "workers", "flavors": flavors or {"google.com/tpu": "v5p"}}
    return {
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [assignment]},
            "conditions": [cond("QuotaReserved"), cond("Admitted")],
            "admissionChecks": checks or [],
        }
    }


def check(name: str, **update: Any) -> dict[str, Any]:
    return {"name": name, "state": "Ready", "podSetUpdates": [{"name": "workers", **update}]}


@pytest.mark.parametrize(
    ("flavors", "checks", "own", "selector", "tolerations"),
    [
        pytest.param(
            {"v5p": V5P}, [], TPU_SELECTOR, TPU_SELECTOR, [], id="shape labels agree with the job"
        ),
        pytest.param(
            {"v5p": {"nodeLabels": {**TPU_SELECTOR, ZONE: "z1"}, "tolerations": [TAINTED]}},
            [],
            TPU_SELECTOR,
            {**TPU_SELECTOR, ZONE: "z1"},
            [TAINTED],
            id="an extra label and a toleration",
        ),
        pytest.param(
            {"v5p": {"nodeLabels": {ZONE: "z1"}}},
            [check("zone", nodeSelector={ZONE: "z1"}, tolerations=[TAINTED])],
            {},
            {ZONE: "z1"},
            [TAINTED],
            id="an admission check repeating a flavor label",
        ),
        pytest.param({}, [], TPU_SELECTOR, {}, [], id="a flavor not read adds nothing"),
        pytest.param(
            {"v5p": {"tolerations": [TAINTED, TAINTED]}},
            [check("c", tolerations=[TAINTED])],
            {},
            {},
            [TAINTED],
            id="tolerations once",
        ),
    ],
)
def test_admission_gives_the_pods_the_flavor_labels_and_tolerations(
    flavors, checks, own, selector, tolerations
):
    found = admission_assignment(admitted_workload(checks=checks), flavors, own_selector=own)
    assert isinstance(found, Assignment), found
    assert (found.node_selector, found.tolerations) == (selector, tolerations)
    assert (found.cluster_queue, found.flavors) == ("cq", {"google.com/tpu": "v5p"})


@pytest.mark.parametrize(
    ("flavors", "checks", "own", "words"),
    [
        pytest.param(
            {"v5p": {"nodeLabels": {contract.NODE_LABEL_ACCELERATOR: "tpu-v6e-slice"}}},
            [],
            TPU_SELECTOR,
            [
                contract.NODE_LABEL_ACCELERATOR,
                "ResourceFlavor v5p sets 'tpu-v6e-slice'",
                "the job's pods select 'tpu-v5p-slice'",
            ],
            id="flavor against the slice shape",
        ),
        pytest.param(
            {"v5p": {"nodeLabels": {ZONE: "z1"}}},
            [check("zoner", nodeSelector={ZONE: "z2"})],
            {},
            [ZONE, "ResourceFlavor v5p sets 'z1'", "admission check zoner sets 'z2'"],
            id="admission check against a flavor",
        ),
        pytest.param(
            {},
            [check("a", labels={"team": "x"}), check("b", labels={"team": "y"})],
            {},
            ["label team", "admission check a sets 'x'", "admission check b sets 'y'"],
            id="two admission checks",
        ),
        pytest.param(
            {},
            [check("zoner", nodeSelector={"disktype": "hdd"})],
            {"disktype": "ssd"},
            ["disktype", "admission check zoner sets 'hdd'", "the job's pods select 'ssd'"],
            id="admission check against the template",
        ),
    ],
)
def test_a_conflicting_admission_names_the_key_and_both_values(flavors, checks, own, words):
    found = admission_assignment(admitted_workload(checks=checks), flavors, own_selector=own)
    assert isinstance(found, str)
    for word in words:
        assert word in found, found


def test_a_later_flavor_label_wins_over_an_earlier_one_as_kueue_copies_them():
    wl = admitted_workload({"google.com/tpu": "a", "cpu": "b", "memory": "a"})
    flavors = {"a": {"nodeLabels": {ZONE: "z1"}}, "b": {"nodeLabels": {ZONE: "z2"}}}
    found = admission_assignment(wl, flavors)
    assert isinstance(found, Assignment) and found.node_selector == {ZONE: "z2"}
    assert flavor_names(wl) == ["a", "b"]


def test_queue_state_carries_a_conflict_and_keeps_the_placement():
    wl = admitted_workload()
    wl["status"]["admission"] = ADMISSION
    bad = {"v5p": {"nodeLabels": {contract.NODE_LABEL_TOPOLOGY: "4x4x4"}}}
    state = queue_state(wl, hosts=2, slices=2, flavors=bad, own_selector=TPU_SELECTOR)
    assert state.admitted and "4x4x4" in state.conflict
    assert state.assignment is not None and state.assignment.node_pools == ["v5p-a", "v5p-b"]
    assert not state.assignment.node_selector
    fine = queue_state(wl, hosts=2, slices=2, flavors={"v5p": V5P}, own_selector=TPU_SELECTOR)
    assert not fine.conflict and fine.assignment is not None
    assert fine.assignment.node_selector == TPU_SELECTOR


@pytest.mark.parametrize(
    ("template_selector", "placement", "expected"),
    [
        pytest.param({}, None, TPU_SELECTOR, id="the shape"),
        pytest.param(
            {"disktype": "ssd", contract.NODE_LABEL_ACCELERATOR: "x"},
            {"nodeSelector": {"rack": "r1"}, "spot": True, "reservation": "res"},
            {
                **TPU_SELECTOR,
                "disktype": "ssd",
                "rack": "r1",
                contract.NODE_LABEL_SPOT: "true",
                contract.NODE_LABEL_RESERVATION: "res",
            },
            id="template, placement, shape last",
        ),
        pytest.param({}, {"spot": False}, TPU_SELECTOR, id="on-demand selects no label"),
    ],
)
def test_the_selector_of_the_job_s_pods(template_selector, placement, expected):
    template = {"spec": {"nodeSelector": template_selector}}
    assert slice_node_selector(template, shape("v5p-16"), placement) == expected


def test_flavor_labels_and_tolerations_go_into_the_pod_template():
    found = admission_assignment(
        admitted_workload(),
        {"v5p": {"nodeLabels": {ZONE: "z1"}, "tolerations": [TAINTED]}},
    )
    assert isinstance(found, Assignment)
    result = apply_assignment(TEMPLATE, found)
    assert result["spec"]["nodeSelector"] == {ZONE: "z1"}
    assert result["spec"]["tolerations"] == [TAINTED]


# Reclaimable pods: whole finished slices of the running attempt.
@dataclass(frozen=True)
class Pod:
    slice_index: int
    attempt: int
    phase: str


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([], 0, id="no pods"),
        pytest.param([Pod(0, 1, "Succeeded"), Pod(0, 1, "Running")], 0, id="half a slice"),
        pytest.param([Pod(0, 1, "Succeeded"), Pod(0, 1, "Succeeded")], 2, id="one slice"),
        pytest.param(
            [Pod(i, 1, "Succeeded") for i in (0, 0, 1, 1)] + [Pod(2, 1, "Running")] * 2,
            4,
            id="two of three slices",
        ),
        pytest.param(
            [Pod(0, 0, "Succeeded"), Pod(0, 0, "Succeeded"), Pod(0, 1, "Running")],
            0,
            id="an earlier attempt's pods",
        ),
        pytest.param([Pod(0, 1, "Succeeded"), Pod(0, 1, "Failed")], 0, id="a failed worker"),
        pytest.param([Pod(7, 1, "Succeeded")] * 2, 0, id="no such slice"),
    ],
)
def test_reclaimable_pods_are_the_workers_of_whole_finished_slices(pods, expected):
    assert reclaimable_pods(pods, attempt=1, hosts=2, slices=3) == expected


def test_a_reclaimable_count_is_written_only_when_it_grows():
    wl: dict[str, Any] = {"status": {}}
    assert reclaimable_status(wl, 0) is None
    assert reclaimable_status(wl, 2) == {"reclaimablePods": [{"name": "workers", "count": 2}]}
    wl["status"]["reclaimablePods"] = [{"name": "workers", "count": 2}]
    assert reported_reclaimable(wl) == 2
    assert reclaimable_status(wl, 2) is None
    assert reclaimable_status(wl, 0) is None  # Kueue refuses a lower count while admitted
    assert reclaimable_status(wl, 4) == {"reclaimablePods": [{"name": "workers", "count": 4}]}


def test_clearing_the_admission_clears_the_reclaimable_count():
    wl = admitted_workload()
    wl["status"]["conditions"].append(cond("Evicted", reason="Preempted"))
    assert "reclaimablePods" not in clear_admission(wl, "t")
    wl["status"]["reclaimablePods"] = [{"name": "workers", "count": 2}]
    assert clear_admission(wl, "t")["reclaimablePods"] is None


@pytest.mark.parametrize(
    ("checks", "said"),
    [
        ([], "quota reserved; waiting for admission checks"),
        (
            [{"name": "ss-kueue-operator", "state": "Pending"}],
            "quota reserved; waiting for admission check ss-kueue-operator (Pending)",
        ),
        (
            [
                {"name": "dws", "state": "Ready", "message": "provisioned"},
                {"name": "slices", "state": "Retry", "message": "Slice s1 failed"},
            ],
            "quota reserved; waiting for admission check slices (Retry: Slice s1 failed)",
        ),
    ],
)
def test_a_reserved_job_says_which_admission_checks_it_waits_for(checks, said):
    workload = {
        "status": {
            "admission": ADMISSION,
            "conditions": [cond("QuotaReserved")],
            "admissionChecks": checks,
        }
    }
    found = queue_state(workload)
    assert (found.state, found.message) == ("Reserved", said)


def dynamic_shape(topology: str, kind: str) -> Any:
    return JobSliceSpec.model_validate(
        {"accelerator": "tpu7x", "topology": topology, "dynamicSlicing": kind}
    ).resolve()


@pytest.mark.parametrize(
    ("topology", "kind", "slices", "count", "level", "size"),
    [
        pytest.param("4x4x8", "SuperSlice", 1, 32, "4x4x4", 16, id="super-slice of two cubes"),
        pytest.param("4x4x8", "SuperSlice", 2, 64, "4x4x4", 16, id="two super-slices"),
        pytest.param("2x2x2", "SubSlice", 3, 6, "2x2x2", 2, id="three sub-slices"),
        pytest.param("2x4x4", "SubSlice", 1, 8, "2x4x4", 8, id="half a cube"),
    ],
)
def test_a_dynamic_slice_s_pod_set_is_what_gke_s_slice_controller_makes_of_a_jobset_s(
    topology: str, kind: str, slices: int, count: int, level: str, size: int
):
    """The annotation, no topology selector (cube nodes carry it only once a Slice is
    formed), the partitions' health as required affinity, and one block with each
    partition's VMs in one partition (xpk slice-main slice/internal/webhooks)."""
    template = {
        **TEMPLATE,
        "spec": {
            **TEMPLATE["spec"],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
    }
    (pod_set,) = build_workload(job(), template, dynamic_shape(topology, kind), slices)["spec"][
        "podSets"
    ]
    assert pod_set["count"] == count
    assert pod_set["topologyRequest"] == {
        "required": "cloud.google.com/gce-topology-block",
        "podSetSliceRequiredTopology": f"cloud.google.com/gke-tpu-partition-{level}-id",
        "podSetSliceSize": size,
    }
    spec = pod_set["template"]["spec"]
    assert spec["nodeSelector"] == {contract.NODE_LABEL_ACCELERATOR: "tpu7x"}
    assert pod_set["template"]["metadata"]["annotations"] == {
        contract.ANNOTATION_SLICE_TOPOLOGY: topology
    }
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {
            "key": f"cloud.google.com/gke-tpu-partition-{level}-state",
            "operator": "In",
            "values": ["HEALTHY", "DEGRADED"],
        },
    ]
    assert "affinity" not in TEMPLATE["spec"]  # the job's template is not changed


def test_a_dynamic_shape_changed_while_queued_makes_the_workload_outdated():
    wl = build_workload(job(), TEMPLATE, dynamic_shape("2x2x2", "SubSlice"), 2)
    same = build_workload(job(), TEMPLATE, dynamic_shape("2x2x2", "SubSlice"), 2)
    assert not workload_outdated(wl, same)
    other = build_workload(job(), TEMPLATE, dynamic_shape("2x2x4", "SubSlice"), 1)
    assert workload_outdated(wl, other)
