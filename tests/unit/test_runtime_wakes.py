"""What the runtime's watch handlers wake, and which wakes are urgent: a pod event that
may end the gang's attempt is not held back by a large job's pacing, an ordinary one is;
a slice event that moved only its counters does not wake its job (``app.py``,
``reconcile/pacing.py``). The Runtime is built on a kubeconfig of an apiserver that is
never called."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakeapi import QueueRecorder
from tpu_operator import contract
from tpu_operator.app import OperatorConfig, Runtime
from tpu_operator.runtime.caches import identity_of
from tpu_operator.state.views import node_view, pod_view

pytestmark = pytest.mark.unit

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def owners(attempt: int = 1, **meta: Any) -> dict[str, Any]:
    """Indexes of TPUJob ml/j (at ``attempt``) and its slices j-0 and j-1, as kopf keeps
    them (``controllers.py``); ``meta`` goes into the metadata of each."""
    job = {
        "metadata": {"name": "j", "namespace": "ml", "uid": "u", **meta},
        "status": {"attempt": attempt},
    }
    slices = [
        {"metadata": {"name": f"j-{i}", "namespace": "ml", "uid": f"s{i}", **meta}} for i in (0, 1)
    ]
    return {
        "jobs": {("job", "ml", "j"): [job]},
        "slices": {("job", "ml", "j"): slices}
        | {("slice", "ml", s["metadata"]["name"]): [s] for s in slices},
    }


def started(path: Path, indexes: dict[str, Any]) -> Any:
    path.write_text(KUBECONFIG)
    runtime = Runtime(OperatorConfig(kubeconfig=str(path)), **indexes)
    runtime.acting = True
    runtime.jobs, runtime.slices = QueueRecorder(), QueueRecorder()  # type: ignore[assignment]
    return runtime


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    return started(tmp_path / "kubeconfig", owners())


def pod(name: str = "j-0-0", **status: Any) -> dict[str, Any]:
    deleting = status.pop("deletionTimestamp", None)
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"u-{name}",
            "labels": {
                contract.LABEL_SLICE_NAME: "j-0",
                contract.LABEL_JOB_NAME: "j",
                contract.LABEL_WORKER_INDEX: "0",
                contract.LABEL_RESTART_ATTEMPT: "1",
            },
            **({"deletionTimestamp": deleting} if deleting else {}),
        },
        "spec": {"nodeName": "n0"},
        "status": {"phase": "Running", **status},
    }


def new_pods(store: Any, slice_name: str, **meta: Any) -> list[dict[str, Any]]:
    """Two Pending pods of attempt 2 in job j's slice ``slice_name``, put in the pod store;
    ``meta`` goes into the metadata of each."""
    index = slice_name.rsplit("-", 1)[1]
    bodies = [pod(f"j-{index}-{i}", phase="Pending") for i in range(2)]
    for i, body in enumerate(bodies):
        body["metadata"].update(meta)
        labels = body["metadata"]["labels"]
        labels[contract.LABEL_SLICE_NAME] = slice_name
        labels[contract.LABEL_RESTART_ATTEMPT] = "2"
        labels[contract.LABEL_WORKER_INDEX] = str(i)
        labels[contract.LABEL_SLICE_INDEX] = index
        store.put(identity_of(body), pod_view(body))
    return bodies


@pytest.mark.parametrize(
    ("type_", "body", "urgent"),
    [
        ("MODIFIED", pod(conditions=[{"type": "Ready", "status": "True"}]), False),
        ("ADDED", pod(phase="Pending"), False),
        ("MODIFIED", pod(phase="Failed"), True),
        ("MODIFIED", pod(phase="Succeeded"), True),
        ("MODIFIED", pod(deletionTimestamp="2026-11-23T00:00:00Z"), True),
        ("DELETED", pod(), True),
    ],
)
def test_a_pod_event_wakes_its_slice_and_job_urgently_only_if_it_may_end_the_attempt(
    runtime: Any, type_: str, body: dict[str, Any], urgent: bool
) -> None:
    other = pod("j-0-1", phase="Pending")  # a pod of the gang that is not ready yet
    for stored in (other, body):
        view = pod_view(stored)
        assert view is not None
        runtime.pod_watch.store.put(identity_of(stored), view)
    if type_ == "DELETED":
        runtime.pod_watch.store.discard(identity_of(body))
    runtime.pod_event(type_, view)
    assert runtime.slices.calls == [(("ml", "j-0"), urgent)]
    assert runtime.jobs.calls == [(("ml", "j"), urgent)]
    assert runtime.jobs.routine == runtime.slices.routine == [not urgent]


def test_the_event_that_makes_the_last_pod_of_a_gang_ready_is_urgent(runtime: Any) -> None:
    # Routine progress waits for the queue's settle time; the job's move to Running
    # must not.
    ready = [{"type": "Ready", "status": "True"}]
    store = runtime.pod_watch.store
    bodies = [pod(f"j-0-{i}", phase="Pending") for i in range(2)]
    for body in bodies:
        store.put(identity_of(body), pod_view(body))
    seen = []
    for body in bodies:
        body["status"].update(phase="Running", conditions=ready)
        view = pod_view(body)
        store.put(identity_of(body), view)
        runtime.pod_event("MODIFIED", view)
        seen.append(runtime.jobs.calls[-1][1])
    assert seen == [False, True]
    assert runtime.caches.unready_pods("ml", "j", 1) == 0
    # A pod of the next attempt is counted apart.
    restarted = pod("j-0-0", phase="Pending")
    restarted["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] = "2"
    store.put(identity_of(restarted), pod_view(restarted))
    assert runtime.caches.unready_pods("ml", "j", 2) == 1
    assert runtime.caches.unready_pods("ml", "j", 1) == 0


def test_the_event_that_makes_the_last_pod_of_a_jobs_slice_ready_is_prompt_for_that_slice(
    runtime: Any,
) -> None:
    # A slice of an N-slice job settles routine progress up to 10 s; its move to Running
    # must not wait for that. Its job, still waiting for slice j-1, takes it as routine.
    ready = [{"type": "Ready", "status": "True"}]
    store = runtime.pod_watch.store
    bodies = [pod(f"j-0-{i}", phase="Pending") for i in range(2)]
    other = pod("j-1-0", phase="Pending")
    other["metadata"]["labels"][contract.LABEL_SLICE_NAME] = "j-1"
    for body in (*bodies, other):
        store.put(identity_of(body), pod_view(body))
    for body in bodies:
        body["status"].update(phase="Running", conditions=ready)
        view = pod_view(body)
        store.put(identity_of(body), view)
        runtime.pod_event("MODIFIED", view)
    assert runtime.slices.calls == [(("ml", "j-0"), False)] * 2
    assert runtime.slices.routine == [True, False], "the slice's last pod: not routine"
    assert runtime.jobs.calls == [(("ml", "j"), False)] * 2
    assert runtime.jobs.routine == [True, True], "the job still waits for j-1"
    assert runtime.caches.unready_in_slice("ml", "j-0", 1) == 0
    assert runtime.caches.unready_in_slice("ml", "j-1", 1) == 1
    assert runtime.caches.unready_pods("ml", "j", 1) == 1


@pytest.mark.parametrize(("ready", "urgent"), [("True", False), ("False", True)])
def test_a_node_event_is_urgent_for_its_pods_when_the_node_is_lost(
    runtime: Any, ready: str, urgent: bool
) -> None:
    body = pod()
    view = pod_view(body)
    assert view is not None
    runtime.pod_watch.store.put(identity_of(body), view)
    node = {
        "metadata": {"name": "n0"},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }
    runtime.node_event("MODIFIED", node_view(node))
    assert (("ml", "j"), urgent) in runtime.jobs.calls


def test_a_slice_event_wakes_its_job_only_when_more_than_counters_moved(runtime: Any) -> None:
    def body(ready: int, phase: str = "Starting") -> dict[str, Any]:
        return {
            "metadata": {"name": "j-0", "namespace": "ml", "uid": "s0", "generation": 1},
            "status": {"phase": phase, "readyWorkers": ready, "message": f"{ready}/64 ready"},
        }

    key = ("ml", "j-0")
    assert runtime.slice_news(key, "ADDED", body(0))
    assert not runtime.slice_news(key, "MODIFIED", body(5))
    assert not runtime.slice_news(key, None, body(9))  # a re-listing of the same state
    assert runtime.slice_news(key, "MODIFIED", body(64, "Running"))
    assert runtime.slice_news(key, "DELETED", body(64, "Running"))
    assert runtime.slice_news(key, "ADDED", body(0))  # a new slice of the same name


def test_an_event_that_only_shows_the_status_the_operator_wrote_asks_for_no_reconcile(
    runtime: Any,
) -> None:
    def body(generation: int = 1, phase: str = "Starting", **meta: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": "j", "namespace": "ml", "uid": "u", "generation": generation}
            | meta,
            "spec": {"numSlices": generation},
            "status": {"phase": phase},
        }

    key = ("ml", "j")
    assert runtime.asks("jobs", key, "ADDED", body())
    assert not runtime.asks("jobs", key, "MODIFIED", body(phase="Running"))  # its own write
    assert runtime.asks("jobs", key, None, body(phase="Running"))  # a listing always asks
    assert runtime.asks("jobs", key, "MODIFIED", body(generation=2))  # the spec changed
    assert runtime.asks("jobs", key, "MODIFIED", body(2, labels={"kueue.x-k8s.io/queue-name": "q"}))
    assert runtime.asks("jobs", key, "MODIFIED", body(2, deletionTimestamp="2026-11-23T00:00:00Z"))
    assert runtime.asks("slices", key, "MODIFIED", body(2))  # kinds are apart
    assert runtime.asks("jobs", key, "DELETED", body(2))
    assert runtime.asks("jobs", key, "MODIFIED", body(2))  # not seen since its deletion


def test_housekeeping_forgets_what_was_seen_of_objects_no_longer_cached(tmp_path: Path) -> None:
    runtime = started(tmp_path / "kubeconfig", {"slices": {}, "jobs": {}})
    meta = {"metadata": {"name": "j-0", "namespace": "ml", "uid": "s", "generation": 1}}
    runtime.asks("slices", ("ml", "j-0"), "ADDED", meta)
    runtime.slice_news(("ml", "j-0"), "ADDED", meta)
    runtime.asks("jobs", ("ml", "j"), "ADDED", {"metadata": {"uid": "u"}})
    runtime._forget_gone()  # nothing is cached: a watch gap deleted them all
    assert len(runtime._intents) == 0 and len(runtime._slices_seen) == 0


def test_a_restart_drain_is_routine_but_for_the_last_pod_which_wakes_every_slice(
    tmp_path: Path,
) -> None:
    # The job is at attempt 2; its two slices' pods of attempt 1 are being deleted.
    runtime = started(tmp_path / "kubeconfig", owners(attempt=2))
    store = runtime.pod_watch.store
    old = [pod(name, deletionTimestamp="2026-11-24T00:00:00Z") for name in ("j-0-0", "j-0-1")]
    old[1]["metadata"]["labels"][contract.LABEL_SLICE_NAME] = "j-1"
    for body in old:
        store.put(identity_of(body), pod_view(body))

    def event(type_: str, body: dict[str, Any]) -> list[tuple[tuple[str, str], bool]]:
        runtime.slices.calls.clear()
        if type_ == "DELETED":
            store.discard(identity_of(body))
        runtime.pod_event(type_, pod_view(body))
        return runtime.slices.calls

    assert event("MODIFIED", old[0]) == [(("ml", "j-0"), False)], "a stop the job ordered"
    assert event("DELETED", old[0]) == [(("ml", "j-0"), False)], "one of many going"
    assert runtime.jobs.calls[-1] == (("ml", "j"), False)
    # The last pod of attempt 1 goes: its own slice, its job and every slice of the job.
    assert event("DELETED", old[1]) == [
        (("ml", "j-1"), True),
        (("ml", "j-0"), True),
        (("ml", "j-1"), True),
    ]
    assert runtime.jobs.calls[-1] == (("ml", "j"), True)
    # A pod of the current attempt failing is urgent as ever.
    current = pod("j-0-0", phase="Failed")
    current["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] = "2"
    store.put(identity_of(current), pod_view(current))
    assert event("MODIFIED", current) == [(("ml", "j-0"), True)]


@pytest.mark.parametrize(
    ("status", "woken"),
    [
        ({"restartKind": "Recreate"}, [("j-0", True, False), ("j-1", True, False)]),
        (
            {"restartKind": "Mixed", "recreatedSlices": [1]},
            [("j-0", False, True), ("j-1", True, False)],
        ),
        (
            {"restartKind": "Mixed", "recreatedSlices": [0, 1]},
            [("j-0", True, False), ("j-1", True, False)],
        ),
    ],
    ids=["recreation", "mixed: slice 1 recreated, 0 kept", "mixed: both recreated"],
)
def test_the_last_old_pod_wakes_the_slices_that_create_pods_urgently_and_the_kept_routinely(
    tmp_path: Path, status: dict[str, Any], woken: list[tuple[str, bool, bool]]
) -> None:
    # Only the slices that create the attempt's pods wait for the barrier; a slice the
    # mixed restart keeps creates none, and its reconcile must not queue ahead of theirs.
    indexes = owners(attempt=2)
    indexes["jobs"][("job", "ml", "j")][0]["status"].update(status)
    for i, body in enumerate(indexes["slices"][("job", "ml", "j")]):
        body["spec"] = {"sliceIndex": i}
    runtime = started(tmp_path / "kubeconfig", indexes)
    store = runtime.pod_watch.store
    old = pod("j-1-0", deletionTimestamp="2026-11-24T00:00:00Z")
    old["metadata"]["labels"][contract.LABEL_SLICE_NAME] = "j-1"
    store.put(identity_of(old), pod_view(old))
    store.discard(identity_of(old))
    runtime.pod_event("DELETED", pod_view(old))  # the last pod of attempt 1
    wakes = list(zip(runtime.slices.calls, runtime.slices.routine, strict=True))
    assert wakes[0] == ((("ml", "j-1"), True), False), "its own slice, as any deletion"
    assert [(key[1], urgent, routine) for (key, urgent), routine in wakes[1:]] == woken
    assert runtime.jobs.calls == [(("ml", "j"), True)]


@pytest.mark.parametrize(
    ("meta", "gone"),
    [
        ({"deletionTimestamp": "2026-11-24T00:00:00Z"}, ()),
        ({}, ("jobs",)),
        ({}, ("jobs", "slices")),
    ],
    ids=["being deleted", "job gone", "job and slices gone"],
)
def test_a_pod_event_wakes_no_owner_that_is_gone_or_being_deleted(
    tmp_path: Path, meta: dict[str, Any], gone: tuple[str, ...]
) -> None:
    # A deleted job's pods go after it and its slices (the garbage collector): none of
    # their events has anything for a reconcile to do.
    indexes = owners(**meta) | {kind: {} for kind in gone}
    runtime = started(tmp_path / "kubeconfig", indexes)
    store = runtime.pod_watch.store
    body = pod(deletionTimestamp="2026-11-24T00:00:01Z")
    store.put(identity_of(body), pod_view(body))
    runtime.pod_event("MODIFIED", pod_view(body))
    store.discard(identity_of(body))
    runtime.pod_event("DELETED", pod_view(body))  # the last of its attempt
    # Only a slice whose job is gone but which is itself still cached hears of it.
    expected_slices = [(("ml", "j-0"), True)] * 2 if gone == ("jobs",) else []
    assert runtime.slices.calls == expected_slices
    assert runtime.jobs.calls == []


@pytest.mark.parametrize(
    ("owned", "num_slices", "settle"),
    [
        (False, None, 1.0),  # a standalone TPUSlice
        (True, None, 1.0),  # a job's slice without the field: one slice
        (True, 1, 1.0),
        (True, 4, 4.0),
        (True, 199, 10.0),  # at most MAX_SHARED_INTERVAL
    ],
)
def test_a_slice_of_a_multislice_job_settles_as_long_as_its_counter_writes_wait(
    tmp_path: Path, owned: bool, num_slices: int | None, settle: float
) -> None:
    """Routine progress of a slice of an N-slice job waits N times the settle time, at
    most 10 s (``pacing.shared_interval``), as long as its counter writes are held."""
    meta: dict[str, Any] = {"name": "s", "namespace": "ml", "uid": "s"}
    if owned:
        meta["ownerReferences"] = [
            {"kind": contract.JOB_KIND, "name": "j", "controller": True, "uid": "u"}
        ]
    body: dict[str, Any] = {"metadata": meta, "spec": {}}
    if num_slices is not None:
        body["spec"]["numSlices"] = num_slices
    runtime = started(
        tmp_path / "kubeconfig", {"jobs": {}, "slices": {("slice", "ml", "s"): [body]}}
    )
    assert runtime._slice_settle(("ml", "s")) == settle
    assert runtime._slice_settle(("ml", "gone")) == 1.0, "an uncached slice: the default"


def test_the_owners_of_pods_awaiting_a_scheduler_gone_quiet_are_woken_once_per_look(
    runtime: Any,
) -> None:
    """While the scheduler keeps looking at other pods, nothing waiting for it looks again
    on a timer of its own (``state/gang.scheduler_wait``); once it has been quiet for
    ``SCHEDULER_GRACE_SECONDS`` the slices and jobs of the pods still awaiting it are
    woken to report it, once, and again only after a later look goes quiet too."""
    store = runtime.pod_watch.store
    waiting = pod("j-0-0", phase="Pending")
    waiting["spec"] = {}
    placed = pod("j-0-1", phase="Pending")
    for body in (waiting, placed):
        store.put(identity_of(body), pod_view(body))
    assert [p.name for p in runtime.caches.awaiting("default-scheduler")] == ["j-0-0"]
    looked = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    awaited = pod_view(dict(placed, spec={}))
    runtime.caches.schedulers.replaced(awaited, pod_view(placed), looked)  # bound: a look
    runtime.wake_awaiting(looked + dt.timedelta(seconds=29))
    assert runtime.slices.calls == runtime.jobs.calls == []
    runtime.wake_awaiting(looked + dt.timedelta(seconds=30))
    assert runtime.slices.keys == [("ml", "j-0")]
    assert runtime.jobs.keys == [("ml", "j")]
    runtime.wake_awaiting(looked + dt.timedelta(seconds=90))
    assert len(runtime.slices.calls) == len(runtime.jobs.calls) == 1
    again = looked + dt.timedelta(seconds=100)
    runtime.caches.schedulers.replaced(awaited, pod_view(placed), again)
    runtime.wake_awaiting(again + dt.timedelta(seconds=30))
    assert len(runtime.slices.calls) == len(runtime.jobs.calls) == 2
    # Placed at last: nothing awaits the scheduler, and nothing is woken.
    store.put(identity_of(waiting), pod_view(pod("j-0-0", phase="Pending")))
    assert runtime.caches.awaiting("default-scheduler") == []
    last = again + dt.timedelta(seconds=60)
    runtime.caches.schedulers.replaced(awaited, pod_view(placed), last)
    runtime.wake_awaiting(last + dt.timedelta(seconds=30))
    assert len(runtime.slices.calls) == len(runtime.jobs.calls) == 2


@pytest.mark.parametrize(
    ("status", "slice_name", "urgent"),
    [
        ({"phase": "Starting", "restartKind": "Mixed", "recreatedSlices": [1]}, "j-1", True),
        ({"phase": "Running", "restartKind": "Mixed", "recreatedSlices": [1]}, "j-1", False),
        ({"phase": "Starting", "restartKind": "InPlace"}, "j-1", False),
        ({"phase": "Starting", "restartKind": "Mixed", "recreatedSlices": [1]}, "j-0", False),
        ({"phase": "Starting", "restartKind": "Recreate"}, "j-1", False),
    ],
    ids=["mixed, recreated slice", "job Running", "in place", "a kept slice", "recreation"],
)
def test_the_last_pod_of_a_recreated_slice_to_run_lifts_the_in_place_barrier_at_once(
    tmp_path: Path, status: dict[str, Any], slice_name: str, urgent: bool
) -> None:
    # A mixed restart starts every process of the attempt once the recreated slices' new
    # pods run; they do not turn ready before that start (their supervisors wait for it),
    # so the event that makes the last one run is what the job must not settle.
    indexes = owners(attempt=2)
    indexes["jobs"][("job", "ml", "j")][0]["status"].update(status)
    runtime = started(tmp_path / "kubeconfig", indexes)
    store = runtime.pod_watch.store
    bodies = new_pods(store, slice_name)
    assert runtime.caches.unstarted_in_slice("ml", slice_name, 2) == 2
    seen = []
    for i, body in enumerate(bodies):
        body["status"].update(phase="Running", podIP=f"10.0.0.{i + 1}")
        view = pod_view(body)
        store.put(identity_of(body), view)
        runtime.pod_event("MODIFIED", view)
        seen.append((runtime.jobs.calls[-1][1], runtime.jobs.at_once[-1]))
    assert runtime.caches.unstarted_in_slice("ml", slice_name, 2) == 0
    assert runtime.caches.unready_in_slice("ml", slice_name, 2) == 2  # none is ready
    # Urgent, and at once: a job of thousands of pods does not wait for its spacing.
    assert seen == [(False, False), (urgent, urgent)]


def test_the_barrier_lifts_at_once_though_the_new_pods_look_like_stopped_processes(
    tmp_path: Path,
) -> None:
    # A new pod whose supervisor waits for the start turned not ready in the second its
    # container started: to the gang it looks like a process that stopped, which makes
    # each of its events urgent. The last one to run still lifts the barrier at once.
    indexes = owners(attempt=2)
    indexes["jobs"][("job", "ml", "j")][0]["status"].update(
        {"phase": "Starting", "restartKind": "Mixed", "recreatedSlices": [1]}
    )
    runtime = started(tmp_path / "kubeconfig", indexes)
    store = runtime.pod_watch.store
    bodies = new_pods(store, "j-1", annotations={contract.ANNOTATION_SUPERVISED: "true"})
    seen = []
    for i, body in enumerate(bodies):
        at = "2026-12-07T10:00:00Z"
        body["status"].update(
            phase="Running",
            podIP=f"10.0.0.{i + 1}",
            conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": at}],
            containerStatuses=[
                {"name": contract.WORKER_CONTAINER, "state": {"running": {"startedAt": at}}}
            ],
        )
        view = pod_view(body)
        assert view.process_stopped
        store.put(identity_of(body), view)
        runtime.pod_event("MODIFIED", view)
        seen.append((runtime.jobs.calls[-1][1], runtime.jobs.at_once[-1]))
    assert seen == [(True, False), (True, True)]
