"""Typed read access to the watch caches the reconcilers work from.

The operator's own list-and-watch (``runtime/listwatch.py``) keeps a store of TPUJobs,
TPUSlices, worker pods and TPU nodes, kopf an index of Kueue Workloads; every one is
filled before anything reconciles and maps a key to a collection of values; the keys:

- pods (the operator's own, ``runtime/ownership.py``): ("slice", ns, slice) / ("job", ns,
  job) (job-owned pods only) / ("node", node) / ("pool", node pool the pod is pinned to)
  -> PodView (orphans, being deleted, under their node and pool only; pods that only look
  like workers under ("foreign-pool", pool) / ("foreign-node", node), and both kinds under
  ("owner", TPUSlice UID)); and, counted per job, the restart
  attempts its pods belong to (``attempts_of_job``) and, per attempt, its pods that are
  neither ready nor finished (``unready_pods``; per slice of a job: ``unready_in_slice``);
  ("leaders", ns, job) -> worker 0 of each of the job's slices
- slices: ("slice", ns, name) / ("job", ns, job) -> TPUSlice body; ("pool", pool) -> the
  holder an active standalone slice's ``status.nodePool`` records
- jobs: ("job", ns, name) -> TPUJob body; ("pool", pool) -> the holder an active job's
  ``status.nodePools`` records (``reconcile/pools.py``, rule 2: looked up per pool, so
  an allocation does not read every job and slice of the cluster)
- nodes: ("node", name) / ("tpu",) -> NodeView
- workloads (only with ``--kueue``): (ns, job) -> the Kueue Workload owned by that TPUJob

Pods that were deleted leave a tombstone (their last state) so a gang can tell why a
worker vanished after the index forgot it.

``entries`` and ``forget`` serve the watch-gap audit (``runtime/audit.py``): every cached
object by its identity, and dropping one the API no longer has. A store files each object
under ``(namespace, name, uid)`` and removes it from every key at once on a DELETED event;
``forget`` does the same through the store's ``_discard``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tpu_operator.placement.dynamic import cube_lost, cube_lost_why
from tpu_operator.runtime.ownership import SliceOwners, slice_job_name
from tpu_operator.state.gang import SCHEDULER_GRACE_SECONDS
from tpu_operator.state.views import LostNodes, NodeView, PodView

Index = Mapping[Any, Collection[Any]]
TOMBSTONE_TTL = 3600.0
"""How long deleted pods' last states (and deleted TPUSlices' UIDs: ``SliceOwners``)
are kept."""
KINDS = ("pods", "slices", "jobs", "nodes")
"""The watched kinds, as ``entries`` and ``forget`` name them."""
Identity = tuple[str | None, str, str]
"""How kopf keys an indexed object: (namespace or None, name, uid)."""
POOL_RECORD = "pool"
"""First part of the TPUJob and TPUSlice index keys that file a pool's recorded holders."""
SPARES_HOLDER = ("spares",)
"""The TPUJob index key of the unfinished jobs that name or hold spare pools
(``reconcile/pools.holds_spares``)."""
T = TypeVar("T")


@dataclass
class NodeSnapshot:
    """The TPU nodes as plain dicts, rebuilt only after a node changed.

    Reconciles look nodes up for every pod of a job (is its node ready?) and aggregate
    node pools from every node of the cluster; through kopf's index each lookup builds
    mapping views, so at thousands of pods and nodes those scans dominated a reconcile.
    Nodes change rarely next to pods, so one snapshot serves every reconcile in between.
    """

    by_name: dict[str, NodeView]
    not_ready: frozenset[str]
    noticed: dict[str, str]
    """Node -> its notice of maintenance or termination (``NodeView.disruption_notice``),
    for the nodes that have one: a few at a time, where a job's pods are thousands."""
    terminating: list[tuple[float, str]] = field(default_factory=list)
    """(when GKE takes the VM back, node) for the nodes that say (flex-start VMs), in time
    order."""
    derived: dict[str, Any] = field(default_factory=dict)
    """Values computed from the nodes alone (node pools), kept as long as the snapshot."""
    lost_why: dict[str, str] = field(default_factory=dict)
    """Node -> why it is lost though Ready (its Ironwood cube's state), for those few."""


VERSIONS = itertools.count(1)
"""Version numbers of what the caches hold (``version`` methods here and in
``listwatch.Store``): drawn from one count, so a number is never seen twice in a process,
even from caches rebuilt from scratch."""


class Schedulers:
    """When each scheduler (by ``schedulerName``) last looked at a pod of the operator's:
    the moment a pod seen awaiting it was seen no longer awaiting it (bound, or marked
    unschedulable). Tells a scheduler working through a backlog from one that does not
    run (``state/gang.scheduler_wait``).

    Looks are seen only while the operator watches: from ``watching`` (its start) on,
    every scheduler counts as having looked then, so that a restart in the middle of a
    backlog does not report a busy scheduler as absent before it could see it look."""

    def __init__(self) -> None:
        self._looked: dict[str, dt.datetime] = {}
        self._quiet: set[str] = set()
        """Schedulers ``gone_quiet`` has named since their last look."""
        self._since: dt.datetime | None = None
        self._since_quiet = False

    def watching(self, since: dt.datetime) -> None:
        """The operator watches pods from ``since`` on."""
        self._since, self._since_quiet = since, False

    def replaced(self, old: PodView, new: PodView, now: dt.datetime) -> None:
        """A pod's cached view was replaced: note its scheduler's look, if this was one."""
        name = old.awaiting_scheduler
        if name is not None and new.awaiting_scheduler is None and new.deletion_deadline is None:
            self._looked[name] = now
            self._quiet.discard(name)

    def looked_at(self, name: str) -> dt.datetime | None:
        """Its last look, or the start of ``watching`` if later (None: neither)."""
        at, since = self._looked.get(name), self._since
        return since if since is not None and (at is None or at < since) else at

    def _silent(self, name: str, now: dt.datetime) -> float:
        """Seconds since ``looked_at(name)`` (0 when it has none)."""
        at = self.looked_at(name)
        return (now - at).total_seconds() if at is not None else 0.0

    def gone_quiet(
        self,
        now: dt.datetime,
        awaited: Callable[[], Iterable[str]] = list,
        grace: float = SCHEDULER_GRACE_SECONDS,
    ) -> list[str]:
        """The schedulers whose last look is ``grace`` seconds old, each named once per
        look: the pods still awaiting one have waited long enough to be reported, and
        their owners are woken to say so. Once ``watching`` began ``grace`` seconds ago,
        the schedulers ``awaited`` names that were not seen looking since are named too
        (once)."""
        quiet = {
            name
            for name in self._looked
            if name not in self._quiet and self._silent(name, now) >= grace
        }
        since = self._since
        if since is not None and not self._since_quiet and (now - since).total_seconds() >= grace:
            self._since_quiet = True
            quiet.update(name for name in awaited() if name not in self._looked)
        self._quiet.update(quiet)
        return sorted(quiet)


class Tombstones:
    """Last seen state of deleted worker pods, per gang member name."""

    def __init__(self) -> None:
        self._by_slice: dict[tuple[str, str], dict[str, tuple[PodView, float]]] = {}
        self._versions: dict[tuple[str, str], int] = {}

    def record(self, pod: PodView) -> None:
        key = (pod.namespace, pod.slice_name)
        self._by_slice.setdefault(key, {})[pod.name] = (pod, time.monotonic())
        self._versions[key] = next(VERSIONS)

    def version(self, namespace: str, slice_name: str) -> int:
        """A number that changes whenever the slice's tombstones do (0: it has none)."""
        return self._versions.get((namespace, slice_name), 0)

    def of_slice(self, namespace: str, slice_name: str, attempt: int) -> dict[str, PodView]:
        entries = self._by_slice.get((namespace, slice_name), {})
        return {name: pod for name, (pod, _) in entries.items() if pod.attempt == attempt}

    def forget_slice(self, namespace: str, slice_name: str) -> None:
        self._by_slice.pop((namespace, slice_name), None)
        self._versions.pop((namespace, slice_name), None)

    def prune(self) -> None:
        cutoff = time.monotonic() - TOMBSTONE_TTL
        for key in list(self._by_slice):
            entries = {n: e for n, e in self._by_slice[key].items() if e[1] >= cutoff}
            if len(entries) == len(self._by_slice[key]):
                continue
            if entries:
                self._by_slice[key] = entries
                self._versions[key] = next(VERSIONS)
            else:
                del self._by_slice[key]
                self._versions.pop(key, None)


def _values(index: Index, key: Any) -> list[Any]:
    return list(index.get(key, ()))


def _first(index: Index, key: Any) -> Any:
    for value in index.get(key, ()):
        return value
    return None


def identity_of(body: Mapping[str, Any]) -> Identity:
    """How an object is filed in the caches: (namespace or None, name, uid)."""
    meta = body.get("metadata") or {}
    return meta.get("namespace"), meta.get("name", ""), meta.get("uid", "")


class Caches:
    def __init__(self, *, pods: Index, slices: Index, jobs: Index, nodes: Index) -> None:
        self._pods = pods
        self._slices = slices
        self._jobs = jobs
        self._nodes = nodes
        self.tombstones = Tombstones()
        self.owners = SliceOwners()
        """The TPUSlices known by UID: which pods are the operator's (``ownership.py``)."""
        self.schedulers = Schedulers()
        self._audited = {"slices": slices, "jobs": jobs}
        self._workloads: Index | None = None
        self._node_snapshot: NodeSnapshot | None = None
        self.nodes_version = next(VERSIONS)
        """Changes with every node event (``nodes_changed``)."""
        self.dynamic_slicing_seen = False
        """A dynamically sliced TPUSlice was reconciled: a deleted TPUSlice may have GKE
        Slices to delete (``reconcile/slices.release_dynamic_slices``)."""

    # Kueue Workloads (docs/tasks/kueue.md)
    def attach_workloads(self, index: Index) -> None:
        """Serve Kueue Workloads from ``index`` (the operator runs with ``--kueue``)."""
        self._workloads = index

    @property
    def kueue(self) -> bool:
        """Whether Kueue-managed jobs are admitted through their Workloads."""
        return self._workloads is not None

    def workload_of_job(self, namespace: str, job: str) -> dict[str, Any] | None:
        if self._workloads is None:
            return None
        return _first(self._workloads, (namespace, job))

    # Audit
    def entries(self, kind: str) -> dict[Identity, Any]:
        """Every cached TPUSlice or TPUJob (``kind``: the kinds the audit lists) by
        identity, with its body."""
        if kind not in ("slices", "jobs"):
            raise ValueError(f"only TPUJobs and TPUSlices are audited, not {kind!r}")
        bodies = self.all_slices() if kind == "slices" else self.jobs()
        return {identity_of(body): body for body in list(bodies)}

    def forget(self, kind: str, identity: Identity) -> None:
        """Drop a TPUSlice or TPUJob from its store under every key, as its DELETED
        event would have (the watch that should have delivered it was interrupted)."""
        index = self._audited[kind]
        discard = getattr(index, "_discard", None)
        if discard is None:
            raise TypeError(f"{type(index).__name__} cannot drop entries")
        discard(identity)
        if kind == "slices":
            self.owners.gone(identity[2])

    # TPUJobs
    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _first(self._jobs, ("job", namespace, name))

    def jobs(self) -> Iterable[dict[str, Any]]:
        for key, store in self._jobs.items():
            if key[0] == "job":
                yield from store

    def jobs_holding_spares(self) -> Collection[dict[str, Any]]:
        """The unfinished TPUJobs that name or hold spare pools (``SPARES_HOLDER``)."""
        return self._jobs.get(SPARES_HOLDER, ())

    # Node pools recorded in status (``reconcile/pools.py``)
    def pool_records(self, pool: str) -> list[str]:
        """Holders whose status records ``pool``: active TPUJobs, then active standalone
        TPUSlices."""
        key = (POOL_RECORD, pool)
        return [*self._jobs.get(key, ()), *self._slices.get(key, ())]

    def recorded_pools(self) -> set[str]:
        """Every pool an active TPUJob or standalone TPUSlice records."""
        return {
            key[1]
            for index in (self._jobs, self._slices)
            for key, store in index.items()
            if key[0] == POOL_RECORD and store
        }

    # TPUSlices
    def slice(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _first(self._slices, ("slice", namespace, name))

    def slices_of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return _values(self._slices, ("job", namespace, job))

    def all_slices(self) -> Iterable[dict[str, Any]]:
        for key, store in self._slices.items():
            if key[0] == "slice":
                yield from store

    # Pods
    def pods_of_slice(self, namespace: str, slice_name: str) -> list[PodView]:
        return _values(self._pods, ("slice", namespace, slice_name))

    def pods_of_job(self, namespace: str, job: str) -> list[PodView]:
        return _values(self._pods, ("job", namespace, job))

    def awaiting(self, scheduler: str) -> list[PodView]:
        """The operator's pods that await ``scheduler`` (``PodView.awaiting_scheduler``)."""
        return _values(self._pods, ("awaiting", scheduler))

    def awaited_schedulers(self) -> list[str]:
        """The schedulers some pod of the operator's awaits (a walk of the pod index's
        keys: for the rare moment every scheduler counts as quiet, ``Schedulers``)."""
        return [key[1] for key in list(self._pods) if key[0] == "awaiting"]

    def leaders_of_job(self, namespace: str, job: str) -> list[PodView]:
        """Worker 0 of each of the job's slices, of any attempt (``listwatch.pod_keys``):
        199 pods of a 12,736-pod job, looked up without walking the others."""
        return _values(self._pods, ("leaders", namespace, job))

    def attempts_of_job(self, namespace: str, job: str) -> Collection[int]:
        """The restart attempts the job's cached pods belong to, each once: read from the
        pod store's counts (``listwatch.Store``, ``pod_tally``) instead of the job's
        pods, which every slice of a 12,736-host job would otherwise walk on each of its
        reconciles. A plain mapping (unit tests' indexes) is walked."""
        counts = getattr(self._pods, "counts", None)
        if counts is not None:
            return cast(Mapping[int, int], counts(("job", namespace, job))).keys()
        return {p.attempt for p in self.pods_of_job(namespace, job)}

    def unready_pods(self, namespace: str, gang: str, attempt: int) -> int | None:
        """How many cached pods of ``attempt`` in the gang (a job, or a standalone slice:
        its pods' job name) are neither ready nor finished, from the pod store's counts;
        None when the pods are a plain mapping (unit tests' indexes)."""
        return self._unready(("unready", namespace, gang), attempt)

    def unready_in_slice(self, namespace: str, slice_name: str, attempt: int) -> int | None:
        """How many cached pods of ``attempt`` in a job's slice are neither ready nor
        finished (``unready_pods`` for one slice of a job); None when the pods are a plain
        mapping (unit tests' indexes)."""
        return self._unready(("unready-slice", namespace, slice_name), attempt)

    def unstarted_in_slice(self, namespace: str, slice_name: str, attempt: int) -> int | None:
        """How many cached pods of ``attempt`` in a job's slice are neither ready nor
        finished and have no running container (not Running, or no IP yet); None when the
        pods are a plain mapping (unit tests' indexes)."""
        return self._unready(("unstarted-slice", namespace, slice_name), attempt)

    def _unready(self, group: tuple[str, str, str], attempt: int) -> int | None:
        """The pod store's count of ``attempt`` in an unready group (``pod_tally``)."""
        counts = getattr(self._pods, "counts", None)
        if counts is None:
            return None
        return cast(Mapping[int, int], counts(group)).get(attempt, 0)

    def pods_version(self, namespace: str, slice_name: str) -> int | None:
        """A number that changes whenever a pod of the slice changes, comes or goes
        (``listwatch.Store.version``); None when the pods are a plain mapping (unit
        tests' indexes), which keeps no versions."""
        version = getattr(self._pods, "version", None)
        return None if version is None else cast(int, version(("slice", namespace, slice_name)))

    def count_pods_of_slice(self, namespace: str, slice_name: str) -> int:
        return len(self._pods.get(("slice", namespace, slice_name), ()))

    def count_pods_of_job(self, namespace: str, job: str) -> int:
        return len(self._pods.get(("job", namespace, job), ()))

    def pods_on_node(self, node: str) -> list[PodView]:
        return _values(self._pods, ("node", node))

    def pods_in_pool(self, pool: str) -> list[PodView]:
        """Worker pods pinned to ``pool`` that still exist (any owner, any phase)."""
        return _values(self._pods, ("pool", pool))

    def foreign_pods(self, pool: str, nodes: Iterable[str] = ()) -> list[PodView]:
        """Pods with the operator's labels that are not its workers (``ownership.py``),
        pinned to ``pool`` or running on one of ``nodes``: they compete for its chips."""
        found = {p.uid: p for p in self._pods.get(("foreign-pool", pool), ())}
        for node in nodes:
            found.update((p.uid, p) for p in self._pods.get(("foreign-node", node), ()))
        return list(found.values())

    def pinned_pools(self) -> Iterable[str]:
        """Node pools that some existing worker pod is pinned to."""
        for key in list(self._pods):
            if isinstance(key, tuple) and key and key[0] == "pool":
                yield key[1]

    # Nodes
    def nodes_changed(self) -> None:
        """A node event arrived (or the audit dropped a node): the next lookup rebuilds the
        snapshot. Called from the node index handler and again from the node event
        handler, which runs after kopf stored the change, so a snapshot built in between
        never outlives the event."""
        self._node_snapshot = None
        self.nodes_version = next(VERSIONS)

    def _nodes_now(self) -> NodeSnapshot:
        snapshot = self._node_snapshot
        if snapshot is None:
            by_name = {
                key[1]: view
                for key, store in list(self._nodes.items())
                if key[0] == "node"
                for view in store
            }
            snapshot = NodeSnapshot(
                by_name,
                # A node of a cube GKE marks unusable is lost to the slice on it
                # (placement/dynamic.py).
                frozenset(n for n, v in by_name.items() if not v.ready or cube_lost(v)),
                {n: v.disruption_notice for n, v in by_name.items() if v.disruption_notice},
                sorted((v.terminates_at, n) for n, v in by_name.items() if v.terminates_at),
                lost_why={
                    n: cube_lost_why(v) for n, v in by_name.items() if v.ready and cube_lost(v)
                },
            )
            self._node_snapshot = snapshot
        return snapshot

    def node(self, name: str) -> NodeView | None:
        return self._nodes_now().by_name.get(name)

    def noticed_nodes(self) -> Mapping[str, str]:
        """The TPU nodes with a notice of maintenance or termination, and the notice."""
        return self._nodes_now().noticed

    def terminating_nodes(self, before: float) -> dict[str, float]:
        """The TPU nodes GKE takes back before ``before`` (Unix time), and when."""
        found: dict[str, float] = {}
        for when, name in self._nodes_now().terminating:
            if when >= before:
                break
            found[name] = when
        return found

    def tpu_nodes(self) -> list[NodeView]:
        return list(self._nodes_now().by_name.values())

    def from_nodes(self, name: str, build: Callable[[list[NodeView]], T]) -> T:
        """``build(tpu_nodes)``, computed once per node snapshot and kept under ``name``;
        ``build`` must be pure and its result is shared, so callers must not change it."""
        snapshot = self._nodes_now()
        if name not in snapshot.derived:
            snapshot.derived[name] = build(list(snapshot.by_name.values()))
        return snapshot.derived[name]

    def not_ready_nodes(self, names: Iterable[str | None]) -> frozenset[str]:
        """The nodes among ``names`` that are not Ready or no longer exist, or are lost to
        their pods otherwise (``LostNodes.why`` says how)."""
        snapshot = self._nodes_now()
        by_name, not_ready = snapshot.by_name, snapshot.not_ready
        lost = [n for n in names if n and (n in not_ready or n not in by_name)]
        why = snapshot.lost_why
        return LostNodes(lost, {n: why[n] for n in lost if n in why} if why else None)


def slice_sharing(body: Mapping[str, Any]) -> int:
    """How many slices share the pace of a TPUSlice's counter writes and routine
    reconciles (``reconcile/pacing.py``, ``shared_interval``): its job's ``numSlices``,
    1 for a standalone slice."""
    if slice_job_name(body) is None:
        return 1
    slices = (body.get("spec") or {}).get("numSlices")
    return slices if isinstance(slices, int) and slices > 1 else 1
