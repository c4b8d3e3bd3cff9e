"""Pods carried into the next attempt in place by their slice's record, not by a write to
each pod: which attempt a pod belongs to (``views.carried_attempt``), what the job writes
on each slice (``in_place.carried_from``), when the starts may go out
(``supervisors.gang_runs``), and the operator's caches filing a slice's pods again when
its record changes (``ownership.SliceOwners``, ``ownership.refile``). Pure, table-driven."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.unit.test_gang import pod
from tpu_operator import contract
from tpu_operator.builders.slices import slice_patch
from tpu_operator.policies.in_place import carried_from
from tpu_operator.reconcile.supervisors import gang_runs
from tpu_operator.runtime.ownership import SliceOwners, refile
from tpu_operator.state.views import FOREIGN, OWN, carried_attempt, pod_view

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("label", "attempt", "in_place_from", "belongs"),
    [
        (1, 1, None, 1),  # the attempt it was created for
        (1, 2, None, 1),  # not carried: a pod of an older attempt (deleted by its slice)
        (1, 2, 1, 2),  # carried into 2
        (1, 4, 1, 4),  # carried through three in-place restarts
        (2, 4, 1, 4),  # created for 2 (its slice was recreated then?) and carried
        (0, 4, 1, 0),  # older than what the slice carries: stale
        (4, 4, 1, 4),  # created for the slice's attempt
        (5, 4, 1, 5),  # newer than the slice's record (a record not seen yet): as labelled
        (3, 4, 4, 3),  # the record carries nothing older than 4
    ],
)
def test_the_attempt_a_pod_belongs_to(label, attempt, in_place_from, belongs):
    assert carried_attempt(label, attempt, in_place_from) == belongs


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # No slice yet: its pods will be the attempt's own.
        ({"slice_attempt": None, "slice_from": None, "moving_in_place": True}, None),
        # The slice moves from 1 to 2 in place: it carries the pods of 1.
        ({"slice_attempt": 1, "slice_from": None, "moving_in_place": True}, 1),
        # ... and from 2 to 3 again: still from 1 (its pods were created for 1).
        ({"slice_attempt": 2, "slice_from": 1, "moving_in_place": True}, 1),
        # A mixed restart recreates this slice: nothing carried.
        ({"slice_attempt": 2, "slice_from": 1, "moving_in_place": True, "recreated": True}, None),
        # A restart by recreation (or a resume, a preemption): nothing carried.
        ({"slice_attempt": 2, "slice_from": 1, "moving_in_place": False}, None),
        # Written already for this attempt: kept, while running and after.
        ({"slice_attempt": 3, "slice_from": 1, "moving_in_place": False}, 1),
        ({"slice_attempt": 3, "slice_from": 1, "moving_in_place": True, "recreated": True}, 1),
        ({"slice_attempt": 3, "slice_from": None, "moving_in_place": True}, None),
    ],
)
def test_what_a_job_writes_on_its_slice_for_attempt_3(case: dict[str, Any], expected):
    assert carried_from(attempt=3, **{"recreated": False, **case}) == expected


def _gang(attempt: int = 2, **changes: Any) -> list:
    pods = []
    for s in range(2):
        for w in range(2):
            name = f"j-{s}-{w}"
            if name in changes and changes[name] is None:
                continue
            view = pod(name, slice_index=s, worker=w, attempt=attempt)
            pods.append(replace(view, **(changes.get(name) or {})))
    return pods


@pytest.mark.parametrize(
    ("pods", "runs"),
    [
        (_gang(), True),
        # A pod of the old attempt is left (a recreated slice's, or one not seen carried).
        (_gang(**{"j-1-0": {"attempt": 1}}), False),
        # One member is missing (its slice has not created it yet).
        (_gang(**{"j-1-1": None}), False),
        # One is not running yet, or cannot be reached.
        (_gang(**{"j-1-1": {"phase": "Pending"}}), False),
        (_gang(**{"j-0-0": {"pod_ip": None}}), False),
        # Carried pods count as the attempt's.
        (_gang(**{"j-0-0": {"label_attempt": 1}, "j-0-1": {"label_attempt": 1}}), True),
    ],
)
def test_the_starts_wait_for_every_pod_of_the_attempt(pods, runs):
    assert gang_runs(pods, 2, 4) is runs


def slice_body(uid: str, name: str, attempt: int, in_place_from: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"attempt": attempt}
    if in_place_from is not None:
        spec["inPlaceFrom"] = in_place_from
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ml",
            "name": name,
            "ownerReferences": [
                {"kind": contract.JOB_KIND, "controller": True, "name": "j", "uid": "job-uid"}
            ],
        },
        "spec": spec,
    }


def pod_body(name: str, slice_name: str, owner: str, label: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": {
                contract.LABEL_SLICE_NAME: slice_name,
                contract.LABEL_JOB_NAME: "j",
                contract.LABEL_RESTART_ATTEMPT: str(label),
            },
            "ownerReferences": [
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": contract.SLICE_KIND,
                    "controller": True,
                    "name": slice_name,
                    "uid": owner,
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def test_a_slices_record_carries_its_pods_and_they_are_filed_again_when_it_changes():
    owners = SliceOwners()
    assert owners.known(slice_body("s0", "j-0", 1, None))
    assert not owners.known(slice_body("s0", "j-0", 1, None))  # nothing changed
    view = pod_view(pod_body("j-0-0", "j-0", "s0", 1), owners.ownership, owners.carried)
    assert view is not None and (view.attempt, view.carried, view.ownership) == (1, False, OWN)
    assert refile(view, owners) is view
    # The job carries the slice's pods into 2: the record changes, the pod is filed again.
    assert owners.known(slice_body("s0", "j-0", 2, 1))
    moved = refile(view, owners)
    assert (moved.attempt, moved.label_attempt, moved.carried) == (2, 1, True)
    assert pod_view(pod_body("j-0-0", "j-0", "s0", 1), owners.ownership, owners.carried) == moved
    # A restart by recreation: the record carries nothing; the pod is attempt 1's again.
    assert owners.known(slice_body("s0", "j-0", 3, None))
    back = refile(moved, owners)
    assert (back.attempt, back.carried) == (1, False)
    assert back == view
    # Deleted slices are remembered: their pods keep the attempt their record said.
    owners.known(slice_body("s0", "j-0", 3, 1))
    owners.gone("s0")
    assert owners.carried("s0", 2) == 3


def test_a_pod_not_the_operators_is_never_carried():
    owners = SliceOwners()
    owners.known(slice_body("s0", "j-0", 2, 1))
    # Labels naming another slice than its owner's: foreign, as labelled.
    view = pod_view(pod_body("x-0", "j-1", "s0", 1), owners.ownership, owners.carried)
    assert view is not None and (view.ownership, view.attempt) == (FOREIGN, 1)
    assert not view.carried


@pytest.mark.parametrize(
    ("want", "have", "patch"),
    [
        ({"awaitStart": True}, {}, {"awaitStart": True}),
        ({}, {"awaitStart": True}, {"awaitStart": None}),
        ({}, {"awaitStart": False}, None),  # the schema's default: nothing to write
        ({}, {}, None),
        ({"inPlaceFrom": 1}, {"inPlaceFrom": 1, "awaitStart": False}, None),
    ],
)
def test_await_start_is_written_only_when_it_changes(want, have, patch):
    got = slice_patch({"spec": want}, {"spec": have})
    assert (got or {}).get("spec") == patch
