"""A spec the operator's models cannot read: reported once, never retried in a loop.

The apiserver's CEL rules reject such objects before they are stored, so the case cannot
be produced on the real control plane (only by an object stored under an older schema);
the API client here is a recording stand-in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tpu_operator import contract
from tpu_operator.reconcile.context import Context, mark_invalid
from tpu_operator.reconcile.jobs import JobReconciler

pytestmark = pytest.mark.unit


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((path, patch))
        return {}


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def emit(self, ref: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


class OneJob:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.body


def test_unreadable_job_is_failed_with_a_reason_once():
    body = {
        "metadata": {
            "name": "old",
            "namespace": "ml",
            "uid": "u",
            "generation": 3,
            "resourceVersion": "7",
        },
        "spec": {"slice": {"type": "v5p-100"}, "template": {"spec": {"containers": []}}},
    }
    kube, events = RecordingKube(), RecordingEvents()
    ctx = Context(kube=kube, caches=OneJob(body), events=events, jobs=None, slices=None)  # type: ignore[arg-type]
    assert asyncio.run(JobReconciler(ctx)(("ml", "old"))) is None  # no retry
    path, patch = kube.patches[0]
    assert path.endswith(f"/{contract.JOB_PLURAL}/old/status")
    assert patch["metadata"] == {"resourceVersion": "7"}
    status = patch["status"]
    assert status["phase"] == "Failed" and "invalid spec" in status["message"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Invalid": "True",
        "Failed": "True",
    }
    assert events.events[0][:2] == ("Warning", "Invalid")
    # once recorded, the same problem writes and posts nothing more
    body["status"] = status
    asyncio.run(JobReconciler(ctx)(("ml", "old")))
    assert len(kube.patches) == 1 and len(events.events) == 1
    # a different problem is reported
    asyncio.run(mark_invalid(ctx, body, contract.JOB_PLURAL, ValueError("another")))
    assert len(kube.patches) == 2 and events.events[1][2] == "invalid spec: another"
