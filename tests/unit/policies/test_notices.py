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


@pytest.mark.parametrize(
    ("on_node", "seen", "track", "asked"),
    [
        ([worker(1)], [], training(), True),
        ([worker(1)], ["node n0: maintenance at 12:00"], training(), False),  # asked once
        ([worker(0)], [], training(), False),  # a pod of another attempt
        ([worker(1, "k")], [], training(), False),  # another job's pod
        ([worker(1)], [], None, False),  # not training yet: asked once it is
    ],
)
def test_a_new_notice_asks_for_one_checkpoint(on_node, seen, track, asked):
    job = facts(recorded={"attempt": 1, "disruptionNotices": seen}, track=track)
    plan = plan_of(job)
    world = World(noticed={"n0": "maintenance at 12:00"}, on_node={"n0": on_node})
    notices.checkpoint_on_notices(job, plan, world, 1)
    assert bool(plan.checkpoint_for) is asked
    assert plan.status.checkpoint_requests == int(asked)
    assert reasons(plan) == (["CheckpointRequested"] if asked else [])
