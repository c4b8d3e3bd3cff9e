"""The operator's own list-and-watch: the store's keys, applying watch lines, re-list healing."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_operator import contract
from tpu_operator.reconcile.cached import JOBS, SLICES
from tpu_operator.reconcile.pools import job_holder
from tpu_operator.runtime import listwatch
from tpu_operator.runtime.audit import stale
from tpu_operator.runtime.caches import Caches, Schedulers, identity_of
from tpu_operator.runtime.kube import ApiError, loads_core
from tpu_operator.runtime.listwatch import (
    NODES,
    PODS,
    Gone,
    ListWatch,
    Store,
)
from tpu_operator.state.views import PodView, pod_view

pytestmark = pytest.mark.unit
NS = "ml"


def pod(
    name: str,
    uid: str,
    *,
    job: str = "j",
    slice_name: str = "j-0",
    node: str | None = None,
    pool: str | None = None,
    phase: str = "Pending",
    version: str = "1",
    attempt: int = 1,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": version,
            "labels": {
                contract.LABEL_SLICE_NAME: slice_name,
                contract.LABEL_JOB_NAME: job,
                contract.LABEL_WORKER_INDEX: name.rsplit("-", 1)[-1],
                contract.LABEL_RESTART_ATTEMPT: str(attempt),
            },
        },
        "spec": {},
        "status": {"phase": phase},
    }
    if node:
        body["spec"]["nodeName"] = node
    if pool:
        body["spec"]["nodeSelector"] = {contract.NODE_LABEL_NODEPOOL: pool}
    return body


def view(body: dict[str, Any]) -> PodView:
    found = pod_view(body)
    assert found is not None
    return found


def put(store: Store, body: dict[str, Any]) -> None:
    ident, found = identity_of(body), view(body)
    store.put(ident, found)


def test_the_store_files_a_pod_under_every_key_and_moves_it_when_it_changes():
    store = PODS.store()
    caches = Caches(pods=store, slices={}, jobs={}, nodes={})
    put(store, pod("j-0-0", "u0", pool="p1"))
    assert [p.name for p in caches.pods_of_slice(NS, "j-0")] == ["j-0-0"]
    assert [p.name for p in caches.pods_of_job(NS, "j")] == ["j-0-0"]
    assert caches.pods_on_node("n1") == []
    assert list(caches.pinned_pools()) == ["p1"]
    assert [p.name for p in caches.awaiting("default-scheduler")] == ["j-0-0"]
    put(store, pod("j-0-0", "u0", pool="p1", node="n1", phase="Running"))
    assert [p.phase for p in caches.pods_on_node("n1")] == ["Running"]
    assert caches.awaiting("default-scheduler") == []
    assert caches.count_pods_of_slice(NS, "j-0") == 1, "a change replaces, never adds"
    assert store.discard((NS, "j-0-0", "u0")) is not None
    assert len(store) == 0, "no empty key is left behind"
    assert store.discard((NS, "j-0-0", "u0")) is None


def test_a_standalone_slice_pod_has_no_job_key():
    store = PODS.store()
    put(store, pod("s-0", "u0", job="s", slice_name="s"))
    assert set(store) == {("slice", NS, "s"), ("awaiting", "default-scheduler")}


@pytest.mark.parametrize(
    ("bodies", "leaders"),
    [
        pytest.param([pod("j-0-1", "u1")], [], id="no worker 0"),
        pytest.param(
            [pod("j-0-0", "u0"), pod("j-0-1", "u1"), pod("j-1-0", "u2", slice_name="j-1")],
            ["j-0-0/1", "j-1-0/1"],
            id="worker 0 of each slice",
        ),
        pytest.param(
            [pod("j-0-0", "u0"), pod("j-0-0", "u3", attempt=2)],
            ["j-0-0/1", "j-0-0/2"],
            id="of every attempt",
        ),
        pytest.param(
            [pod("j-0-0", "u0"), pod("k-0-0", "u1", job="k", slice_name="k-0")],
            ["j-0-0/1"],
            id="of this job only",
        ),
        pytest.param([pod("s-0", "u0", job="s", slice_name="s")], [], id="standalone slice"),
    ],
)
def test_a_jobs_slice_leaders_are_looked_up_by_their_own_key(
    bodies: list[dict[str, Any]], leaders: list[str]
) -> None:
    store = PODS.store()
    caches = Caches(pods=store, slices={}, jobs={}, nodes={})
    for body in bodies:
        put(store, body)
    assert sorted(f"{p.name}/{p.attempt}" for p in caches.leaders_of_job(NS, "j")) == leaders


def test_a_leader_that_is_deleted_leaves_the_leaders_key():
    store = PODS.store()
    caches = Caches(pods=store, slices={}, jobs={}, nodes={})
    put(store, pod("j-0-0", "u0"))
    put(store, pod("j-0-0", "u0", phase="Running", version="2"))
    assert [p.phase for p in caches.leaders_of_job(NS, "j")] == ["Running"]
    store.discard((NS, "j-0-0", "u0"))
    assert caches.leaders_of_job(NS, "j") == [] and len(store) == 0


def test_the_store_counts_a_jobs_pods_by_attempt_through_every_change():
    store = PODS.store()
    caches = Caches(pods=store, slices={}, jobs={}, nodes={})

    def attempts() -> dict[int, int]:
        return dict(store.counts(("job", NS, "j")))

    assert attempts() == {} and set(caches.attempts_of_job(NS, "j")) == set()
    put(store, pod("j-0-0", "u0"))
    put(store, pod("j-0-1", "u1"))
    put(store, pod("j-1-0", "u2", slice_name="j-1", attempt=2))
    assert attempts() == {1: 2, 2: 1}
    put(store, pod("j-0-0", "u0", phase="Running", version="2"))
    assert attempts() == {1: 2, 2: 1}, "a changed pod is counted once"
    put(store, pod("j-0-1", "u1", attempt=2, version="2"))
    assert attempts() == {1: 1, 2: 2}, "a relabelled pod moves to its new attempt"
    store.discard((NS, "j-0-0", "u0"))
    assert attempts() == {2: 2} and set(caches.attempts_of_job(NS, "j")) == {2}
    store.discard((NS, "j-0-1", "u1"))
    store.discard((NS, "j-1-0", "u2"))
    assert attempts() == {} and ("job", NS, "j") not in store._counts, "no empty group"


def test_a_standalone_slice_pod_is_not_counted_under_any_job():
    store = PODS.store()
    put(store, pod("s-0", "u0", job="s", slice_name="s"))
    assert set(store._counts) == {("unready", NS, "s")}, "only as its own gang's, not ready"


@pytest.mark.parametrize(
    "pods",
    [
        [],
        [("j-0-0", 1)],
        [("j-0-0", 1), ("j-0-1", 2), ("j-1-0", 3)],
        [("j-0-0", 0), ("j-0-1", 0)],
    ],
)
def test_attempts_of_a_job_are_the_same_from_the_counts_and_from_its_pods(pods):
    counted = PODS.store()
    walked: dict[Any, list[PodView]] = {}
    for i, (name, attempt) in enumerate(pods):
        body = pod(name, f"u{i}", slice_name=name.rsplit("-", 1)[0], attempt=attempt)
        put(counted, body)
        for key, value in PODS.keys(view(body)).items():
            walked.setdefault(key, []).append(value)
    by_counts = Caches(pods=counted, slices={}, jobs={}, nodes={}).attempts_of_job(NS, "j")
    by_pods = Caches(pods=walked, slices={}, jobs={}, nodes={}).attempts_of_job(NS, "j")
    assert set(by_counts) == set(by_pods) == {attempt for _, attempt in pods}


def test_a_discarded_pod_leaves_every_key_of_the_store():
    store = PODS.store()
    caches = Caches(pods=store, slices={}, jobs={}, nodes={})
    put(store, pod("j-0-0", "u0", node="n1"))
    assert [p.name for p in caches.pods_on_node("n1")] == ["j-0-0"]
    store.discard((NS, "j-0-0", "u0"))
    assert caches.pods_on_node("n1") == [] and caches.pods_of_slice(NS, "j-0") == []
    assert caches.pods_of_job(NS, "j") == [] and len(store) == 0


def test_views_decoded_apart_share_their_repeated_strings():
    # Two watch events of two pods of one slice on one pool: each decoded on its own.
    a, b = (
        view(loads_core(json.dumps(pod(f"j-0-{i}", f"u{i}", node=f"n{i}", pool="p1")).encode()))
        for i in range(2)
    )
    for field in ("namespace", "job_name", "slice_name", "phase", "pool"):
        assert getattr(a, field) is getattr(b, field), field
    node = NODES.view(loads_core(json.dumps({"metadata": {"name": "n0"}}).encode()))
    assert node.name is a.node, "a pod's node name is its node view's"


def test_the_store_keeps_no_record_of_keys_per_object():
    # The keys an object is filed under are worked out from its view when it changes or
    # goes; nothing per object is kept beside the view and its entries under those keys.
    store = PODS.store()
    for i in range(3):
        put(store, pod(f"j-0-{i}", f"u{i}", node=f"n{i}", pool="p1"))
    # (``_versions`` holds one number per slice, not per pod.)
    assert set(vars(store)) == {
        "_keys_of",
        "_views",
        "_keys",
        "_tally",
        "_counts",
        "_versioned",
        "_versions",
    }
    put(store, pod("j-0-0", "u0", node="n9", pool="p2", slice_name="j-1", attempt=2))
    assert set(store) == {
        ("slice", NS, "j-0"),
        ("slice", NS, "j-1"),
        ("job", NS, "j"),
        ("leaders", NS, "j"),
        ("node", "n1"),
        ("node", "n2"),
        ("node", "n9"),
        ("pool", "p1"),
        ("pool", "p2"),
    }, "a moved pod leaves every key of its earlier view"
    for i in range(3):
        store.discard((NS, f"j-0-{i}", f"u{i}"))
    assert len(store) == 0 and store.objects == 0


@pytest.mark.parametrize(
    ("stored", "listed", "gone"),
    [
        ([], [], []),
        ([(NS, "a", "1")], [(NS, "a", "1")], []),
        ([(NS, "a", "1"), (NS, "b", "2")], [(NS, "a", "1")], [(NS, "b", "2")]),
        # re-created under the same name: the old UID is gone
        ([(NS, "a", "1")], [(NS, "a", "9")], [(NS, "a", "1")]),
    ],
)
def test_a_relist_drops_what_it_does_not_hold(stored, listed, gone):
    assert stale(stored, {uid for _, _, uid in listed}) == gone


class Reader:
    """An aiohttp StreamReader's ``iter_any`` over fixed chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self):
        for chunk in self.chunks:
            yield chunk


def lines(chunks: list[bytes]) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [line async for line in listwatch._lines(Reader(chunks))]  # type: ignore[arg-type]

    return asyncio.run(collect())


def test_watch_lines_split_across_chunks_and_longer_than_aiohttps_limit():
    big = b'{"x": "' + b"y" * 300_000 + b'"}'
    assert lines([b'{"a"', b": 1}\n{", b'"b": 2}\n', big[:1000], big[1000:] + b"\n"]) == [
        b'{"a": 1}',
        b'{"b": 2}',
        big,
    ]
    assert lines([b"\n\n", b'{"c": 3}']) == [b'{"c": 3}'], "a last line without newline"


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str, str]] = []

    def __call__(self, type: str | None, view: Any) -> None:
        self.seen.append((type, view.name, getattr(view, "phase", "")))


def watch() -> tuple[ListWatch, Events]:
    events = Events()
    return ListWatch(PODS, None, None, PODS.store(), events), events  # type: ignore[arg-type]


def line(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": body}).encode()


def test_applying_watch_events_keeps_the_store_and_the_resume_version():
    w, events = watch()
    assert w._apply(line("ADDED", pod("j-0-0", "u0", version="5")), "4") == "5"
    assert w._apply(line("MODIFIED", pod("j-0-0", "u0", phase="Running", version="6")), "5") == "6"
    bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "9"}}
    assert w._apply(line("BOOKMARK", bookmark), "6") == "9"
    assert [v.phase for v in w.store["slice", NS, "j-0"]] == ["Running"]
    deleted = pod("j-0-0", "u0", phase="Failed", version="10")
    assert w._apply(line("DELETED", deleted), "9") == "10"
    assert w.store.objects == 0
    assert events.seen == [
        ("ADDED", "j-0-0", "Pending"),
        ("MODIFIED", "j-0-0", "Running"),
        ("DELETED", "j-0-0", "Failed"),  # the final state, as the event carries it
    ]
    unlabelled = {"metadata": {"name": "x", "namespace": NS, "resourceVersion": "11"}}
    assert w._apply(line("ADDED", unlabelled), "10") == "11"
    assert w.store.objects == 0 and len(events.seen) == 3


def test_a_watch_error_410_lists_again_and_others_raise_with_the_code():
    w, _ = watch()
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    with pytest.raises(Gone):
        w._apply(line("ERROR", expired), "1")
    busy = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow down",
            "details": {"retryAfterSeconds": 7}}  # fmt: skip
    with pytest.raises(ApiError) as raised:
        w._apply(line("ERROR", busy), "1")
    assert raised.value.status == 429 and raised.value.retry_after == 7
    assert w._backoff(0, raised.value) == 7, "Retry-After is honoured"
    assert [w._backoff(n, ValueError()) for n in range(7)] == [0.5, 1, 2, 3, 5, 5, 5]


class Pages:
    """The apiserver's paged list of pods, as ``Kube.request`` returns it."""

    def __init__(self, bodies: list[dict[str, Any]], limit: int = 2) -> None:
        self.bodies = bodies
        self.limit = limit
        self.queries: list[dict[str, str]] = []

    async def request(
        self, verb: str, path: str, *, query: dict[str, str], loads: Callable[[bytes], Any]
    ) -> Any:
        self.queries.append(dict(query))
        start = int(query.get("continue", "0"))
        end = start + self.limit
        meta = {"resourceVersion": "42"}
        if end < len(self.bodies):
            meta["continue"] = str(end)
        # The page goes through the decoder the list asks for, as Kube.request does.
        return loads(json.dumps({"items": self.bodies[start:end], "metadata": meta}).encode())


def test_a_list_pages_through_and_drops_pods_deleted_while_no_watch_ran():
    events = Events()
    store = PODS.store()
    put(store, pod("j-0-7", "gone"))
    put(store, pod("j-0-0", "u0"))
    pages = Pages([pod(f"j-0-{i}", f"u{i}", phase="Running") for i in range(5)])
    w = ListWatch(PODS, pages, None, store, events, namespaces=[NS])  # type: ignore[arg-type]
    assert asyncio.run(w.list_once(NS)) == "42"
    assert [q.get("continue") for q in pages.queries] == [None, "2", "4"]
    assert all(q["labelSelector"] == contract.LABEL_SLICE_NAME for q in pages.queries)
    assert sorted(name for _, name, _ in store.identities()) == [f"j-0-{i}" for i in range(5)]
    assert events.seen[-1] == ("DELETED", "j-0-7", "Pending")
    assert [t for t, _, _ in events.seen[:-1]] == [None] * 5
    assert {(v.namespace, v.name, v.uid) for v in store["slice", NS, "j-0"]} == set(
        store.identities()
    )


def test_nodes_are_cluster_scoped_and_filed_by_name_and_pool():
    listed: list[int] = []
    store = NODES.store()
    w = ListWatch(NODES, None, None, store, Events(), namespaces=[NS], on_listed=listed.append)  # type: ignore[arg-type]
    assert w.namespaces == [None], "nodes are listed cluster-wide even in namespaced mode"
    node = {
        "metadata": {
            "name": "n1",
            "uid": "nu1",
            "resourceVersion": "3",
            "labels": {contract.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice",
                       contract.NODE_LABEL_NODEPOOL: "p1"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    w._apply(line("ADDED", node), "2")
    caches = Caches(pods=PODS.store(), slices={}, jobs={}, nodes=store)
    assert caches.node("n1") is not None and caches.node("n1").pool == "p1"
    w._apply(line("DELETED", node), "3")
    caches.nodes_changed()  # as the runtime's node_event does first
    assert caches.node("n1") is None and len(store) == 0


def test_an_event_that_changes_nothing_the_operator_reads_wakes_nothing():
    events = Events()
    counted: list[int] = []
    w = ListWatch(PODS, None, None, PODS.store(), events, count=lambda: counted.append(1))  # type: ignore[arg-type]
    w._apply(line("ADDED", pod("j-0-0", "u0", version="5")), "4")
    annotated = pod("j-0-0", "u0", version="6")
    annotated["metadata"]["annotations"] = {"example.com/note": "x"}
    assert w._apply(line("MODIFIED", annotated), "5") == "6"
    assert events.seen == [("ADDED", "j-0-0", "Pending")], "the PodView did not change"
    w._apply(line("MODIFIED", pod("j-0-0", "u0", phase="Running", version="7")), "6")
    assert events.seen[-1] == ("MODIFIED", "j-0-0", "Running")
    assert len(counted) == 3, "every event is counted"


def test_pods_decode_the_same_with_the_fast_decoder_and_only_core_kinds_use_it():
    body = pod("j-0-0", "u0", node="n1", pool="p1", phase="Running")
    body["spec"]["containers"] = [
        {"name": "w", "env": [{"name": "TPU_WORKER_HOSTNAMES", "value": "h0,h1,ü"}]}
    ]
    raw = json.dumps({"type": "MODIFIED", "object": body}).encode()
    assert loads_core(raw) == json.loads(raw)
    # Why custom resources stay with json: a free-form template may hold an integer
    # beyond 64 bits, which orjson would turn into a float.
    huge = b'{"n": 123456789012345678901234567890}'
    assert json.loads(huge)["n"] == 123456789012345678901234567890
    assert loads_core(huge)["n"] != 123456789012345678901234567890


def test_a_slice_version_moves_with_each_change_of_its_pods_and_only_then():
    store = PODS.store()
    key = ("slice", NS, "j-0")
    assert store.version(key) == 0
    put(store, pod("j-0-0", "u0"))
    first = store.version(key)
    assert first > 0
    put(store, pod("j-0-0", "u0", version="2"))  # a new resourceVersion, the same view
    assert store.version(key) == first, "an event that changes no view changes nothing"
    put(store, pod("j-0-0", "u0", phase="Running", version="3"))
    moved = store.version(key)
    assert moved > first
    put(store, pod("j-1-0", "u1", slice_name="j-1"))
    assert store.version(key) == moved, "another slice's pod is not this slice's"
    put(store, pod("j-0-0", "u0", slice_name="j-1", phase="Running", version="4"))
    assert store.version(key) == 0, "its only pod moved out: nothing is filed under it"
    store.discard((NS, "j-1-0", "u1"))
    assert store.version(("slice", NS, "j-1")) > moved
    rebuilt = PODS.store()  # a store built again never repeats a version
    put(rebuilt, pod("j-0-0", "u0"))
    assert rebuilt.version(key) not in (0, first, moved)


POD_CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["j-0-0", "j-0-1", "j-1-0", "s-0"]),  # which pod
        st.sampled_from([None, "n1", "n2"]),  # its node
        st.sampled_from([None, "p1", "p2"]),  # its pool
        st.integers(1, 3),  # its attempt
        st.sampled_from(["Pending", "Running", "Succeeded"]),
        st.booleans(),  # ready
        st.booleans(),  # deleted instead
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(POD_CHANGES)
def test_a_store_after_any_changes_is_the_store_of_its_last_views(changes):
    # Store.put moves an object only out of the keys it left and recounts it only when
    # its tally changed: the outcome must be that of filing the last views afresh.
    store = PODS.store()
    last: dict[str, dict[str, Any]] = {}
    for name, node, pool, attempt, phase, ready, deleted in changes:
        uid = f"u-{name}"
        if deleted:
            store.discard((NS, name, uid))
            last.pop(name, None)
            continue
        slice_name = name.rsplit("-", 1)[0]
        body = pod(name, uid, job="s" if name == "s-0" else "j", slice_name=slice_name,
                   node=node, pool=pool, attempt=attempt, phase=phase)  # fmt: skip
        if ready:
            body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        put(store, body)
        last[name] = body
    # What the last views file and count, worked out without a store.
    keys: dict[Any, dict[Any, PodView]] = {}
    counts: dict[Any, Counter[int]] = {}
    for body in last.values():
        found = view(body)
        for key, value in PODS.keys(found).items():
            keys.setdefault(key, {})[identity_of(body)] = value
        for group, value in PODS.tally(found) if PODS.tally else ():
            counts.setdefault(group, Counter())[value] += 1
    assert {k: dict(v) for k, v in store._keys.items()} == keys
    assert store._counts == counts
    assert store.objects == len(last)
    assert set(store._versions) == {k for k in keys if k[0] == "slice"}


def test_a_pod_event_as_the_apiserver_sends_it_decodes_to_the_same_view_as_its_json():
    # The watch decodes into state/documents.py's few fields and skips the rest; nulls,
    # fields it does not name and empty collections must read as the JSON path reads them.
    body = pod("j-0-0", "u0", node="n1", pool="p1", phase="Running")
    body["metadata"].update(annotations=None, managedFields=[{"manager": "kubelet"}],
                            deletionTimestamp="2026-11-24T16:05:00Z")  # fmt: skip
    body["spec"]["containers"] = [{"name": "worker", "env": [{"name": "A", "value": "1"}]}]
    body["status"].update(
        podIP="10.0.0.1", hostIPs=[{"ip": "10.0.0.5"}], startTime="2026-11-24T16:04:29Z",
        conditions=[{"type": "Ready", "status": "False", "lastProbeTime": None,
                     "lastTransitionTime": "2026-11-24T16:04:59Z", "reason": "PodCompleted"},
                    {"type": "DisruptionTarget", "status": "True",
                     "reason": "PreemptionByScheduler"}],
        containerStatuses=[{"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
                           {"name": "worker", "lastState": {}, "state": {"terminated":
                            {"exitCode": 3, "reason": "Error", "finishedAt": "2026-11-24T16:04:58Z",
                             "startedAt": "2026-11-24T16:04:30Z"}}}],
    )  # fmt: skip
    w, events = watch()
    w._apply(line("MODIFIED", body), "1")
    (decoded,) = w.store["slice", NS, "j-0"]
    assert decoded == view(json.loads(json.dumps(body)))
    assert (decoded.exit_code, decoded.exit_reason, decoded.worker_exit) == (3, "Error", 3)
    assert decoded.disruption == "PreemptionByScheduler" and decoded.ready is False
    assert decoded.not_ready_since == "2026-11-24T16:04:59Z" and decoded.pod_ip == "10.0.0.1"
    assert decoded.deletion_deadline == "2026-11-24T16:05:00Z" and decoded.node == "n1"
    assert events.seen == [("MODIFIED", "j-0-0", "Running")]


@pytest.mark.parametrize(
    "raw",
    [b"[1, 2]", b'{"type": "ADDED"}', b'{"type": "ADDED", "object": {"metadata": []}}', b"{"],
)
def test_a_watch_line_that_is_no_pod_event_raises_a_value_error(raw):
    # The watch then logs it and starts again (ListWatch._run); nothing is stored.
    w, events = watch()
    with pytest.raises(ValueError):
        w._apply(raw, "1")
    assert w.store.objects == 0 and events.seen == []


# TPUJobs and TPUSlices: whole objects, decoded with json -----------------------------


def tpu_slice(name: str, uid: str, version: str, *, pool: str = "pool-a", **status: Any):
    owner = {"kind": contract.JOB_KIND, "name": "j", "uid": "ju", "controller": True}
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.SLICE_KIND,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": version,
            "ownerReferences": [owner],
            "managedFields": [{"manager": "tpu-operator"}],
        },
        "spec": {"nodePool": pool, "template": {"spec": {"containers": [{"name": "w"}]}}},
        "status": status,
    }


class Bodies:
    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str, Any]] = []

    def __call__(self, type: str | None, body: Any) -> None:
        self.seen.append((type, body["metadata"]["name"], body.get("status")))


def test_tpuslice_events_are_kept_whole_under_the_slice_job_and_pool_keys():
    events = Bodies()
    w = ListWatch(SLICES, None, None, SLICES.store(), events)  # type: ignore[arg-type]
    big = 2**70  # a free-form field's integer beyond 64 bits stays exact
    added = tpu_slice("j-0", "s0", "5")
    added["spec"]["template"]["spec"]["containers"][0]["args"] = [big]
    assert w._apply(line("ADDED", added), "4") == "5"
    cached = next(iter(w.store["slice", NS, "j-0"]))
    assert cached["spec"]["template"]["spec"]["containers"][0]["args"] == [big]
    assert "managedFields" not in cached["metadata"]
    assert list(w.store["job", NS, "j"]) == [cached]
    assert list(w.store["pool", "pool-a"]) == [job_holder(NS, "j")]
    moved = tpu_slice("j-0", "s0", "6", pool="pool-b", phase="Running")
    assert w._apply(line("MODIFIED", moved), "5") == "6"
    assert w.store.get(("pool", "pool-a")) is None
    assert list(w.store["pool", "pool-b"]) == [job_holder(NS, "j")]
    bookmark = {"kind": contract.SLICE_KIND, "metadata": {"resourceVersion": "9"}}
    assert w._apply(line("BOOKMARK", bookmark), "6") == "9"
    assert w._apply(line("DELETED", tpu_slice("j-0", "s0", "10")), "9") == "10"
    assert w.store.objects == 0 and w.store.get(("job", NS, "j")) is None
    assert [(t, n) for t, n, _ in events.seen] == [
        ("ADDED", "j-0"),
        ("MODIFIED", "j-0"),
        ("DELETED", "j-0"),
    ]
    assert events.seen[1][2] == {"phase": "Running"}
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    with pytest.raises(Gone):
        w._apply(line("ERROR", expired), "10")


def test_a_tpujob_list_pages_through_whole_objects_and_drops_the_deleted():
    def job(name: str, uid: str, **status: Any) -> dict[str, Any]:
        meta = {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "3"}
        return {"metadata": meta, "spec": {"numSlices": 2}, "status": status}

    events = Bodies()
    store = JOBS.store()
    store.put((NS, "gone", "g"), job("gone", "g"))
    pages = Pages([job(f"j{i}", f"u{i}", phase="Running", nodePools=[f"p{i}"]) for i in range(3)])
    w = ListWatch(JOBS, pages, None, store, events, namespaces=[NS])  # type: ignore[arg-type]
    assert asyncio.run(w.list_once(NS)) == "42"
    assert JOBS.path(NS) == f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/tpujobs"
    assert sorted(name for _, name, _ in store.identities()) == ["j0", "j1", "j2"]
    assert [b["spec"] for b in store["job", NS, "j1"]] == [{"numSlices": 2}]
    assert list(store["pool", "p2"]) == [job_holder(NS, "j2")]
    assert events.seen[-1][:2] == ("DELETED", "gone")
    assert [t for t, _, _ in events.seen[:-1]] == [None] * 3


def test_a_pod_a_scheduler_placed_notes_when_that_scheduler_looked():
    """The hook sees the view replaced: awaiting the scheduler, then bound to a node. The
    runtime's record of schedulers (``Caches.schedulers``) is fed this way."""
    schedulers = Schedulers()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    replaced: list[tuple[str | None, str | None]] = []

    def on_replace(old: Any, new: Any) -> None:
        replaced.append((old.awaiting_scheduler, new.awaiting_scheduler))
        schedulers.replaced(old, new, at)

    w = ListWatch(PODS, None, None, PODS.store(), Events(), on_replace=on_replace)  # type: ignore[arg-type]
    w._apply(line("ADDED", pod("j-0-0", "u0", version="5")), "4")
    assert replaced == [] and schedulers.looked_at("default-scheduler") is None
    w._apply(line("MODIFIED", pod("j-0-0", "u0", node="n1", version="6")), "5")
    assert replaced == [("default-scheduler", None)]
    assert schedulers.looked_at("default-scheduler") == at
    assert schedulers.looked_at("volcano") is None
