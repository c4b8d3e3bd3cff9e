"""The one decider of a running attempt (``policies/verdict.py``), case by case."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.policies.world import World, facts, plan_of, stamp_at
from tpu_operator.api.status import Reason
from tpu_operator.policies import verdict
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.state.gang import GangState, SliceCount, WorkerFailure
from tpu_operator.state.views import pod_view

pytestmark = pytest.mark.unit

FAILED = WorkerFailure(Reason.WORKER_FAILED, "worker exited 1", "j-0-0", "n0", 1, stamp_at(99))
ECHO = WorkerFailure(Reason.WORKER_FAILED, "a peer died", "j-0-1", "n1", 75, stamp_at(99))


def gang(outcome: str, failure: WorkerFailure | None = None, stale: int = 0) -> GangState:
    state = GangState(attempt=2, outcome=outcome, total=2, failure=failure)  # type: ignore[arg-type]
    state.slices = {0: SliceCount(total=2, existing=2, ready=2)}
    state.stale = [None] * stale  # type: ignore[list-item]
    return state


def stalled_track(stalled_since: float) -> JobTrack:
    track = JobTrack(attempt=2)
    worker = track.worker("j-0-0", 0, 0, "n0")
    sample = WorkerSample(at=stalled_since, steps_total=5, step=5, phases={"step": 5.0})
    track.observe(worker, sample)
    return track


def stopped_pod(name: str) -> Any:
    """A supervised pod whose training process stopped (readiness False, container up)."""
    return pod_view(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": name,
                "labels": {
                    "tpu-operator.dev/slice-name": "j-0",
                    "tpu-operator.dev/job-name": "j",
                    "tpu-operator.dev/restart-attempt": "2",
                },
                "annotations": {"tpu-operator.dev/supervised": "true"},
            },
            "spec": {"nodeName": "n1"},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": stamp_at(50)}
                ],
                "containerStatuses": [
                    {"name": "worker", "state": {"running": {"startedAt": stamp_at(1)}}}
                ],
            },
        }
    )


def template_rejected() -> dict[int, dict[str, Any]]:
    failure = {"reason": "InvalidPodTemplate", "attempt": 2, "message": "bad volume"}
    return {0: {"status": {"failure": failure}}}


CASES: list[tuple[str, dict[str, Any], GangState, str, str | None]] = [
    # (case, facts and status, gang, verdict kind, the reason it names)
    ("a worker failed", {}, gang("Failed", FAILED), "attempt-failed", "Failed"),
    ("the previous attempt drains", {}, gang("Failed", FAILED, stale=1), "goes-on", None),
    ("every worker runs", {}, gang("Running"), "goes-on", None),
    ("every worker is done", {}, gang("Succeeded"), "succeeded", None),
    (
        "a slice's pods were rejected as invalid",
        {"slices": template_rejected()},
        gang("Starting"),
        "job-failed",
        "InvalidPodTemplate",
    ),
    (
        "the deadline passed",
        {"activeDeadlineSeconds": 50, "status": {"startTime": stamp_at(0)}},
        gang("Running"),
        "job-failed",
        "DeadlineExceeded",
    ),
    (
        "stalled, stallAction Restart",
        {"track": stalled_track(0.0), "monitoring": {"stallTimeout": "30s"}},
        gang("Running"),
        "attempt-failed",
        "Stalled",
    ),
    (
        "stalled, stallAction None",
        {
            "track": stalled_track(0.0),
            "monitoring": {"stallTimeout": "30s", "stallAction": "None"},
        },
        gang("Running"),
        "goes-on",
        None,
    ),
    (
        "an in-place restart gave up stopping the processes",
        {
            "world": World(fallback="supervisor of j-0-1 did not answer"),
            "status": {"restartKind": "InPlace", "inPlaceSince": stamp_at(90)},
        },
        gang("Starting"),
        "attempt-failed",
        "SupervisorUnreachable",
    ),
    (
        "an in-place restart past its timeout",
        {
            "status": {"restartKind": "InPlace", "inPlaceSince": stamp_at(0)},
            "failurePolicy": {"inPlaceTimeoutSeconds": 60},
        },
        gang("Starting"),
        "attempt-failed",
        "InPlaceRestartTimeout",
    ),
    (
        "a failure's echo waits for its cause",
        {"pods": [stopped_pod("j-0-1")]},
        gang("Failed", ECHO),
        "goes-on",
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "given", "state", "kind", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_verdict(case: str, given: dict[str, Any], state: GangState, kind: str, reason: str | None):
    given = dict(given)
    world = given.pop("world", World())
    status = given.pop("status", {})
    job = facts(recorded={"attempt": 2, **status}, **given)
    plan = plan_of(job)
    found = verdict.decide(job, plan, world, 2, state)
    assert found.kind == kind
    named = found.reason or (found.failure.reason if found.failure else None)
    assert named == reason


def test_a_failures_echo_is_taken_once_its_wait_is_over():
    job = facts(103.0, recorded={"attempt": 2}, pods=[stopped_pod("j-0-1")])
    found = verdict.decide(job, plan_of(job), World(), 2, gang("Failed", ECHO))
    assert found.kind == "attempt-failed" and found.failure == ECHO
