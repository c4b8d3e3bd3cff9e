"""An in-memory API server and watch caches for unit tests of the reconcilers.

``FakeCluster`` keeps objects by REST path and answers the operator's ``Kube`` calls the
way the apiserver does where the reconcilers depend on it: 409 on a create of an existing
name and on a status write whose resourceVersion is stale, merge patches (RFC 7386),
graceful pod deletion (a deletionTimestamp first, gone when the test says the kubelet
confirmed). Every request is recorded, so tests
count status writes and conflicts per scenario.

The watch caches are built from the stored objects with the operator's own views and
index keys (``runtime/listwatch.py``, ``reconcile/cached.py``), so the reconcilers read
exactly the views they read in a cluster, as if every watch were in sync. A test drives
time with ``advance`` and the control loop with ``reconcile_job`` / ``reconcile_slice`` /
``settle``.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_operator import contract
from tpu_operator.reconcile.cached import job_keys, slice_keys, snapshot
from tpu_operator.reconcile.context import Context, Reservations
from tpu_operator.reconcile.expectations import CreatedPods, DeletedPods
from tpu_operator.reconcile.jobs import JobReconciler
from tpu_operator.reconcile.pacing import StatusPacer
from tpu_operator.reconcile.slices import SliceReconciler
from tpu_operator.runtime.caches import Caches, identity_of
from tpu_operator.runtime.events import ObjectRef
from tpu_operator.runtime.kube import ApiError, namespaced
from tpu_operator.runtime.listwatch import PODS, node_keys
from tpu_operator.state.views import node_view, pod_view

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NS = "ml"


class ManualClock:
    """A monotonic clock that a test moves by hand (set ``now``); pass it as ``clock=``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Apply a JSON merge patch in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def run_sync(coroutine: Any) -> Any:
    """Run a coroutine that never suspends (the kopf index functions) to its result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the coroutine awaited something")


def _selected(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class QueueRecorder:
    """A work queue that records what was asked of it (``WorkQueue.add``): each key with
    whether it was urgent, and, in step, whether it was routine and whether at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, bool]] = []
        self.routine: list[bool] = []
        self.at_once: list[bool] = []

    @property
    def keys(self) -> list[Any]:
        return [key for key, _ in self.calls]

    def add(
        self,
        key: Any,
        after: float = 0.0,
        *,
        urgent: bool = False,
        routine: bool = False,
        at_once: bool = False,
    ) -> None:
        self.calls.append((key, urgent))
        self.routine.append(routine)
        self.at_once.append(at_once)


@dataclass
class Request:
    verb: str
    path: str
    code: int


@dataclass
class Recorded:
    events: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(kind/name of the object, type, reason, message)"""
    restarts: list[tuple[str, str]] = field(default_factory=list)
    pods_created: int = 0
    running_after: list[float] = field(default_factory=list)
    waits: list[tuple[str, float]] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)
    enqueued: list[Any] = field(default_factory=list)

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((f"{ref.kind}/{ref.name}", type_, str(reason), message))

    def pod_created(self, seconds: float) -> None:
        self.pods_created += 1

    def restart(self, kind: str, reason: str) -> None:
        self.restarts.append((kind, str(reason)))

    def time_to_running(self, seconds: float) -> None:
        self.running_after.append(seconds)

    def waited(self, reason: str, seconds: float) -> None:
        self.waits.append((reason, seconds))

    def slice_moved(self, to: str) -> None:
        self.moves.append(to)

    def add(
        self, key: Any, after: float = 0.0, *, urgent: bool = False, routine: bool = False
    ) -> None:
        self.enqueued.append(key)

    def reasons(self, name: str | None = None, kind: str = contract.JOB_KIND) -> list[str]:
        """Reasons of the events posted for one object (a TPUJob unless ``kind`` says)."""
        return [r for n, _, r, _ in self.events if name is None or n == f"{kind}/{name}"]


class FakeCluster:
    """The API server (as ``Kube``) plus the control loop around the two reconcilers."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.now = T0
        self.monotonic = 1000.0
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self.conflict_next_status_write: set[str] = set()
        """Names whose next status write fails with 409 (a concurrent writer)."""
        self.refusing: dict[str, ApiError] = {}
        """Creates of paths containing a key are refused with its error (an admission
        policy or webhook in the way), until the test removes it."""
        self.lagging: dict[str, dict[str, Any] | None] = {}
        """Objects whose watch trails the API: path -> what the caches show instead (None:
        not there yet), until the test removes the entry (``lag``)."""
        self.recorded = Recorded()
        self.tombstones_seen: list[str] = []
        self.caches = Caches(pods={}, slices={}, jobs={}, nodes={})
        self.ctx = Context(
            kube=self,  # type: ignore[arg-type]
            caches=self.caches,
            events=self.recorded,
            jobs=self.recorded,
            slices=self.recorded,
            metrics=self.recorded,
            reservations=Reservations(),
            clock=lambda: self.now,
            pacer=StatusPacer(clock=lambda: self.monotonic),
            created_pods=CreatedPods(clock=lambda: self.monotonic),
            deleted_pods=DeletedPods(clock=lambda: self.monotonic),
        )
        self.jobs = JobReconciler(self.ctx)
        self.slices = SliceReconciler(self.ctx)

    # Kube
    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        for fragment, error in self.refusing.items():
            if fragment in path:
                self.requests.append(Request("POST", path, error.status))
                raise error
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        key = f"{path}/{meta['name']}"
        if key in self.objects:
            self.requests.append(Request("POST", path, 409))
            return False
        meta.update(
            uid=f"uid-{next(self._uid)}",
            resourceVersion=str(next(self._rv)),
            creationTimestamp=stamp(self.now),
            generation=1,
        )
        if "/pods" in path:
            obj.setdefault("status", {"phase": "Pending"})
        self.objects[key] = obj
        self.requests.append(Request("POST", path, 201))
        return True

    async def get(self, path: str) -> dict[str, Any] | None:
        self.requests.append(Request("GET", path, 200 if path in self.objects else 404))
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def request(
        self, verb: str, path: str, *, query: Mapping[str, str] | None = None, **_: Any
    ) -> dict[str, Any]:
        """A LIST (the only other request the reconcilers send through it), by label."""
        assert verb == "GET", verb
        selector = (query or {}).get("labelSelector", "")
        items = [
            copy.deepcopy(o)
            for key, o in self.objects.items()
            if key.rpartition("/")[0] == path
            and _selected(o["metadata"].get("labels") or {}, selector)
        ]
        self.requests.append(Request("GET", path, 200))
        return {"items": items}

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        status_write = path.endswith("/status")
        key = path.removesuffix("/status")
        obj = self.objects.get(key)
        if obj is None:
            self.requests.append(Request("PATCH", path, 404))
            raise ApiError("PATCH", path, 404, "NotFound", "not found")
        meta = obj["metadata"]
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        forced = status_write and meta["name"] in self.conflict_next_status_write
        if forced or (expected is not None and expected != meta["resourceVersion"]):
            self.conflict_next_status_write.discard(meta["name"])
            self.requests.append(Request("PATCH", path, 409))
            raise ApiError("PATCH", path, 409, "Conflict", "the object has been modified")
        if status_write:
            obj.setdefault("status", {})
            merge(obj["status"], patch.get("status") or {})
        else:
            if "spec" in patch:
                obj.setdefault("spec", {})
                merge(obj["spec"], patch["spec"])
                meta["generation"] = meta.get("generation", 1) + 1
            if "metadata" in patch:
                merge(meta, {k: v for k, v in patch["metadata"].items() if k != "resourceVersion"})
        meta["resourceVersion"] = str(next(self._rv))
        self.requests.append(Request("PATCH", path, 200))
        return copy.deepcopy(obj)

    async def delete(
        self,
        path: str,
        *,
        grace_seconds: int | None = None,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> None:
        obj = self.objects.get(path)
        if obj is None or (uid is not None and obj["metadata"]["uid"] != uid):
            self.requests.append(Request("DELETE", path, 404 if obj is None else 409))
            return
        self.requests.append(Request("DELETE", path, 200))
        if "/pods/" in path and grace_seconds != 0:
            obj["metadata"].setdefault("deletionTimestamp", stamp(self.now))
        else:
            self._remove(path)

    def _remove(self, path: str, collect: bool = True) -> None:
        obj = self.objects.pop(path)
        if "/pods/" in path:
            view = pod_view(obj)
            if view is not None:
                self.caches.tombstones.record(view)
        if f"/{contract.JOB_PLURAL}/" in path and collect:
            self.collect_garbage()

    def collect_garbage(self) -> None:
        """The garbage collector: objects whose owner references all name objects that no
        longer exist are deleted (pods at once, as if their kubelet confirmed)."""
        while True:
            uids = {o["metadata"].get("uid") for o in self.objects.values()}
            orphans = [
                key
                for key, child in self.objects.items()
                if (refs := child["metadata"].get("ownerReferences"))
                and not any(r.get("uid") in uids for r in refs)
            ]
            if not orphans:
                return
            for key in orphans:
                self._remove(key)

    # request accounting
    def status_writes(self, plural: str = contract.JOB_PLURAL) -> tuple[int, int]:
        """(successful, conflicting) status writes to objects of ``plural``."""
        writes = [r for r in self.requests if r.verb == "PATCH" and r.path.endswith("/status")]
        writes = [r for r in writes if f"/{plural}/" in r.path]
        return sum(r.code == 200 for r in writes), sum(r.code == 409 for r in writes)

    def clear_requests(self) -> None:
        self.requests.clear()

    # objects
    def add_node(self, name: str, pool: str, accelerator: str, topology: str, chips: int = 4):
        labels = {
            contract.NODE_LABEL_NODEPOOL: pool,
            contract.NODE_LABEL_ACCELERATOR: accelerator,
            contract.NODE_LABEL_TOPOLOGY: topology,
        }
        self.objects[f"/api/v1/nodes/{name}"] = {
            "metadata": {"name": name, "labels": labels, "uid": f"node-{name}"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": {contract.TPU_RESOURCE: str(chips)},
            },
        }

    def add_pool(self, pool: str, accelerator: str, topology: str, hosts: int) -> list[str]:
        names = [f"{pool}-n{i}" for i in range(hosts)]
        for name in names:
            self.add_node(name, pool, accelerator, topology)
        return names

    def set_node_ready(self, name: str, ready: bool) -> None:
        node = self.objects[f"/api/v1/nodes/{name}"]
        node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    def apply_job(self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None):
        path = namespaced(NS, contract.JOB_PLURAL, group=contract.GROUP, version=contract.VERSION)
        body = {
            "apiVersion": contract.API_VERSION,
            "kind": contract.JOB_KIND,
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": spec,
        }
        run_sync(self.create(path, body))
        self.requests.pop()

    def apply_slice(self, name: str, spec: dict[str, Any]) -> None:
        path = namespaced(NS, contract.SLICE_PLURAL, group=contract.GROUP, version=contract.VERSION)
        body = {
            "apiVersion": contract.API_VERSION,
            "kind": contract.SLICE_KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }
        run_sync(self.create(path, body))
        self.requests.pop()

    def job(self, name: str) -> dict[str, Any]:
        return self.objects[
            namespaced(
                NS, contract.JOB_PLURAL, name, group=contract.GROUP, version=contract.VERSION
            )
        ]

    def slice(self, name: str) -> dict[str, Any]:
        return self.objects[
            namespaced(
                NS, contract.SLICE_PLURAL, name, group=contract.GROUP, version=contract.VERSION
            )
        ]

    def edit_job(self, name: str, spec: Mapping[str, Any]) -> None:
        job = self.job(name)
        merge(job["spec"], spec)
        job["metadata"]["generation"] += 1
        job["metadata"]["resourceVersion"] = str(next(self._rv))

    def delete_job(self, name: str, collect: bool = True) -> None:
        """Delete a TPUJob; its slices and their pods go with it unless ``collect`` is
        False (the garbage collector has not got to them yet: ``collect_garbage``)."""
        self._remove(self.job_path(name), collect)

    def pods(self, owner: str | None = None) -> dict[str, dict[str, Any]]:
        """Worker pods by name (of one job or standalone slice, if ``owner`` is given)."""
        found = {}
        for key, obj in self.objects.items():
            if "/pods/" not in key:
                continue
            labels = obj["metadata"].get("labels") or {}
            if owner is None or owner in (
                labels.get(contract.LABEL_JOB_NAME),
                labels.get(contract.LABEL_SLICE_NAME),
            ):
                found[obj["metadata"]["name"]] = obj
        return found

    # what the scheduler and kubelets do
    def run_pods(self, owner: str | None = None, *, ready: bool = True) -> None:
        """Schedule and start every Pending, not deleted pod (on a node of its pool)."""
        nodes = [o for k, o in self.objects.items() if k.startswith("/api/v1/nodes/")]
        taken = {p.get("spec", {}).get("nodeName") for p in self.pods().values()}
        for pod in self.pods(owner).values():
            if pod["metadata"].get("deletionTimestamp") or pod["status"]["phase"] != "Pending":
                continue
            pool = (pod["spec"].get("nodeSelector") or {}).get(contract.NODE_LABEL_NODEPOOL)
            free = [
                n["metadata"]["name"]
                for n in nodes
                if n["metadata"]["name"] not in taken
                and (pool is None or n["metadata"]["labels"][contract.NODE_LABEL_NODEPOOL] == pool)
            ]
            if free:
                node = free[0]
            else:  # single-host slices: a VM of a matching pool, made on demand
                node = f"node-of-{pod['metadata']['name']}"
                selector = pod["spec"].get("nodeSelector") or {}
                self.add_node(
                    node,
                    "single-host",
                    selector.get(contract.NODE_LABEL_ACCELERATOR, ""),
                    selector.get(contract.NODE_LABEL_TOPOLOGY, ""),
                )
            taken.add(node)
            pod["spec"]["nodeName"] = node
            self._set_pod(pod, "Running", ready=ready)

    def set_ready(self, pod_name: str, ready: bool) -> None:
        self._set_pod(self.pods()[pod_name], "Running", ready=ready)

    def exit_pod(self, pod_name: str, code: int, *, at: dt.datetime | None = None) -> None:
        pod = self.pods()[pod_name]
        self._set_pod(pod, "Succeeded" if code == 0 else "Failed", exit_code=code, at=at)

    def exit_container(self, pod_name: str, code: int) -> None:
        """The worker container ends; the kubelet has not yet written the pod's phase."""
        pod = self.pods()[pod_name]
        self._set_pod(pod, pod["status"]["phase"], exit_code=code)

    def evict_pod(self, pod_name: str, reason: str = "PreemptionByScheduler") -> None:
        pod = self.pods()[pod_name]
        pod["status"].setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": reason}
        )
        pod["metadata"]["deletionTimestamp"] = stamp(self.now)

    def _set_pod(
        self,
        pod: dict[str, Any],
        phase: str,
        *,
        ready: bool = False,
        exit_code: int | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        status = pod["status"]
        status["phase"] = phase
        status["startTime"] = status.get("startTime") or stamp(self.now)
        status["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "Ready"]
        status["conditions"].append({"type": "Ready", "status": "True" if ready else "False"})
        if exit_code is not None:
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "finishedAt": stamp(at or self.now),
            }
            status["containerStatuses"] = [
                {"name": contract.WORKER_CONTAINER, "state": {"terminated": terminated}}
            ]
        pod["metadata"]["resourceVersion"] = str(next(self._rv))

    def confirm_deletions(self) -> int:
        """Kubelets confirm every pod marked for deletion: those pods are gone."""
        doomed = [
            k
            for k, o in self.objects.items()
            if "/pods/" in k and o["metadata"].get("deletionTimestamp")
        ]
        for key in doomed:
            self._remove(key)
        return len(doomed)

    def confirm_deletion(self, pod_name: str) -> None:
        """The kubelet of one pod marked for deletion confirms it: the pod is gone."""
        (key,) = [
            k
            for k, o in self.objects.items()
            if "/pods/" in k
            and o["metadata"]["name"] == pod_name
            and o["metadata"].get("deletionTimestamp")
        ]
        self._remove(key)

    # time and the control loop
    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.monotonic += seconds

    def lag(self, path: str) -> None:
        """From now on the caches show the object at ``path`` as it is now (or, if it does
        not exist, not at all) until ``self.lagging.pop(path)``: its watch trails."""
        obj = self.objects.get(path)
        self.lagging[path] = copy.deepcopy(obj) if obj is not None else None

    def job_path(self, name: str) -> str:
        return namespaced(
            NS, contract.JOB_PLURAL, name, group=contract.GROUP, version=contract.VERSION
        )

    def slice_path(self, name: str) -> str:
        return namespaced(
            NS, contract.SLICE_PLURAL, name, group=contract.GROUP, version=contract.VERSION
        )

    def _cached_objects(self) -> dict[str, dict[str, Any]]:
        """The objects as the watch caches show them (``lagging`` ones as they were)."""
        shown = dict(self.objects)
        for path, then in self.lagging.items():
            if then is None:
                shown.pop(path, None)
            else:
                shown[path] = then
        return shown

    def _index(self) -> None:
        """Rebuild the watch caches from the stored objects (watches in sync, but for the
        ``lagging`` ones)."""
        indexes: dict[str, defaultdict[Any, list[Any]]] = {
            kind: defaultdict(list) for kind in ("slices", "jobs", "nodes")
        }
        pods = PODS.store()
        shown = self._cached_objects()
        owners = self.caches.owners  # the TPUSlices known by UID, as kopf's index tells them
        slices = {
            o["metadata"]["uid"]: o for k, o in shown.items() if f"/{contract.SLICE_PLURAL}/" in k
        }
        for uid in owners.live_uids() - slices.keys():
            owners.gone(uid)
        for body in slices.values():
            owners.known(body)
        for key, obj in shown.items():
            if key.startswith("/api/v1/nodes/"):
                node = node_view(obj)
                kind, keys = "nodes", node_keys(node)
            elif "/pods/" in key:
                view = pod_view(obj, owners.ownership, owners.carried)
                if view is not None:  # the operator's own pod store, with its counts
                    pods.put(identity_of(obj), view)
                    self.ctx.pods_in_flight.seen(view)  # as the pod event handler does
                continue
            elif f"/{contract.SLICE_PLURAL}/" in key:
                kind = "slices"
                keys = slice_keys(snapshot(obj))
            elif f"/{contract.JOB_PLURAL}/" in key:
                kind = "jobs"
                keys = job_keys(snapshot(obj))
            else:
                continue
            for index_key, value in (keys or {}).items():
                indexes[kind][index_key].append(value)
        tombstones = self.caches.tombstones
        seen = self.caches.dynamic_slicing_seen  # the operator's memory, not a cache
        self.caches.__init__(  # type: ignore[misc]
            pods=pods,
            slices=indexes["slices"],
            jobs=indexes["jobs"],
            nodes=indexes["nodes"],
        )
        self.caches.tombstones = tombstones
        self.caches.dynamic_slicing_seen = seen
        self.caches.owners = owners

    def reconcile_job(self, name: str) -> float | None:
        self._index()
        return asyncio.run(self.jobs((NS, name)))

    def reconcile_slice(self, name: str) -> float | None:
        self._index()
        return asyncio.run(self.slices((NS, name)))

    def _round(self) -> int:
        """Reconcile every slice, then every job; the number of writes it made."""
        before = len([r for r in self.requests if r.verb != "GET"])
        self._index()
        for key in [k for k in self.objects if f"/{contract.SLICE_PLURAL}/" in k]:
            if key in self.objects:
                self.reconcile_slice(self.objects[key]["metadata"]["name"])
        for key in [k for k in self.objects if f"/{contract.JOB_PLURAL}/" in k]:
            if key in self.objects:
                self.reconcile_job(self.objects[key]["metadata"]["name"])
        return len([r for r in self.requests if r.verb != "GET"]) - before

    def settle(self, rounds: int = 10) -> None:
        """Run the control loop until nothing more is written, then once more after the
        status pacing interval (1 s) so that writes that only move counters go out."""
        for flush in (False, True):
            for _ in range(rounds):
                if not self._round():
                    break
            else:
                raise AssertionError(f"no steady state after {rounds} rounds")
            if not flush:
                self.advance(1.0)
