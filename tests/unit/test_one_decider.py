"""A standalone TPUSlice is decided as a TPUJob of one slice: the same story, told to each
through the operator's reconcilers over the in-memory API of ``tests/unit/fakeapi.py``,
ends in the same attempt, phase, restarts, running pods and ``Suspended`` condition after
every step.

Each row is one story: steps on worker 0 of a two-host slice (``v5p-16``), the spec's
``suspend``, the kubelets confirming deletions. Both run the job's policies: the resume
rule (``start.resumes``), the failure rule (``failure.book``), a finished job's
(``lifetime.finished``: it stays as it ended, its pods stopped)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakeapi import FakeCluster
from tests.unit.test_reconcilers import V5P, job_spec, slice_spec

pytestmark = pytest.mark.unit

Step = tuple[str, Any]


class Told:
    """One story told to a TPUJob ``j`` or a standalone TPUSlice ``s`` (two hosts)."""

    def __init__(self, kind: str, spec: dict[str, Any]) -> None:
        self.kind = kind
        self.cluster = FakeCluster()
        self.cluster.add_pool("p1", *V5P, hosts=2)
        self.cluster.add_pool("p2", *V5P, hosts=2)
        if kind == "job":
            self.cluster.apply_job("j", job_spec("v5p-16", **spec))
        else:
            self.cluster.apply_slice("s", slice_spec("v5p-16", **spec))
        self.cluster.settle()

    @property
    def body(self) -> dict[str, Any]:
        return self.cluster.job("j") if self.kind == "job" else self.cluster.slice("s")

    def worker(self, index: int) -> str:
        return f"j-0-{index}" if self.kind == "job" else f"s-{index}"

    def step(self, step: Step) -> None:
        what, arg = step
        cluster = self.cluster
        if what == "run":
            cluster.run_pods()
        elif what == "exit":
            cluster.exit_pod(self.worker(0), arg)
        elif what == "suspend":
            self.body["spec"]["suspend"] = arg
            self.body["metadata"]["generation"] += 1
        elif what == "confirm":
            cluster.confirm_deletions()
        elif what == "wait":
            cluster.advance(arg)
        cluster.settle()

    def seen(self) -> tuple[int, str, int, int, str]:
        """(attempt, phase, restarts, pods still running and not being deleted, the
        Suspended condition)."""
        status = self.body["status"]
        suspended = next(
            (c["status"] for c in status.get("conditions", []) if c["type"] == "Suspended"), ""
        )
        running = [
            p
            for p in self.cluster.pods().values()
            if p["status"]["phase"] in ("Pending", "Running")
            and not p["metadata"].get("deletionTimestamp")
        ]
        return (
            status.get("attempt", 0),
            status["phase"],
            status.get("restarts", 0),
            len(running),
            suspended,
        )


STORIES: list[tuple[str, dict[str, Any], list[Step], list[tuple[int, str, int, int, str]]]] = [
    (
        "created-suspended-then-resumed",
        {"suspend": True},
        [("suspend", False), ("run", None)],
        [(1, "Starting", 0, 2, "False"), (1, "Running", 0, 2, "False")],
    ),
    (
        "suspended-and-resumed-is-a-new-attempt-not-a-restart",
        {},
        [("run", None), ("suspend", True), ("confirm", None), ("suspend", False), ("run", None)],
        [
            (1, "Running", 0, 2, "False"),
            (1, "Suspended", 0, 0, "True"),
            (1, "Suspended", 0, 0, "True"),
            (2, "Starting", 0, 2, "False"),
            (2, "Running", 0, 2, "False"),
        ],
    ),
    (
        "failed-for-good-stops-the-worker-still-running",
        {"failurePolicy": {"maxRestarts": 0}},
        [("run", None), ("exit", 1), ("confirm", None)],
        [(1, "Running", 0, 2, "False"), (1, "Failed", 0, 0, "False"), (1, "Failed", 0, 0, "False")],
    ),
    (
        "failed-for-good-stays-failed-through-suspend-and-resume",
        {"failurePolicy": {"maxRestarts": 0}},
        [("run", None), ("exit", 1), ("confirm", None), ("suspend", True), ("suspend", False)],
        [
            (1, "Running", 0, 2, "False"),
            (1, "Failed", 0, 0, "False"),
            (1, "Failed", 0, 0, "False"),
            (1, "Failed", 0, 0, "False"),
            (1, "Failed", 0, 0, "False"),
        ],
    ),
    (
        "a-failure-restarts-after-the-backoff",
        {"failurePolicy": {"backoffSeconds": 5}},
        [("run", None), ("exit", 1), ("confirm", None), ("wait", 5), ("run", None)],
        [
            (1, "Running", 0, 2, "False"),
            (2, "Restarting", 1, 0, "False"),
            (2, "Restarting", 1, 0, "False"),
            (2, "Starting", 1, 2, "False"),
            (2, "Running", 1, 2, "False"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("spec", "steps", "expected"),
    [pytest.param(spec, steps, expected, id=name) for name, spec, steps, expected in STORIES],
)
def test_a_standalone_slice_is_decided_as_a_job_of_one_slice(spec, steps, expected):
    job, alone = Told("job", spec), Told("slice", spec)
    for step, wanted in zip(steps, expected, strict=True):
        job.step(step)
        alone.step(step)
        assert (step, job.seen()) == (step, wanted)
        assert (step, alone.seen()) == (step, wanted)


@pytest.mark.parametrize("kind", ["job", "slice"])
def test_the_pool_of_a_job_or_slice_that_failed_for_good_goes_to_the_next_job(kind):
    """Its worker that still ran is stopped, so the pool it held is free: the next job
    runs on it at once (a standalone slice's worker used to run on and hold it)."""
    told = Told(kind, {"failurePolicy": {"maxRestarts": 0}})
    told.step(("run", None))
    told.step(("exit", 1))
    told.step(("confirm", None))
    cluster = told.cluster
    cluster.apply_job("next", job_spec("v5p-16"))
    cluster.settle()
    held = told.body["status"].get("nodePool") or told.body["status"].get("nodePools")
    assert not held
    taken = cluster.job("next")["status"]["nodePools"]
    assert taken in (["p1"], ["p2"])
    free = {"p1", "p2"} - set(taken)
    cluster.apply_job("third", job_spec("v5p-16"))
    cluster.settle()
    assert cluster.job("third")["status"]["nodePools"] == sorted(free)
