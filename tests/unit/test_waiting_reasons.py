"""A job whose children the apiserver or a scheduler will never act on says so.

- The apiserver refuses the job's TPUSlices: an admission policy or a quota (retried, the
  status names the cause), or the slice is invalid (the job fails with the apiserver's
  message, naming the field).
- No scheduler looks at the worker pods (their ``schedulerName`` names none that runs):
  after ``SCHEDULER_GRACE_SECONDS`` the status names the scheduler they wait for.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.fakeapi import T0, FakeCluster
from tpu_operator import contract
from tpu_operator.runtime.kube import ApiError
from tpu_operator.state.gang import (
    SCHEDULER_GRACE_SECONDS,
    Unseen,
    assess,
    members_of,
    scheduler_wait,
)
from tpu_operator.state.views import pod_view

pytestmark = pytest.mark.unit


def job_spec(**template_spec: Any) -> dict[str, Any]:
    return {
        "slice": {"type": "v5litepod-4"},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}], **template_spec}},
    }


def condition(cluster: FakeCluster, type_: str, name: str = "j") -> dict[str, Any]:
    return next(c for c in cluster.job(name)["status"]["conditions"] if c["type"] == type_)


@pytest.mark.parametrize(
    ("unseen", "waited", "said", "recheck"),
    [
        (None, 0.0, None, None),
        (Unseen("p-0", "default-scheduler", "2026-01-01T00:00:00Z"), 10.0, None, 20.0),
        (Unseen("p-0", "default-scheduler", "2026-01-01T00:00:00Z"), 30.0, "kube-scheduler", None),
        (Unseen("p-0", "volcano", "2026-01-01T00:00:00Z"), 45.0, "named 'volcano'", None),
        (Unseen("p-0", "volcano", None), 1000.0, None, SCHEDULER_GRACE_SECONDS),
    ],
)
def test_scheduler_wait(unseen, waited: float, said: str | None, recheck: float | None):
    message, again = scheduler_wait(unseen, T0 + dt.timedelta(seconds=waited))
    assert again == recheck
    if said is None:
        assert message is None
    else:
        assert message is not None and said in message and "p-0" in message
        assert f"in {waited:.0f} s" in message


def pod(name: str, **status_and_spec: Any) -> Any:
    body = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": name,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                contract.LABEL_SLICE_NAME: "s",
                contract.LABEL_WORKER_INDEX: name[-1],
                contract.LABEL_RESTART_ATTEMPT: "1",
            },
        },
        "spec": status_and_spec.get("spec", {"schedulerName": "volcano"}),
        "status": status_and_spec.get("status", {"phase": "Pending"}),
    }
    return pod_view(body)


@pytest.mark.parametrize(
    ("pods", "unseen"),
    [
        # No scheduler has looked at either pod: the first one is named.
        ([pod("s-0"), pod("s-1")], "s-0"),
        # A scheduler found no room for one: it looks at them (not missing).
        (
            [
                pod("s-0"),
                pod(
                    "s-1",
                    status={
                        "phase": "Pending",
                        "conditions": [
                            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                        ],
                    },
                ),
            ],
            None,
        ),
        # One runs on a node: a scheduler works through a backlog.
        ([pod("s-0"), pod("s-1", spec={"nodeName": "n1"}, status={"phase": "Running"})], None),
        # Gated pods carry a PodScheduled condition (the apiserver's): not missing either.
        (
            [
                pod(
                    "s-0",
                    status={
                        "phase": "Pending",
                        "conditions": [
                            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
                        ],
                    },
                ),
                pod(
                    "s-1",
                    status={
                        "phase": "Pending",
                        "conditions": [
                            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
                        ],
                    },
                ),
            ],
            None,
        ),
    ],
)
def test_a_gang_names_a_pod_no_scheduler_looked_at(pods: list[Any], unseen: str | None):
    state = assess(attempt=1, members=members_of("s", 0, 2), pods=pods)
    assert (state.unseen.pod if state.unseen else None) == unseen
    if unseen:
        assert state.unseen is not None and state.unseen.scheduler == "volcano"


def test_pods_no_scheduler_looks_at_are_named_with_the_scheduler_they_wait_for():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec(schedulerName="volcano"))
    cluster.settle()  # the pods exist; nothing schedules them
    status = cluster.job("j")["status"]
    assert status["phase"] == "Starting"
    assert "scheduler" not in status["message"]
    requeue = cluster.reconcile_job("j")
    assert requeue is not None and requeue <= SCHEDULER_GRACE_SECONDS
    cluster.advance(SCHEDULER_GRACE_SECONDS)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert "no scheduler has looked at pod j-0-0" in status["message"]
    assert "named 'volcano'" in status["message"]
    scheduled = condition(cluster, "PodsScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "NoScheduler")
    assert cluster.recorded.reasons("j").count("NoScheduler") == 1
    slice_status = cluster.slice("j-0")["status"]
    assert "named 'volcano'" in slice_status["message"]
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    assert condition(cluster, "PodsScheduled")["status"] == "True"


def test_slices_the_apiserver_forbids_are_named_and_retried_until_allowed():
    cluster = FakeCluster()
    cluster.refusing[f"/{contract.SLICE_PLURAL}"] = ApiError(
        "POST",
        "/tpuslices",
        403,
        "Forbidden",
        'tpuslices.tpu-operator.dev "j-0" is forbidden: exceeded quota: slices, '
        "requested: count/tpuslices.tpu-operator.dev=1, used: 4, limited: 4",
    )
    cluster.apply_job("j", job_spec())
    cluster.reconcile_job("j")  # commits attempt 1; its slice write is refused
    requeue = cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending"
    assert "the apiserver refuses the job's TPUSlices" in status["message"]
    assert "exceeded quota: slices" in status["message"]
    scheduled = condition(cluster, "PodsScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "SliceCreationFailed")
    assert requeue == 30.0
    assert cluster.recorded.reasons("j").count("SliceCreationFailed") == 1
    cluster.refusing.clear()  # the quota is raised
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    assert condition(cluster, "PodsScheduled")["status"] == "True"


def test_a_slice_the_apiserver_rejects_as_invalid_fails_the_job_once_naming_the_field():
    cluster = FakeCluster()
    cluster.refusing[f"/{contract.SLICE_PLURAL}"] = ApiError(
        "POST",
        "/tpuslices",
        422,
        "Invalid",
        'TPUSlice.tpu-operator.dev "j-0" is invalid: spec.template.spec.volumes[0].name: '
        'Invalid value: "Data": a lowercase RFC 1123 label must consist of ...',
    )
    cluster.apply_job("j", job_spec())
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert "spec.template.spec.volumes[0].name" in status["message"]
    assert condition(cluster, "Failed")["reason"] == "InvalidSpec"
    assert cluster.recorded.reasons("j").count("Failed") == 1
    assert not cluster.pods()


def test_a_job_that_waits_longer_than_its_timeout_fails_saying_what_for():
    cluster = FakeCluster()
    cluster.add_pool("p1", "tpu-v5p-slice", "2x2x2", hosts=2)
    spec = {
        "slice": {"type": "v5p-16"},
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
    }
    cluster.apply_job("holder", spec)
    cluster.settle()
    cluster.apply_job("j", {**spec, "waitingTimeoutSeconds": 60})
    requeue = cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["phase"] == "Pending"
    assert requeue is not None and requeue <= 60
    cluster.advance(61)
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert condition(cluster, "Failed")["reason"] == "WaitingTimeout"
    assert "p1 is held by TPUJob ml/holder" in status["message"]
    assert cluster.job("holder")["status"]["nodePools"] == ["p1"]
