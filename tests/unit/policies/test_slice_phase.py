"""The phase of a TPUSlice and its message (``policies/slice_phase.py``): one row per rung
of the ladder, for a job's slice and a standalone one."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tpu_operator.api.status import Phase, Reason
from tpu_operator.policies.phase import of_attempt
from tpu_operator.policies.slice_phase import PodRefusal, SliceFacts, conditions, decide, said
from tpu_operator.state.gang import GangState, Member, Outcome, Unseen, WorkerFailure

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
FORBIDDEN = PodRefusal("u", 2, Reason.PODS_FORBIDDEN, "pods cannot be created: quota")
INVALID = PodRefusal("u", 2, Reason.INVALID_POD_TEMPLATE, "the apiserver rejected the pod")
EXITED = WorkerFailure(Reason.WORKER_FAILED, "worker s-0 exited 1", "s-0", "n0", 1, None)
DELETED = WorkerFailure(Reason.POD_DELETED, "pod s-0 was deleted", "s-0", "n0", None, None)
NO_SCHEDULER = "no scheduler has looked at pod s-0 (or any other pod of this attempt) in 60 s"


def gang(
    outcome: Outcome = "Running",
    ready: int = 2,
    to_create: int = 0,
    failure: WorkerFailure | None = None,
    unschedulable: tuple[str, str] | None = None,
    unseen: str | None = None,
) -> GangState:
    """A slice of two workers; ``unseen``: when its pods no scheduler looked at were made."""
    state = GangState(attempt=2, outcome=outcome, total=2, ready=ready, failure=failure)
    state.to_create = [Member(0, i, f"s-{i}") for i in range(to_create)]
    state.unschedulable = unschedulable
    if unseen is not None:
        state.unseen = Unseen("s-0", "default-scheduler", unseen)
    return state


def facts(state: GangState, **fields: Any) -> SliceFacts:
    fields.setdefault("standalone", False)
    fields.setdefault("suspend", False)
    fields.setdefault("stopping", fields["suspend"])
    fields.setdefault("blocked", fields.get("draining", False))
    fields.setdefault("draining", False)
    return SliceFacts(gang=state, attempt=2, now=NOW, **fields)


@pytest.mark.parametrize(
    ("given", "phase", "message", "failure", "ended", "recheck"),
    [
        pytest.param(
            facts(
                gang("Creating", 0, 2),
                standalone=True,
                stopping=True,
                finished=True,
                previous_phase=Phase.FAILED,
                previous_message="worker s-0 exited 1; failurePolicy.maxRestarts (0) reached",
            ),
            Phase.FAILED,
            "worker s-0 exited 1; failurePolicy.maxRestarts (0) reached",
            None,
            False,
            None,
            id="finished-standalone-stays-as-it-ended-its-pods-gone",
        ),
        pytest.param(
            facts(
                gang("Succeeded", 0),
                standalone=True,
                suspend=True,
                finished=True,
                previous_phase=Phase.SUCCEEDED,
                previous_message="all 2 workers exited 0",
            ),
            Phase.SUCCEEDED,
            "all 2 workers exited 0",
            None,
            False,
            None,
            id="finished-standalone-suspended-stays-succeeded",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), refusal=INVALID),
            Phase.FAILED,
            "the apiserver rejected the pod",
            Reason.INVALID_POD_TEMPLATE,
            False,
            None,
            id="invalid-template-fails",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), refusal=FORBIDDEN),
            Phase.PENDING,
            "pods cannot be created: quota",
            None,
            False,
            None,
            id="other-refusal-retries",
        ),
        pytest.param(
            facts(gang("Succeeded", 0)),
            Phase.SUCCEEDED,
            "all 2 workers exited 0",
            None,
            False,
            None,
            id="succeeded",
        ),
        pytest.param(
            facts(gang("Failed", 1, failure=EXITED)),
            Phase.FAILED,
            "worker s-0 exited 1",
            Reason.WORKER_FAILED,
            False,
            None,
            id="failed-job-slice-its-job-decides",
        ),
        pytest.param(
            facts(gang("Failed", 1, failure=EXITED), standalone=True),
            Phase.FAILED,
            "worker s-0 exited 1",
            Reason.WORKER_FAILED,
            True,
            None,
            id="failed-standalone-its-failure-policy-decides",
        ),
        pytest.param(
            facts(gang("Failed", 0, failure=EXITED), standalone=True, suspend=True),
            Phase.SUSPENDED,
            "suspended",
            None,
            False,
            None,
            id="standalone-suspended-whatever-its-pods-exit-with",
        ),
        pytest.param(
            facts(gang("Failed", 0, failure=EXITED), suspend=True),
            Phase.FAILED,
            "worker s-0 exited 1",
            Reason.WORKER_FAILED,
            False,
            None,
            id="job-slice-stopping-keeps-a-real-end",
        ),
        pytest.param(
            facts(gang("Failed", 0, failure=DELETED), suspend=True),
            Phase.SUSPENDED,
            "suspended",
            None,
            False,
            None,
            id="job-slice-stopping-its-deleted-pods-are-no-end",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), stopping=True),
            Phase.PENDING,
            "waiting for the job to start",
            None,
            False,
            None,
            id="stopping-not-started",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), standalone=True, waiting_for="no free pool: 0/1"),
            Phase.PENDING,
            "no free pool: 0/1",
            None,
            False,
            None,
            id="waiting-for-a-pool",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), draining=True),
            Phase.RESTARTING,
            "waiting for the previous attempt's pods to stop",
            None,
            False,
            None,
            id="blocked-by-draining",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2), blocked=True),
            Phase.RESTARTING,
            "waiting for the restart backoff",
            None,
            False,
            None,
            id="blocked-by-backoff",
        ),
        pytest.param(
            facts(gang("Failed", 0, failure=EXITED), standalone=True, blocked=True),
            Phase.RESTARTING,
            "waiting for the restart backoff",
            None,
            False,
            None,
            id="blocked-an-end-is-not-yet-an-outcome",
        ),
        pytest.param(
            facts(gang("Creating", 0, 2)),
            Phase.PENDING,
            "creating pods",
            None,
            False,
            None,
            id="all-to-create",
        ),
        pytest.param(
            facts(gang("Creating", 0, 1)),
            Phase.STARTING,
            "0/2 workers ready",
            None,
            False,
            None,
            id="some-created",
        ),
        pytest.param(
            facts(gang("Starting", 1), previous_phase=Phase.RUNNING, previous_attempt=2),
            Phase.RUNNING,
            "2 workers running, 1 ready",
            None,
            False,
            None,
            id="running-with-a-worker-not-ready-stays-running",
        ),
        pytest.param(
            facts(gang("Starting", 1), previous_phase=Phase.RUNNING, previous_attempt=1),
            Phase.STARTING,
            "1/2 workers ready",
            None,
            False,
            None,
            id="a-new-attempt-starts-again",
        ),
        pytest.param(
            facts(gang("Starting", 0, unschedulable=("s-1", "0/4 nodes are available"))),
            Phase.STARTING,
            "pod s-1 cannot be scheduled: 0/4 nodes are available",
            None,
            False,
            None,
            id="starting-unschedulable",
        ),
        pytest.param(
            facts(gang("Starting", 0, unseen="2026-01-01T00:00:00Z")),
            Phase.STARTING,
            NO_SCHEDULER,
            None,
            False,
            None,
            id="starting-no-scheduler-looked",
        ),
        pytest.param(
            facts(gang("Starting", 0, unseen="2026-01-01T00:00:50Z")),
            Phase.STARTING,
            "0/2 workers ready",
            None,
            False,
            20.0,
            id="starting-scheduler-grace-then-looks-again",
        ),
        pytest.param(
            facts(
                gang("Starting", 0, unseen="2026-01-01T00:00:00Z"),
                scheduler_looked_at=dt.datetime(2026, 1, 1, 0, 0, 50, tzinfo=dt.UTC),
            ),
            Phase.STARTING,
            "0/2 workers ready",
            None,
            False,
            None,  # no recheck of its own: woken when the scheduler goes quiet
            id="starting-scheduler-busy-with-other-pods",
        ),
        pytest.param(
            facts(
                gang("Starting", 0, unseen="2026-01-01T00:00:00Z"),
                scheduler_looked_at=dt.datetime(2026, 1, 1, 0, 0, 20, tzinfo=dt.UTC),
            ),
            Phase.STARTING,
            NO_SCHEDULER + ": it waits for the cluster's kube-scheduler (schedulerName "
            "default-scheduler) (which last looked at a pod of the operator's 40 s ago); "
            "check that such a scheduler runs, or set schedulerName to one that does",
            None,
            False,
            None,
            id="starting-scheduler-stopped-looking",
        ),
        pytest.param(
            facts(gang("Running")),
            Phase.RUNNING,
            "2 workers running",
            None,
            False,
            None,
            id="running",
        ),
    ],
)
def test_the_phase_and_message_of_a_slice(given, phase, message, failure, ended, recheck):
    decided = decide(given)
    assert decided.phase == phase
    if message == NO_SCHEDULER:
        assert decided.message.startswith(NO_SCHEDULER)
    else:
        assert decided.message == message
    if failure is None:
        assert decided.failure is None
    else:
        assert decided.failure is not None
        assert (decided.failure.reason, decided.failure.message) == (failure, message)
        assert decided.failure.attempt == 2
        assert decided.failure.time == "2026-01-01T00:01:00Z"
        # An invalid template is the spec's fault: it counts against no maxRestarts.
        assert decided.failure.counted is (failure != Reason.INVALID_POD_TEMPLATE)
    assert decided.ended == (given.gang.failure if ended else None)
    assert decided.recheck == (pytest.approx(recheck) if recheck is not None else None)


@pytest.mark.parametrize("outcome", ["Creating", "Starting", "Running"])
@pytest.mark.parametrize("to_create", [0, 1, 2])
@pytest.mark.parametrize("has_run", [False, True])
@pytest.mark.parametrize(("blocked", "draining"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("standalone", [False, True])
def test_an_attempt_that_goes_on_has_the_jobs_phase(
    outcome, to_create, has_run, blocked, draining, standalone
):
    """A slice and a job decide the phase of an attempt that goes on by one rule
    (``phase.of_attempt``): every combination of what it is decided from gives both the
    same phase."""
    state = gang(outcome, ready=0 if outcome == "Creating" else 2, to_create=to_create)
    given = facts(
        state,
        standalone=standalone,
        blocked=blocked,
        draining=draining,
        previous_phase=Phase.RUNNING if has_run else Phase.STARTING,
        previous_attempt=2,
    )
    job = of_attempt(has_run, outcome, state, draining, blocked and not draining)
    assert decide(given).phase == job


@pytest.mark.parametrize(
    ("phase", "message", "conflict", "provisioning", "expected"),
    [
        (Phase.RUNNING, "2 workers running", "", "", "2 workers running"),
        (
            Phase.RUNNING,
            "2 workers running",
            "Service s is not ours",
            "",
            "2 workers running; Service s is not ours",
        ),
        (Phase.PENDING, "", "Service s is not ours", "", "Service s is not ours"),
        # Once the slice ended, a conflict is no longer its news.
        (Phase.FAILED, "worker s-0 exited 1", "Service s is not ours", "", "worker s-0 exited 1"),
        (
            Phase.STARTING,
            "0/2 workers ready",
            "",
            "ProvisioningRequest s-2-0: Accepted",
            "0/2 workers ready; ProvisioningRequest s-2-0: Accepted",
        ),
        # Its request is said while its pods wait for capacity, not once they run.
        (
            Phase.RUNNING,
            "2 workers running",
            "",
            "ProvisioningRequest s-2-0: Provisioned",
            "2 workers running",
        ),
    ],
)
def test_the_message_says_a_service_conflict_and_the_provisioning_request(
    phase, message, conflict, provisioning, expected
):
    assert said(phase, message, conflict, provisioning) == expected


EARLIER = "2026-01-01T00:00:00Z"


def wire(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": EARLIER,
        "observedGeneration": 1,
    }


@pytest.mark.parametrize(
    ("given", "previous", "expected"),
    [
        pytest.param(
            {"phase": Phase.RUNNING},
            [],
            {"Ready": ("True", "Running", "up"), "Suspended": ("False", "Active", "")},
            id="running",
        ),
        pytest.param(
            {"phase": Phase.PENDING, "refused": Reason.PODS_FORBIDDEN},
            [],
            {"Ready": ("False", "PodsForbidden", "up"), "Suspended": ("False", "Active", "")},
            id="pods-refused-name-the-reason",
        ),
        pytest.param(
            {"phase": Phase.SUSPENDED, "suspend": True, "active": 2, "terminating": 1},
            [],
            {
                "Ready": ("False", "Suspended", "up"),
                "Suspended": ("True", "Suspended", ""),
                "PodsStopped": (
                    "False",
                    "PodsStopping",
                    "2 pods not yet marked for deletion, 1 terminating",
                ),
            },
            id="suspended-with-pods-left",
        ),
        pytest.param(
            {"phase": Phase.SUCCEEDED},
            [],
            {
                "Ready": ("False", "Succeeded", "up"),
                "Suspended": ("False", "Active", ""),
                "PodsStopped": ("True", "AllPodsStopped", "no pod of the slice is left"),
            },
            id="ended-nothing-left",
        ),
        pytest.param(
            {"phase": Phase.FAILED, "terminating": 4},
            [],
            {
                "Ready": ("False", "Failed", "up"),
                "Suspended": ("False", "Active", ""),
                "PodsStopped": (
                    "False",
                    "PodsStopping",
                    "0 pods not yet marked for deletion, 4 terminating",
                ),
            },
            id="ended-pods-terminating",
        ),
    ],
)
def test_the_conditions_of_a_slice(given, previous, expected):
    found = conditions(
        previous,
        phase=given["phase"],
        message="up",
        refused=given.get("refused"),
        suspend=given.get("suspend", False),
        active_pods=given.get("active", 0),
        terminating_pods=given.get("terminating", 0),
        now=NOW,
        generation=2,
    )
    assert {c["type"]: (c["status"], c["reason"], c["message"]) for c in found} == expected
    assert {c["observedGeneration"] for c in found} == {2}


def test_a_condition_keeps_its_transition_time_while_its_status_holds():
    previous = [wire("Ready", "True", "Running"), wire("Suspended", "False", "Active")]
    kept = conditions(
        previous,
        phase=Phase.RUNNING,
        message="still up",
        refused=None,
        suspend=False,
        active_pods=0,
        terminating_pods=0,
        now=NOW,
        generation=2,
    )
    assert [c["lastTransitionTime"] for c in kept] == [EARLIER, EARLIER]
    flipped = conditions(
        previous,
        phase=Phase.RESTARTING,
        message="",
        refused=None,
        suspend=True,
        active_pods=0,
        terminating_pods=0,
        now=NOW,
        generation=2,
    )
    assert {c["type"]: c["lastTransitionTime"] for c in flipped} == {
        "Ready": "2026-01-01T00:01:00Z",
        "Suspended": "2026-01-01T00:01:00Z",
        "PodsStopped": "2026-01-01T00:01:00Z",
    }
