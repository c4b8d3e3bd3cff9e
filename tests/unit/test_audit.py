"""The watch-gap audit: stale cache entries found, dropped from the TPUJob and TPUSlice
stores the runtime watches into, and what depended on them woken; triggers after re-lists
and after the API answers again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from tests.unit.fakeapi import QueueRecorder
from tpu_operator import contract
from tpu_operator.reconcile.cached import JOBS, SLICES
from tpu_operator.runtime import audit, collector
from tpu_operator.runtime.audit import CacheAudit, stale
from tpu_operator.runtime.caches import Caches, identity_of
from tpu_operator.runtime.kube import RequestRecord
from tpu_operator.runtime.listwatch import NODES, PODS

pytestmark = pytest.mark.unit

NS = "ml"


def pod(name: str, uid: str, *, slice_name: str = "train-0", worker: int = 0, node: str = "n-0"):
    labels = {
        contract.LABEL_SLICE_NAME: slice_name,
        contract.LABEL_JOB_NAME: slice_name.rsplit("-", 1)[0],
        contract.LABEL_WORKER_INDEX: str(worker),
        contract.LABEL_RESTART_ATTEMPT: "1",
    }
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels},
        "spec": {"nodeName": node, "nodeSelector": {contract.NODE_LABEL_NODEPOOL: "pool-a"}},
        "status": {"phase": "Running"},
    }


def node(name: str, uid: str) -> dict[str, Any]:
    labels = {contract.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice", contract.NODE_LABEL_NODEPOOL: "a"}
    return {
        "metadata": {"name": name, "uid": uid, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def job(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid}, "spec": {}}


def slice_(name: str, uid: str, owner: str) -> dict[str, Any]:
    ref = {"kind": contract.JOB_KIND, "name": owner, "controller": True}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "ownerReferences": [ref]},
        "spec": {},
    }


class Indexes:
    """The stores of the runtime's watches, filled as its list-and-watch fills them."""

    def __init__(self) -> None:
        self.own = {kind.name: (kind.store(), kind) for kind in (PODS, NODES, JOBS, SLICES)}

    def put(self, kind: str, body: dict[str, Any]) -> None:
        store, watched = self.own[kind]
        ident, view = identity_of(body), watched.view(body)
        store.put(ident, view)

    def caches(self) -> Caches:
        stores = {kind: store for kind, (store, _) in self.own.items()}
        return Caches(**stores)


class FakeKube:
    """Answers the audit's metadata lists from a set of UIDs per kind."""

    def __init__(self, uids: dict[str, set[str]]) -> None:
        self.uids = uids
        self.calls: list[tuple[str, str | None]] = []
        self.during: dict[str, Callable[[], None]] = {}

    async def list_metadata(self, path: str, *, label_selector: str | None = None) -> list[Any]:
        self.calls.append((path, label_selector))
        kind = next(k for k, s in audit.SOURCES.items() if path.endswith("/" + s.plural))
        if kind in self.during:
            self.during.pop(kind)()  # an event indexed while the list is in flight
        return [{"uid": uid} for uid in sorted(self.uids.get(kind, set()))]


class Owner:
    def __init__(self, acting: bool = True) -> None:
        self.acting = acting
        self.jobs = QueueRecorder()
        self.slices = QueueRecorder()
        self.woken = 0

    def wake_waiting(self) -> None:
        self.woken += 1


def make_audit(
    indexes: Indexes,
    kube: FakeKube,
    owner: Owner | None = None,
    namespaces: Iterable[str] = (),
    lag: float = 0.0,
) -> tuple[CacheAudit, Caches, Owner]:
    caches = indexes.caches()
    owner = owner or Owner()
    made = CacheAudit(kube, caches, owner, namespaces=list(namespaces), lag=lag)  # type: ignore[arg-type]
    return made, caches, owner


def test_stale_are_the_cached_objects_the_list_lacks() -> None:
    cached = [(NS, "a", "u1"), (NS, "b", "u2"), (None, "n", "old"), (None, "n", "new")]
    assert stale(cached, {"u2", "new"}) == [(None, "n", "old"), (NS, "a", "u1")]
    assert stale(cached, {"u1", "u2", "old", "new"}) == []
    assert stale([(NS, "a", "u1"), ("other", "b", "u2")], set(), scope=[NS]) == [(NS, "a", "u1")]


def test_forget_drops_an_object_under_every_key_of_its_store() -> None:
    indexes = Indexes()
    indexes.put("slices", slice_("train-0", "s1", "train"))
    indexes.put("slices", slice_("train-1", "s2", "train"))
    caches = indexes.caches()
    caches.forget("slices", (NS, "train-0", "s1"))
    assert caches.slice(NS, "train-0") is None
    assert [s["metadata"]["name"] for s in caches.slices_of_job(NS, "train")] == ["train-1"]
    caches.forget("slices", (NS, "train-0", "s1"))  # twice: a DELETED event came late
    caches.forget("slices", (NS, "train-1", "s2"))
    assert caches.slices_of_job(NS, "train") == [] and list(caches.all_slices()) == []
    with pytest.raises(ValueError, match="pods"):
        caches.entries("pods")  # the pod watch heals itself (runtime/listwatch.py)


def test_audit_drops_what_the_api_no_longer_has_and_wakes_its_owners() -> None:
    indexes = Indexes()
    indexes.put("pods", pod("train-0-0", "p1"))
    indexes.put("nodes", node("n-0", "nu0"))
    indexes.put("jobs", job("train", "j1"))
    indexes.put("jobs", job("gone", "j2"))
    indexes.put("slices", slice_("train-0", "s1", "train"))
    indexes.put("slices", slice_("gone-0", "s2", "gone"))
    indexes.put("slices", slice_("lost-0", "s3", "train"))
    kube = FakeKube({"jobs": {"j1"}, "slices": {"s1"}})
    auditor, caches, owner = make_audit(indexes, kube)

    result = asyncio.run(auditor.audit("test"))

    assert result.dropped == {
        "slices": [(NS, "gone-0", "s2"), (NS, "lost-0", "s3")],
        "jobs": [(NS, "gone", "j2")],
    }
    assert caches.job(NS, "gone") is None and caches.slice(NS, "gone-0") is None
    assert caches.slices_of_job(NS, "gone") == []
    assert [s["metadata"]["name"] for s in caches.slices_of_job(NS, "train")] == ["train-0"]
    # The pod and node watches heal themselves (their re-lists): not listed, not judged.
    assert [p.name for p in caches.pods_of_job(NS, "train")] == ["train-0-0"]
    assert [n.name for n in caches.tpu_nodes()] == ["n-0"]
    assert set(owner.jobs.keys) == {(NS, "train"), (NS, "gone")}  # lost-0 was train's
    assert set(owner.slices.keys) == {(NS, "gone-0"), (NS, "lost-0")}
    assert owner.woken >= 1
    assert "2 slices (ml/gone-0, ml/lost-0)" in result.describe()

    again = asyncio.run(auditor.audit("again"))
    assert again.dropped == {}


def test_objects_cached_after_the_list_was_requested_are_kept() -> None:
    indexes = Indexes()
    indexes.put("slices", slice_("train-0", "s1", "train"))
    kube = FakeKube({"slices": {"s1"}})
    auditor, caches, _ = make_audit(indexes, kube)
    # Created after the apiserver answered the list, indexed before the comparison.
    kube.during["slices"] = lambda: indexes.put("slices", slice_("train-1", "s2", "train"))
    result = asyncio.run(auditor.audit("test"))
    assert "slices" not in result.dropped
    names = {s["metadata"]["name"] for s in caches.slices_of_job(NS, "train")}
    assert names == {"train-0", "train-1"}


def test_an_object_whose_deleted_event_comes_within_the_lag_is_no_watch_gap() -> None:
    """While many jobs are deleted at once, a list can lack objects whose DELETED events
    the watch has yet to deliver: only what is still cached after the lag is dropped (and
    reported as a watch gap)."""
    indexes = Indexes()
    indexes.put("jobs", job("late", "j1"))
    indexes.put("jobs", job("missed", "j2"))
    kube = FakeKube({"jobs": set()})
    auditor, caches, owner = make_audit(indexes, kube, lag=0.2)

    async def scenario() -> audit.AuditResult:
        running = asyncio.create_task(auditor.audit("test"))
        await asyncio.sleep(0.05)  # the lists answered; the audit waits for late events
        assert caches.job(NS, "late") is not None, "nothing dropped before the lag"
        caches.forget("jobs", (NS, "late", "j1"))  # its DELETED event, late
        return await running

    result = asyncio.run(scenario())
    assert result.dropped == {"jobs": [(NS, "missed", "j2")]}
    assert owner.jobs.keys == [(NS, "missed")]
    assert caches.job(NS, "missed") is None


def test_start_up_asks_whether_any_job_or_slice_exists() -> None:
    indexes = Indexes()
    auditor, _, _ = make_audit(indexes, FakeKube({"pods": {"p1"}}))
    assert not asyncio.run(auditor.any_exist(("jobs", "slices"))), "pods do not count"
    auditor, _, _ = make_audit(indexes, FakeKube({"slices": {"s1"}}), namespaces=[NS, "b"])
    assert asyncio.run(auditor.any_exist(("jobs", "slices")))


def test_a_standby_heals_its_caches_but_enqueues_nothing() -> None:
    indexes = Indexes()
    indexes.put("slices", slice_("train-0", "s1", "train"))
    auditor, caches, owner = make_audit(indexes, FakeKube({}), Owner(acting=False))
    asyncio.run(auditor.audit("test"))
    assert caches.slices_of_job(NS, "train") == []
    assert owner.jobs.keys == [] and owner.slices.keys == [] and owner.woken == 0


def test_audit_lists_what_kopf_watches() -> None:
    kube = FakeKube({})
    auditor, _, _ = make_audit(Indexes(), kube, namespaces=["a", "b"])
    asyncio.run(auditor.audit("test"))
    group = f"/apis/{contract.GROUP}/{contract.VERSION}"
    assert kube.calls == [
        (f"{group}/namespaces/a/{contract.SLICE_PLURAL}", None),
        (f"{group}/namespaces/b/{contract.SLICE_PLURAL}", None),
        (f"{group}/namespaces/a/{contract.JOB_PLURAL}", None),
        (f"{group}/namespaces/b/{contract.JOB_PLURAL}", None),
    ]
    everywhere = FakeKube({})
    asyncio.run(make_audit(Indexes(), everywhere)[0].audit("test"))
    assert everywhere.calls[0] == (f"{group}/{contract.SLICE_PLURAL}", None)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_an_audit_follows_relists_and_the_api_answering_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit, "SETTLE_SECONDS", 0.01)
    trims: list[int] = []
    monkeypatch.setattr(collector, "trim", lambda: trims.append(1))
    indexes = Indexes()
    indexes.put("jobs", job("train", "j1"))

    async def scenario() -> list[str]:
        auditor, caches, _ = make_audit(indexes, FakeKube({}))
        auditor.period = 3600
        reasons = []
        auditor.start()
        try:
            auditor.api_request(RequestRecord("PATCH", 0, 0.01))  # connection refused
            auditor.api_request(RequestRecord("GET", 503, 0.01))  # starting up
            await asyncio.sleep(0.05)
            assert auditor.audits == 0, "no audit while the API is away"
            auditor.api_request(RequestRecord("GET", 200, 0.01))
            await until(lambda: auditor.audits >= 1)
            reasons.append(auditor.last.reason if auditor.last else "")
            for _ in range(3):  # a burst of re-listed objects: one audit
                auditor.listed("jobs")
            await until(lambda: auditor.audits >= 2)
            await asyncio.sleep(0.05)
            reasons.append(auditor.last.reason if auditor.last else "")
            assert auditor.audits == 2
            assert len(trims) == 2, "each round hands the memory of its lists back"
            assert caches.job(NS, "train") is None
        finally:
            await auditor.stop()
        return reasons

    assert asyncio.run(scenario()) == ["the API answers again", "jobs listed again"]
