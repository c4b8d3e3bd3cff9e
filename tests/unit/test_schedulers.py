"""When each scheduler last looked at a pod of the operator's (``runtime/caches.Schedulers``):
a look is a pod seen awaiting a scheduler and then no longer awaiting it."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tpu_operator.runtime.caches import Schedulers
from tpu_operator.state.views import PodView

pytestmark = pytest.mark.unit

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
WAITING = PodView(
    name="j-0-0", namespace="ml", uid="u", job_name="j", slice_name="j-0", slice_index=0,
    worker_index=0, attempt=1, phase="Pending", ready=False, deletion_deadline=None,
    node=None, pool=None, pod_ip=None, exit_code=None, exit_reason=None, disruption=None,
    unschedulable=None, created="2026-01-01T00:00:00Z", started=None, finished=None,
    awaiting_scheduler="default-scheduler",
)  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "looked"),
    [
        pytest.param(WAITING, {"awaiting_scheduler": None, "node": "n1"}, AT, id="bound"),
        pytest.param(
            WAITING,
            {"awaiting_scheduler": None, "unschedulable": "0/4 nodes are available"},
            AT,
            id="found-unschedulable",
        ),
        pytest.param(
            WAITING,
            {"awaiting_scheduler": None, "deletion_deadline": "2026-01-01T00:00:30Z"},
            None,
            id="deleted-while-waiting-is-no-look",
        ),
        pytest.param(WAITING, {"ready": True}, None, id="still-waiting"),
        pytest.param(
            dataclasses.replace(WAITING, awaiting_scheduler=None, node="n1"),
            {"phase": "Running"},
            None,
            id="already-placed",
        ),
    ],
)
def test_a_scheduler_looked_when_a_pod_stopped_awaiting_it(old, new, looked):
    schedulers = Schedulers()
    schedulers.replaced(old, dataclasses.replace(old, **new), AT)
    assert schedulers.looked_at("default-scheduler") == looked


def test_each_scheduler_has_its_own_last_look():
    schedulers = Schedulers()
    volcano = dataclasses.replace(WAITING, awaiting_scheduler="volcano")
    later = AT + dt.timedelta(seconds=5)
    schedulers.replaced(WAITING, dataclasses.replace(WAITING, awaiting_scheduler=None), AT)
    schedulers.replaced(volcano, dataclasses.replace(volcano, awaiting_scheduler=None), later)
    assert schedulers.looked_at("default-scheduler") == AT
    assert schedulers.looked_at("volcano") == later
    assert schedulers.looked_at("yunikorn") is None


def test_a_scheduler_gone_quiet_is_named_once_per_look():
    schedulers = Schedulers()
    bound = dataclasses.replace(WAITING, awaiting_scheduler=None, node="n1")
    assert schedulers.gone_quiet(AT + dt.timedelta(hours=1)) == []  # never looked: no timer here
    schedulers.replaced(WAITING, bound, AT)
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=29.9)) == []
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=30)) == ["default-scheduler"]
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=300)) == []
    later = AT + dt.timedelta(seconds=120)
    schedulers.replaced(WAITING, bound, later)
    assert schedulers.gone_quiet(later + dt.timedelta(seconds=10)) == []
    assert schedulers.gone_quiet(later + dt.timedelta(seconds=31)) == ["default-scheduler"]


def test_from_the_start_of_watching_every_scheduler_counts_as_having_looked():
    """An operator (re)started in the middle of a backlog has seen no look yet: its pods'
    wait counts from the start, and 30 s later the schedulers still awaited and not seen
    looking since are named once."""
    schedulers = Schedulers()
    schedulers.watching(AT)
    assert schedulers.looked_at("default-scheduler") == AT
    assert schedulers.looked_at("volcano") == AT
    bound = dataclasses.replace(WAITING, awaiting_scheduler=None, node="n1")
    looked = AT + dt.timedelta(seconds=20)
    schedulers.replaced(WAITING, bound, looked)  # default-scheduler works
    awaited = ["default-scheduler", "volcano"].copy
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=29), awaited) == []
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=30), awaited) == ["volcano"]
    assert schedulers.gone_quiet(AT + dt.timedelta(seconds=45), awaited) == []
    assert schedulers.gone_quiet(looked + dt.timedelta(seconds=30), awaited) == [
        "default-scheduler"
    ]
    # A look recorded before the start counts from the start.
    early = Schedulers()
    early.replaced(WAITING, bound, AT - dt.timedelta(seconds=60))
    early.watching(AT)
    assert early.looked_at("default-scheduler") == AT
    assert early.gone_quiet(AT + dt.timedelta(seconds=10)) == []
    assert early.gone_quiet(AT + dt.timedelta(seconds=30)) == ["default-scheduler"]
