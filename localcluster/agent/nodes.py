"""Node registration and heartbeats for every simulated node, as kubelets would do them.

Each node is registered with its status (capacity, allocatable, addresses, a Ready
condition) and gets a Lease in ``kube-node-lease``; the real node-lifecycle controller
then keeps it Ready as long as the lease is renewed within ``--node-monitor-grace-period``.

Registration at start-up (``add_pools``) sends every pool's node and lease POSTs through
one bounded queue (``register_concurrency`` nodes in flight, whatever the pool boundaries:
with 8 the rate fell from 110 to 60 nodes a second over 4,096 nodes on 2 busy cores, with
32 it held 130), and logs its progress every ``PROGRESS_SECONDS`` when it runs that long
(thousands of nodes take minutes on a small machine).

Renewals are cheap merge-patches of ``spec.renewTime``, spread evenly over the renewal
interval (node *i* of *N* is offset by ``i/N`` of it; nodes registered together, as all
the start-up pools are, are spread as one set) and sent with bounded concurrency,
so hundreds of nodes cost a steady trickle of requests instead of a burst every interval.
Each renewal costs the apiserver and etcd a write: a scale run with thousands of nodes
keeps them to a few a second with a long grace period (``bench/harness.quiet_grace``).
The interval is 40 % of the grace period: a renewal is always seen at least once per
grace period even with the controller's 2 s monitor period and a slow request. A renewal
that fails (the apiserver restarting) is retried after ``RENEW_RETRY`` seconds, not a
whole interval later, as the kubelet's lease controller backs off from 200 ms: otherwise
an outage of a few seconds would leave leases stale past the grace period once the
apiserver is back, and the node-lifecycle controller would mark healthy nodes NotReady.

Faults: a partitioned node stops renewing (and is reported Ready=Unknown at once, as the
controller would after the grace period); a not-ready node keeps renewing but reports
Ready=False; a deleted node disappears with its lease.

When the node-lifecycle controller marks a healthy node Ready=Unknown anyway (its leases
looked stale because the apiserver was away for most of a grace period), the agent reports
Ready=True again as soon as it sees that on its node watch, as a kubelet does on its next
status update; the controller then lifts the ``unreachable`` taints.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from localcluster.agent.ipam import Block
from localcluster.agent.kube import MERGE_PATCH, STRATEGIC_PATCH, Kube
from localcluster.agent.status import micro_now, now
from localcluster.binaries import KUBERNETES
from localcluster.pools import Pool

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
# Reported as the node's kubelet version: the control plane's own version, as on GKE.
KUBELET_VERSION = KUBERNETES.version
LEASE_DURATION = 40
RENEW_RETRY = 1.0
PROGRESS_SECONDS = 10.0
"""A registration that runs longer logs how far it got this often."""
Health = Literal["ready", "partitioned", "not-ready"]


@dataclass
class SimNode:
    name: str
    pool: Pool
    ip: str
    uid: str = ""
    health: Health = "ready"
    deleted: bool = False


@dataclass
class NodeManager:
    kube: Kube
    block: Block
    grace_period: float
    concurrency: int = 8
    """Lease renewals (and node removals) in flight."""
    register_concurrency: int = 32
    """Node registrations (a node POST, then its lease's) in flight."""
    nodes: dict[str, SimNode] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.interval = max(1.0, self.grace_period * 0.4)
        self._schedule: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        self._failing: set[str] = set()
        self._reasserting: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._semaphore = asyncio.Semaphore(self.concurrency)
        self._registering = asyncio.Semaphore(self.register_concurrency)
        self._wake = asyncio.Event()

    # Registration -------------------------------------------------------------------

    async def add_pools(self, pools: Iterable[Pool]) -> list[str]:
        """Register the start-up pools: all their nodes through one bounded queue (no
        barrier between pools), their renewals spread as one set."""
        batches = [(pool, self._claim(pool, None)) for pool in pools]
        nodes = [node for _, batch in batches for node in batch]
        await self._register_all(nodes)
        self._spread(nodes)
        for pool, batch in batches:
            log.info("registered pool %s: %d node(s), mode %s", pool.name, len(batch), pool.mode)
        return [node.name for node in nodes]

    async def add_pool(self, pool: Pool, count: int | None = None) -> list[str]:
        """Register a pool with its first ``count`` VMs (default: ``pool.initial_count``)."""
        nodes = self._claim(pool, count)
        return await self._add(pool, nodes)

    def _claim(self, pool: Pool, count: int | None) -> list[SimNode]:
        """Record ``pool`` and its first ``count`` VMs (not registered yet)."""
        if pool.name in self.pools:
            raise ValueError(f"pool {pool.name!r} already exists")
        clash = [n for n in pool.node_names() if n in self.nodes]
        if clash:
            raise ValueError(f"pool {pool.name!r}: node names {clash} already exist")
        self.pools[pool.name] = pool
        names = pool.node_names()[: pool.initial_count if count is None else count]
        return self._new_nodes(pool, names)

    def _new_nodes(self, pool: Pool, names: list[str]) -> list[SimNode]:
        nodes = [SimNode(name, pool, self.block.node_ip(name)) for name in names]
        for node in nodes:
            self.nodes[node.name] = node
        return nodes

    async def add_nodes(self, pool: Pool, names: list[str]) -> list[str]:
        """Register more VMs of a registered pool (the cluster autoscaler scaling it up)."""
        return await self._add(pool, self._new_nodes(pool, names))

    async def _add(self, pool: Pool, nodes: list[SimNode]) -> list[str]:
        await self._register_all(nodes)
        self._spread(nodes)
        log.info("registered pool %s: %d node(s), mode %s", pool.name, len(nodes), pool.mode)
        return [node.name for node in nodes]

    async def _register_all(self, nodes: list[SimNode]) -> None:
        """Register ``nodes`` (``register_concurrency`` at a time), logging progress every
        ``PROGRESS_SECONDS`` while it lasts."""
        done = 0
        started = time.monotonic()

        async def register(node: SimNode) -> None:
            nonlocal done
            async with self._registering:
                await self._register(node)
            done += 1

        async def progress() -> None:
            while True:
                await asyncio.sleep(PROGRESS_SECONDS)
                elapsed = time.monotonic() - started
                log.info(
                    "registering nodes: %d of %d after %.0f s (%.0f a second)",
                    done, len(nodes), elapsed, done / elapsed,
                )  # fmt: skip

        reporter = asyncio.create_task(progress(), name="registration-progress")
        try:
            await asyncio.gather(*(register(node) for node in nodes))
        finally:
            reporter.cancel()

    async def remove_pool(self, name: str) -> list[str]:
        pool = self.pools.pop(name, None)
        if pool is None:
            raise KeyError(name)
        names = [n for n in pool.node_names() if n in self.nodes and not self.nodes[n].deleted]
        await asyncio.gather(*(self._bounded(self.delete_node(n)) for n in names))
        return names

    async def _register(self, node: SimNode) -> None:
        manifest = node.pool.node_manifest(node.name, node.ip, KUBELET_VERSION)
        manifest["status"]["conditions"] = self._conditions("True")
        status, body = await self.kube.request("POST", "/api/v1/nodes", manifest)
        if status == 409:  # left from an earlier agent: take it over
            body = await self.kube.call(
                "PATCH",
                f"/api/v1/nodes/{node.name}",
                {"metadata": manifest["metadata"], "spec": manifest["spec"]},
                content_type=MERGE_PATCH,
            )
            await self._patch_status(node, {"status": manifest["status"]})
        elif status >= 300:
            raise RuntimeError(f"registering node {node.name}: HTTP {status}: {body}")
        node.uid = body["metadata"]["uid"]
        await self._create_lease(node)

    async def _create_lease(self, node: SimNode) -> None:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node.name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
                ],
            },
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": LEASE_DURATION,
                "renewTime": micro_now(),
            },
        }
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        for _ in range(50):  # the namespace is created by the apiserver shortly after start
            status, body = await self.kube.request("POST", path, lease)
            if status < 300 or status == 409:
                return
            if status != 404:
                raise RuntimeError(f"creating lease of {node.name}: HTTP {status}: {body}")
            await asyncio.sleep(0.2)
        raise RuntimeError(f"namespace {LEASE_NAMESPACE} never appeared")

    def _conditions(self, ready: str, reason: str = "KubeletReady", message: str = "") -> list[Any]:
        stamp = now()
        pressure = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHas{suffix}",
                "message": f"kubelet has {text}",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind, suffix, text in (
                ("MemoryPressure", "SufficientMemory", "sufficient memory available"),
                ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                ("PIDPressure", "SufficientPID", "sufficient PID available"),
            )
        ]
        return [
            *pressure,
            {
                "type": "Ready",
                "status": ready,
                "reason": reason,
                "message": message or "kubelet is posting ready status",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            },
        ]

    async def _patch_status(self, node: SimNode, body: dict[str, Any]) -> None:
        await self.kube.call(
            "PATCH", f"/api/v1/nodes/{node.name}/status", body, content_type=STRATEGIC_PATCH
        )

    # Heartbeats -----------------------------------------------------------------------

    def _spread(self, nodes: list[SimNode]) -> None:
        start = time.monotonic()
        for index, node in enumerate(nodes):
            offset = self.interval * index / max(1, len(nodes))
            self._plan(node.name, start + offset)
        self._wake.set()

    def _plan(self, name: str, due: float) -> None:
        """Renew ``name``'s lease at ``due`` (its only scheduled renewal)."""
        self._due[name] = due
        heapq.heappush(self._schedule, (due, name))

    async def run(self) -> None:
        """Renew leases forever (cancel to stop)."""
        pending: set[asyncio.Task[None]] = set()
        while True:
            current = time.monotonic()
            while self._schedule and self._schedule[0][0] <= current:
                due, name = heapq.heappop(self._schedule)
                if self._due.get(name) != due:
                    continue  # superseded by an earlier retry
                node = self.nodes.get(name)
                if node is None or node.deleted:
                    self._due.pop(name, None)
                    continue
                self._plan(name, current + self.interval)
                if node.health == "partitioned":
                    continue
                task = asyncio.create_task(self._bounded(self._renew(node)))
                pending.add(task)
                task.add_done_callback(pending.discard)
            delay = self._schedule[0][0] - current if self._schedule else 3600.0
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.05, delay))

    async def _renew(self, node: SimNode) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node.name}"
        try:
            status, body = await self.kube.request(
                "PATCH", path, {"spec": {"renewTime": micro_now()}}, content_type=MERGE_PATCH
            )
            if status == 404 and not node.deleted:
                await self._create_lease(node)
            elif status >= 300:
                log.warning("renewing lease of %s: HTTP %s: %s", node.name, status, body)
            if status < 500 and node.name in self._failing:
                self._failing.discard(node.name)
                log.info("renewing lease of %s works again", node.name)
            if status >= 500:
                self._retry(node, f"HTTP {status}")
        except Exception as error:
            self._retry(node, str(error))

    def _retry(self, node: SimNode, error: str) -> None:
        """Renew again soon; log the first failure of a series only."""
        if node.name not in self._failing:
            self._failing.add(node.name)
            log.warning(
                "renewing lease of %s failed: %s; retrying every %g s",
                node.name,
                error,
                RENEW_RETRY,
            )
        due = time.monotonic() + RENEW_RETRY
        if due < self._due.get(node.name, float("inf")):
            self._plan(node.name, due)
            self._wake.set()

    async def _bounded(self, coro: Any) -> Any:
        async with self._semaphore:
            return await coro

    # Faults ---------------------------------------------------------------------------

    def get(self, name: str) -> SimNode:
        node = self.nodes.get(name)
        if node is None or node.deleted:
            raise KeyError(name)
        return node

    def reachable(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and node.health != "partitioned" and not node.deleted

    async def partition(self, name: str) -> None:
        """Stop heartbeats; report Ready=Unknown now, as the controller would after the grace."""
        node = self.get(name)
        node.health = "partitioned"
        await self._set_ready(
            node, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."
        )

    async def not_ready(self, name: str, message: str) -> None:
        """Keep heartbeats but report Ready=False (the kubelet is up, the node is not ready)."""
        node = self.get(name)
        node.health = "not-ready"
        await self._set_ready(node, "False", "KubeletNotReady", message)

    async def heal(self, name: str) -> None:
        node = self.get(name)
        node.health = "ready"
        await self._renew(node)
        await self._set_ready(node, "True", "KubeletReady", "kubelet is posting ready status")

    def on_node_event(self, kind: str, body: dict[str, Any]) -> None:
        """Node watch: a healthy node shown not Ready (by the node-lifecycle controller)
        reports Ready=True again."""
        name = (body.get("metadata") or {}).get("name", "")
        node = self.nodes.get(name)
        if kind == "DELETED" or node is None or node.deleted or node.health != "ready":
            return
        ready = next(
            (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"),
            None,
        )
        if ready is None or ready.get("status") == "True" or name in self._reasserting:
            return
        log.warning(
            "node %s was marked Ready=%s (%s) while its kubelet is healthy; reporting Ready",
            name,
            ready.get("status"),
            ready.get("reason"),
        )
        self._reasserting.add(name)
        task = asyncio.create_task(self._reassert(node), name=f"ready-{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def on_nodes_synced(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.on_node_event("ADDED", item)

    async def _reassert(self, node: SimNode) -> None:
        try:
            await self._renew(node)
            await self._set_ready(node, "True", "KubeletReady", "kubelet is posting ready status")
        except Exception as error:  # the next event or re-list tries again
            log.warning("reporting node %s Ready failed: %s", node.name, error)
        finally:
            self._reasserting.discard(node.name)

    async def _set_ready(self, node: SimNode, status: str, reason: str, message: str) -> None:
        stamp = now()
        condition = {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }
        if status != "Unknown":
            condition["lastHeartbeatTime"] = stamp
        await self._patch_status(node, {"status": {"conditions": [condition]}})

    async def delete_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None or node.deleted:
            raise KeyError(name)
        node.deleted = True
        await self.kube.call("DELETE", f"/api/v1/nodes/{name}", ok=(404,))
        await self.kube.call(
            "DELETE",
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}",
            ok=(404,),
        )
        del self.nodes[name]
        pool = self.pools.get(node.pool.name)
        if pool is not None and not any(n.pool.name == pool.name for n in self.nodes.values()):
            self.pools.pop(pool.name, None)

    def summary(self) -> list[dict[str, Any]]:
        return [
            {
                "name": n.name,
                "pool": n.pool.name,
                "ip": n.ip,
                "health": n.health,
                "mode": n.pool.mode,
            }
            for n in self.nodes.values()
        ]
