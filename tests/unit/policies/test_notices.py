"""Maintenance notices on a running job's nodes (``policies/notices.py``)."""

from __future__ import annotations

import pytest

from tests.unit.policies.world import World, at, facts, plan_of, reasons
from tpu_operator.policies import notices
from tpu_operator.progress.samples import WorkerSample
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.state.views import pod_view

pytestmark = pytest.mark.unit


def worker(attempt: int, job: str = "j") -> object:
    return pod_view(
        {
            "metadata": {
                "name": f"{job}-0-0",
                "namespace": "ml",
                "uid": f"{job}{attempt}",
                "labels": {
                    "tpu-operator.dev/slice-name": f"{job}-0",
                    "tpu-operator.dev/job-name": job,
                    "tpu-operator.dev/restart-attempt": str(attempt),
                },
            },
            "spec": {"nodeName": "n0"},
            "status": {"phase": "Running"},
        }
    )


def training() -> JobTrack:
    track = JobTrack(attempt=1)
    track.observe(track.worker("j-0-0", 0, 0, "n0"), WorkerSample(at=at(90).timestamp(), step=3))
    return track


NOTICE = "attempt 1: maintenance at 12:00"


@pytest.mark.parametrize(
    ("on_node", "seen", "track", "asked", "sent"),
    [
        ([worker(1)], [], training(), True, [NOTICE]),
        # Asked once: counted and said once; while it stands, the same request (its id
        # is the notice's) goes again to the workers that did not acknowledge it.
        ([worker(1)], [NOTICE], training(), False, [NOTICE]),
        ([worker(0)], [NOTICE], training(), False, []),  # stands on another attempt's pod
        ([worker(0)], [], training(), False, []),  # a pod of another attempt
        ([worker(1, "k")], [], training(), False, []),  # another job's pod
        ([worker(1)], [], None, False, []),  # not training yet: asked once it is
    ],
)
def test_a_new_notice_asks_for_one_checkpoint(on_node, seen, track, asked, sent):
    job = facts(recorded={"attempt": 1, "disruptionNotices": seen}, track=track)
    plan = plan_of(job)
    world = World(noticed={"n0": "maintenance at 12:00"}, on_node={"n0": on_node})
    notices.checkpoint_on_notices(job, plan, world, 1)
    assert plan.checkpoint_for == sent
    assert plan.status.checkpoint_requests == int(asked)
    assert reasons(plan) == (["CheckpointRequested"] if asked else [])


def saved_in(seconds: float) -> JobTrack:
    track = training()
    track.observe(
        track.worker("j-0-0", 0, 0, "n0"),
        WorkerSample(at=at(95).timestamp(), step=4, phases={"checkpoint_save": seconds}),
    )
    return track


@pytest.mark.parametrize(
    ("ends_in", "track", "asked", "wake"),
    [
        # A VM taken back in 10 minutes: no request yet, a wake-up when the lead begins.
        (600.0, training(), False, 600.0 - notices.TERMINATION_LEAD_SECONDS),
        # Within the lead: the workers checkpoint now.
        (100.0, training(), True, None),
        # A checkpoint that took 100 s widens the lead to 230 s.
        (200.0, saved_in(100.0), True, None),
        (300.0, saved_in(100.0), False, 300.0 - 230.0),
        # Not training yet: asked once steps are seen.
        (100.0, None, False, None),
    ],
)
def test_a_vm_that_says_when_it_ends_asks_for_a_checkpoint_ahead(ends_in, track, asked, wake):
    job = facts(recorded={"attempt": 1, "nodePools": ["p1"]}, track=track)
    plan = plan_of(job)
    world = World(terminating={"n0": at(100 + ends_in).timestamp()}, on_node={"n0": [worker(1)]})
    notices.checkpoint_on_notices(job, plan, world, 1)
    assert bool(plan.checkpoint_for) is asked
    if asked:
        ((_, reason, message),) = plan.events
        assert reason == "CheckpointRequested"
        assert "node.gke.io/machine-termination-datetime" in message
        assert at(100 + ends_in).strftime("%Y-%m-%dT%H:%M:%SZ") in message
    if wake is None:
        assert plan.requeue is None
    else:
        assert plan.requeue == pytest.approx(wake)


def test_a_termination_notice_is_asked_once():
    job = facts(recorded={"attempt": 1, "nodePools": ["p1"]}, track=training())
    world = World(terminating={"n0": at(150).timestamp()}, on_node={"n0": [worker(1)]})
    first = plan_of(job)
    notices.checkpoint_on_notices(job, first, world, 1)
    again = facts(
        recorded={"attempt": 1, "nodePools": ["p1"], "disruptionNotices": first.checkpoint_for},
        track=training(),
    )
    second = plan_of(again)
    notices.checkpoint_on_notices(again, second, world, 1)
    # Counted and said once; sent again under the same id while it stands.
    assert first.checkpoint_for and second.checkpoint_for == first.checkpoint_for
    assert (first.status.checkpoint_requests, second.status.checkpoint_requests) == (1, 0)
    assert (reasons(first), reasons(second)) == (["CheckpointRequested"], [])


def test_a_notice_on_every_node_of_a_large_slice_asks_once():
    # 64 VMs tainted a few seconds apart: one kind of notice, one request, however many
    # reconciles follow (status keeps at most MAX_NOTICES entries).
    nodes = {
        f"n{i}": f"impending termination (taint t since 2026-11-27T10:00:{i % 60:02d}Z)"
        for i in range(64)
    }
    on_node = {n: [worker(1)] for n in nodes}
    world = World(noticed=nodes, on_node=on_node)
    recorded: dict = {"attempt": 1, "disruptionNotices": []}
    asked, sent = 0, []
    for _ in range(3):
        job = facts(recorded=recorded, track=training())
        plan = plan_of(job)
        notices.checkpoint_on_notices(job, plan, world, 1)
        asked += plan.status.checkpoint_requests
        sent.append(plan.checkpoint_for)
        recorded = {"attempt": 1, "disruptionNotices": plan.status.disruption_notices}
    assert asked == 1
    assert sent == [["attempt 1: impending termination (taint t)"]] * 3  # one id throughout
    assert recorded["disruptionNotices"] == ["attempt 1: impending termination (taint t)"]


def test_the_event_names_one_node_and_counts_the_others():
    nodes = {
        "a": "impending termination (taint t since 1)",
        "b": "impending termination (taint t since 2)",
    }
    world = World(noticed=nodes, on_node={"a": [worker(1)], "b": [worker(1)]})
    job = facts(recorded={"attempt": 1}, track=training())
    plan = plan_of(job)
    notices.checkpoint_on_notices(job, plan, world, 1)
    ((_, _, message),) = plan.events
    assert message.endswith("node a: impending termination (taint t since 1) (and 1 more nodes)")


def test_a_new_attempt_takes_a_notice_again():
    world = World(noticed={"n0": "maintenance at 12:00"}, on_node={"n0": [worker(2)]})
    job = facts(
        recorded={"attempt": 2, "disruptionNotices": ["attempt 1: maintenance at 12:00"]},
        track=training(),
    )
    plan = plan_of(job)
    notices.checkpoint_on_notices(job, plan, world, 2)
    assert plan.checkpoint_for == ["attempt 2: maintenance at 12:00"]
