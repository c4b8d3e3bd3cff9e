"""The ``accelerator.gke.io/slice`` admission check for TPUJob Workloads
(``policies/slice_check.py``), against GKE's Kueue slice controller: Slice names, Slice
states, partitions cut from the topology assignment, and the check's state machine with
GKE's messages."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import pytest

from tpu_operator import contract, timestamps
from tpu_operator.policies.slice_check import (
    ACTIVATION_TIMEOUT,
    OWNER_NAME,
    OWNER_NAMESPACE,
    OWNER_POD_SET,
    RECHECK_SECONDS,
    RETRY_SECONDS,
    CheckFacts,
    CheckPlan,
    create_failed,
    decide,
    failure_condition,
    gke_slice_name,
    partitions_from_assignment,
    slice_body,
    slice_state,
)

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 11, 27, 12, 0, 0, tzinfo=dt.UTC)


def gke_rule(name: str) -> str:
    """GKE's rule restated: over 49 characters, the first 43, "-", 5 hex of sha256."""
    return (
        name if len(name) <= 49 else f"{name[:43]}-{hashlib.sha256(name.encode()).hexdigest()[:5]}"
    )


LONG_NS, LONG_WL = "very-long-namespace-name", "very-long-workload-name-that-exceeds-the-limit"


@pytest.mark.parametrize(
    ("namespace", "workload", "pod_set", "index", "want"),
    [
        pytest.param("default", "wl", "main", 0, "default-wl-main-0", id="short"),
        pytest.param(
            "ns",
            "12345678901234567890123456789012345678901",
            "ps",
            0,
            "ns-12345678901234567890123456789012345678901-ps-0",
            id="exactly 49: kept",
        ),
        # The four hashed rows below are GKE's own (slice/internal/core/slice_test.go).
        pytest.param(
            "ns",
            "123456789012345678901234567890123456789012",
            "ps",
            0,
            "ns-1234567890123456789012345678901234567890-89451",
            id="50: hashed (GKE's value)",
        ),
        pytest.param(
            LONG_NS,
            LONG_WL,
            "podset",
            0,
            "very-long-namespace-name-very-long-workload-209e4",
            id="long (GKE's value)",
        ),
        pytest.param(
            LONG_NS,
            LONG_WL,
            "another-podset",
            0,
            "very-long-namespace-name-very-long-workload-a06b5",
            id="long, other pod set (GKE's value)",
        ),
        pytest.param(
            LONG_NS,
            LONG_WL,
            "podset",
            1,
            "very-long-namespace-name-very-long-workload-36522",
            id="long, next index (GKE's value)",
        ),
        pytest.param(
            "team-a",
            "tpujob-train-llama-4x4x8-5c2f1",
            "workers",
            3,
            gke_rule("team-a-tpujob-train-llama-4x4x8-5c2f1-workers-3"),
            id="a TPUJob's Workload: hashed by the rule",
        ),
    ],
)
def test_gke_slice_name(namespace: str, workload: str, pod_set: str, index: int, want: str) -> None:
    assert gke_slice_name(namespace, workload, pod_set, index) == want
    assert want == gke_rule(f"{namespace}-{workload}-{pod_set}-{index}")
    assert len(want) <= 49


HOST = "kubernetes.io/hostname"
BLOCK = "cloud.google.com/gce-topology-block"
# Four hosts a cube: h0-h3 in c0, h4-h7 in c1, ...
CUBE_OF = {f"h{i}": f"c{i // 4}" for i in range(24)}


def individual(*hosts: str, pods: int = 1, prefix: str = "") -> dict[str, Any]:
    roots = [h.removeprefix(prefix) for h in hosts]
    return {
        "domainCount": len(hosts),
        "valuesPerLevel": [{"individual": {"prefix": prefix, "roots": roots}}],
        "podCounts": {"universal": pods},
    }


def hosts(first: int, last: int) -> list[str]:
    return [f"h{i}" for i in range(first, last + 1)]


@pytest.mark.parametrize(
    ("assignment", "slices", "want"),
    [
        pytest.param(
            {"levels": [HOST], "slices": [individual(*hosts(0, 7), prefix="h")]},
            1,
            (("c0", "c1"),),
            id="individual form with a prefix: one Slice of both cubes",
        ),
        pytest.param(
            {
                "levels": [HOST],
                "slices": [
                    individual(*hosts(0, 3)),
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "h4"}],
                        "podCounts": {"individual": [4]},
                    },
                ],
            },
            1,
            (("c0", "c1"),),
            id="universal form after an individual part",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual("h0", "h1", "h0", "h5", "h1", "h4")]},
            1,
            (("c0", "c1"),),
            id="a repeated host counts once",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual("h9", "h1", "h5", "h8", "h2")]},
            1,
            (("c2", "c0", "c1"),),
            id="first-appearance order, not sorted",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual(*hosts(0, 15))]},
            2,
            (("c0", "c1"), ("c2", "c3")),
            id="two Slices: slice i gets chunk i",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual(*hosts(8, 23), *hosts(0, 7))]},
            3,
            (("c2", "c3"), ("c4", "c5"), ("c0", "c1")),
            id="three Slices, in the assignment's order",
        ),
        pytest.param(
            {
                "levels": [BLOCK, HOST],
                "slices": [
                    {
                        "domainCount": 8,
                        "valuesPerLevel": [
                            {"universal": "b0"},
                            {"individual": {"roots": hosts(4, 7) + hosts(0, 3)}},
                        ],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            1,
            (("c1", "c0"),),
            id="hostname is not the first level",
        ),
        pytest.param(
            {
                "levels": [HOST],
                "domains": [{"values": ["h4"], "count": 1}, {"values": ["h0"], "count": 1}],
            },
            1,
            (("c1", "c0"),),
            id="the older domains form",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual("h0", "h99")]},
            1,
            None,
            id="a host without a partition id",
        ),
        pytest.param(
            {"levels": [BLOCK], "slices": [individual("b0")]},
            1,
            None,
            id="no hostname level",
        ),
        pytest.param(
            {"levels": [HOST], "slices": [individual(*hosts(0, 11))]},
            2,
            None,
            id="three cubes do not split into two Slices",
        ),
        pytest.param({"levels": [HOST], "slices": []}, 1, None, id="no domains"),
    ],
)
def test_partitions_from_assignment(
    assignment: dict[str, Any], slices: int, want: tuple[tuple[str, ...], ...] | None
) -> None:
    assert partitions_from_assignment(assignment, CUBE_OF, slices) == want


def ago(seconds: float) -> str:
    return timestamps.stamp(NOW - dt.timedelta(seconds=seconds))


def a_slice(
    name: str = "s",
    ids: tuple[str, ...] = ("c0",),
    reason: str | None = None,
    status: str = "True",
    message: str = "",
    since: float = 10,
    age: float = 10,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Slice as the apiserver returns it; ``reason`` None: no Ready condition yet."""
    meta: dict[str, Any] = {"name": name, "creationTimestamp": ago(age)}
    if deleting:
        meta["deletionTimestamp"] = ago(1)
    conditions = []
    if reason is not None:
        conditions.append(
            {
                "type": "Ready",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": ago(since),
            }
        )
    return {
        "metadata": meta,
        "spec": {"partitionIds": list(ids)},
        "status": {"conditions": conditions},
    }


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(a_slice(reason="ACTIVE", deleting=True), "DELETED", id="being deleted"),
        pytest.param(a_slice(reason="FAILED", status="False"), "FAILED", id="Ready False FAILED"),
        pytest.param(
            a_slice(reason="SliceCreationFailed", status="False"),
            "FAILED",
            id="SliceCreationFailed (retry gate off)",
        ),
        pytest.param(
            a_slice(reason="FAILED", status="Unknown"), "FAILED", id="Ready Unknown FAILED"
        ),
        pytest.param(a_slice(age=ACTIVATION_TIMEOUT - 1), "CREATED", id="no condition, 179 s"),
        pytest.param(a_slice(age=ACTIVATION_TIMEOUT), "STALE", id="no condition, 180 s"),
        pytest.param(
            {"metadata": {"name": "s"}, "spec": {}}, "CREATED", id="no condition, no creation time"
        ),
        pytest.param(
            a_slice(reason="ACTIVATING", status="False", since=ACTIVATION_TIMEOUT - 1),
            "ACTIVATING",
            id="Ready False, 179 s",
        ),
        pytest.param(
            a_slice(reason="ACTIVATING", status="False", since=ACTIVATION_TIMEOUT),
            "STALE",
            id="Ready False, 180 s",
        ),
        pytest.param(
            a_slice(reason="ACTIVATING", status="Unknown", since=3600),
            "ACTIVATING",
            id="Ready Unknown never goes stale",
        ),
        pytest.param(a_slice(reason="ACTIVE", since=3600), "ACTIVE", id="ACTIVE"),
        pytest.param(a_slice(reason="ACTIVE_DEGRADED"), "ACTIVE_DEGRADED", id="ACTIVE_DEGRADED"),
        pytest.param(
            a_slice(reason="DEACTIVATING", status="True"), "ACTIVATING", id="other reason"
        ),
    ],
)
def test_slice_state(body: dict[str, Any], want: str) -> None:
    assert slice_state(body, NOW) == want


NS, WL, CHECK = "team", "tpujob-train-4x4x8-5c2f1", "slice"
N0, N1 = (gke_slice_name(NS, WL, "workers", i) for i in range(2))
WANTED = (("c0", "c1"), ("c2", "c3"))
UPDATES = ({"name": "workers", "nodeSelector": {"cloud.google.com/gke-tpu-topology": "4x4x8"}},)


def facts(state: str = "Pending", message: str = "", **fields: Any) -> CheckFacts:
    mine = fields.pop("mine", {})
    base: dict[str, Any] = {
        "check": CHECK,
        "current": {"name": CHECK, "state": state, "message": message},
        "namespace": NS,
        "workload": WL,
        "pod_set": "workers",
        "accelerator": "tpu7x",
        "topology": "4x4x8",
        "partitions_per_slice": 2,
        "wanted": WANTED,
        "release": False,
        "pods_gone": False,
        "mine": {body["metadata"]["name"]: body for body in mine},
        "now": NOW,
    }
    base.update(fields)
    base.setdefault(
        "taken",
        {pid: n for n, body in base["mine"].items() for pid in body["spec"]["partitionIds"]},
    )
    return CheckFacts(**base)


def s0(**kw: Any) -> dict[str, Any]:
    return a_slice(N0, WANTED[0], **kw)


def s1(**kw: Any) -> dict[str, Any]:
    return a_slice(N1, WANTED[1], **kw)


def retry(reason: str, message: str, delete: tuple[str, ...] = (), **kw: Any) -> CheckPlan:
    return CheckPlan(
        state="Retry",
        message=message,
        requeue_after=RETRY_SECONDS,
        failure=(reason, message),
        delete=delete,
        **kw,
    )


def updated(before: str, after: str) -> tuple[str, str]:
    return (
        "AdmissionCheckUpdated",
        f'Admission check "slice" updated state from "{before}" to "{after}"',
    )


ACTIVE = {"reason": "ACTIVE"}
CREATED_EVENT = ("SlicesCreated", f'The Slices "{N0}", "{N1}" have been created')


@pytest.mark.parametrize(
    ("given", "want"),
    [
        pytest.param(
            facts(release=True, mine=[s0(**ACTIVE), s1(**ACTIVE)]),
            CheckPlan(recheck=RECHECK_SECONDS),
            id="released, pods still there: the Slices stay",
        ),
        pytest.param(
            facts(
                release=True,
                pods_gone=True,
                mine=[s1(**ACTIVE), s0(reason="FAILED", status="False")],
            ),
            CheckPlan(delete=(N0, N1)),
            id="released, pods gone: every Slice goes",
        ),
        pytest.param(
            facts(release=True, pods_gone=True, mine=[s0(deleting=True)]),
            CheckPlan(),
            id="released, Slices already going: nothing",
        ),
        pytest.param(
            facts("Retry", "Slice has been deleted", mine=[s0(**ACTIVE), s1(deleting=True)]),
            CheckPlan(delete=(N0,)),
            id="check Retry: every Slice goes, nothing is written",
        ),
        pytest.param(
            facts(wanted=None, mine=[s0(**ACTIVE)]),
            CheckPlan(recheck=RECHECK_SECONDS),
            id="no usable assignment: nothing",
        ),
        pytest.param(
            facts("Ready", "Slices are in states: 2 ACTIVE", mine=[s0(**ACTIVE)]),
            retry("Deletion", "Slice has been deleted", (N0,)),
            id="Ready and a Slice missing: Retry (Deletion), the rest go",
        ),
        pytest.param(
            facts(
                "Ready", "Slices are in states: 2 ACTIVE", mine=[s0(**ACTIVE), s1(deleting=True)]
            ),
            retry("Deletion", "Slice has been deleted", (N0,)),
            id="Ready and a Slice being deleted: Retry (Deletion)",
        ),
        pytest.param(
            facts(mine=[s0(reason="ACTIVATING", status="False"), s1(deleting=True)]),
            CheckPlan(recheck=RECHECK_SECONDS),
            id="Pending and a Slice being deleted: wait for it to go",
        ),
        pytest.param(
            facts(mine=[s0(**ACTIVE), s1(**ACTIVE)], unhealthy={"c3": "UNHEALTHY", "c1": "UNSET"}),
            retry(
                "RuntimeFailure",
                "Partitions no longer HEALTHY or DEGRADED: c1 UNSET, c3 UNHEALTHY",
                (N0, N1),
            ),
            id="a partition unhealthy: Retry (RuntimeFailure), the Slices go",
        ),
        pytest.param(
            facts(),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 2 CREATED",
                create=((N0, WANTED[0]), (N1, WANTED[1])),
                event=CREATED_EVENT,
                recheck=RECHECK_SECONDS,
            ),
            id="no Slice: both created, Pending",
        ),
        pytest.param(
            facts(mine=[s0(**ACTIVE)]),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 1 CREATED, 1 ACTIVE",
                create=((N1, WANTED[1]),),
                event=("SlicesCreated", f'The Slices "{N1}" have been created'),
                recheck=RECHECK_SECONDS,
            ),
            id="one missing: only it is created",
        ),
        pytest.param(
            facts(taken={"c2": "someone-else", "c0": "another"}),
            retry(
                "ConfigurationFailure",
                'partition IDs ["c0 (used by another)" "c2 (used by someone-else)"]'
                " are already used by existing Slices",
            ),
            id="a partition held by another Slice: Retry (ConfigurationFailure)",
        ),
        pytest.param(
            facts(wanted=(("c0",), ("c1",)), taken={"c1": "x"}),
            retry(
                "ConfigurationFailure",
                'partition IDs ["c1 (used by x)"] are already used by existing Slices\n'
                f"incorrect number of partitions for slices: [{N0} {N1}]",
            ),
            id="wrong partition count too: both errors, joined",
        ),
        pytest.param(
            facts(mine=[a_slice(N0, ("c0", "c9"), **ACTIVE), s1(**ACTIVE)]),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 1 ACTIVE",
                delete=(N0,),
                recheck=RECHECK_SECONDS,
            ),
            id="a Slice of other partitions: deleted (made again next pass)",
        ),
        pytest.param(
            facts(mine=[a_slice(N0, ("c2", "c9"), **ACTIVE)]),
            retry(
                "ConfigurationFailure",
                f'partition IDs ["c2 (used by {N0})"] are already used by existing Slices',
                (N0,),
            ),
            id="a partition held by this Workload's other Slice is a conflict too (as GKE's)",
        ),
        pytest.param(
            facts(
                "Ready",
                "Slices are in states: 2 ACTIVE",
                mine=[a_slice(N0, ("x",), **ACTIVE), s1(**ACTIVE)],
            ),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 1 ACTIVE",
                delete=(N0,),
                recheck=RECHECK_SECONDS,
                updated=updated("Ready", "Pending"),
            ),
            id="Ready, a Slice of other partitions: it goes, Pending (GKE's test case)",
        ),
        pytest.param(
            facts(
                mine=[
                    s1(**ACTIVE),
                    s0(reason="FAILED", status="False", message="cube c0 unhealthy"),
                ]
            ),
            retry(
                "RuntimeFailure",
                f"Slices are in states: 1 ACTIVE, 1 FAILED. Errors: {N0}: cube c0 unhealthy",
                (N0, N1),
                updated=updated("Pending", "Retry"),
            ),
            id="a Slice FAILED: Retry (RuntimeFailure) with its message, the Slices go",
        ),
        pytest.param(
            facts(mine=[s0(age=ACTIVATION_TIMEOUT), s1(reason="ACTIVATING", status="False")]),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 1 ACTIVATING, 1 STALE",
                delete=(N0,),
                recheck=RECHECK_SECONDS,
            ),
            id="a Slice STALE: deleted, Pending",
        ),
        pytest.param(
            facts(mine=[s0(**ACTIVE), s1(reason="ACTIVE_DEGRADED")]),
            CheckPlan(
                state="Ready",
                message="Slices are in states: 1 ACTIVE, 1 ACTIVE_DEGRADED",
                pod_set_updates=UPDATES,
                updated=updated("Pending", "Ready"),
            ),
            id="all active: Ready with the topology selector",
        ),
        pytest.param(
            facts(mine=[s1(**ACTIVE), s0()]),
            CheckPlan(
                state="Pending",
                message="Slices are in states: 1 CREATED, 1 ACTIVE",
                recheck=RECHECK_SECONDS,
            ),
            id="forming: Pending, states in GKE's order",
        ),
        pytest.param(
            facts(
                "Pending", "Slices are in states: 1 CREATED, 1 ACTIVE", mine=[s1(**ACTIVE), s0()]
            ),
            CheckPlan(recheck=RECHECK_SECONDS),
            id="no change: nothing written",
        ),
        pytest.param(
            facts("Ready", "Slices are in states: 2 ACTIVE", mine=[s0(**ACTIVE), s1(**ACTIVE)]),
            CheckPlan(),
            id="Ready and unchanged: nothing",
        ),
    ],
)
def test_decide(given: CheckFacts, want: CheckPlan) -> None:
    assert decide(given) == want


def test_created_slices_are_gke_slices_of_the_workload() -> None:
    plan = decide(facts())
    bodies = [slice_body(name, ids, facts()) for name, ids in plan.create]
    assert bodies[1] == {
        "apiVersion": "accelerator.gke.io/v1beta1",
        "kind": "Slice",
        "metadata": {
            "name": N1,
            "annotations": {OWNER_NAMESPACE: NS, OWNER_NAME: WL, OWNER_POD_SET: "workers"},
            "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
        },
        "spec": {"type": "tpu7x", "topology": "4x4x8", "partitionIds": ["c2", "c3"]},
    }
    assert (OWNER_NAMESPACE, OWNER_NAME, OWNER_POD_SET) == (
        "accelerator.gke.io/owner-workload-namespace",
        "accelerator.gke.io/owner-workload-name",
        "accelerator.gke.io/owner-podset-name",
    )


def test_a_failed_create_leaves_the_check_pending_with_the_error() -> None:
    message = f'Error creating Slice "{N0}": slices.accelerator.gke.io "{N0}" already exists'
    assert create_failed(N0, f'slices.accelerator.gke.io "{N0}" already exists') == CheckPlan(
        state="Pending",
        message=message,
        event=("FailedCreateSlice", message),
        recheck=RECHECK_SECONDS,
    )


@pytest.mark.parametrize(
    ("plan", "condition", "want"),
    [
        pytest.param(
            retry("Deletion", "Slice has been deleted"),
            None,
            {
                "type": "TPUSliceFailure",
                "status": "True",
                "reason": "Deletion",
                "message": "Slice has been deleted",
            },
            id="Retry: set True",
        ),
        pytest.param(
            CheckPlan(state="Pending", message="Slices are in states: 2 CREATED"),
            {
                "type": "TPUSliceFailure",
                "status": "True",
                "reason": "Deletion",
                "message": "Slice has been deleted",
            },
            {
                "type": "TPUSliceFailure",
                "status": "False",
                "reason": "Deletion",
                "message": "Previously: Slice has been deleted",
            },
            id="leaving Retry: False, Previously",
        ),
        pytest.param(
            CheckPlan(state="Pending"),
            {"type": "TPUSliceFailure", "status": "False", "reason": "Deletion", "message": "x"},
            None,
            id="already False: left",
        ),
        pytest.param(CheckPlan(), {"status": "True"}, None, id="nothing written: left"),
    ],
)
def test_failure_condition(
    plan: CheckPlan, condition: dict[str, Any] | None, want: dict[str, Any] | None
) -> None:
    assert failure_condition(plan, condition) == want
