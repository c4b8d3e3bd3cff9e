"""The kubelet's pod loop for every simulated node: admit, run, report, terminate, delete.

One watch for all pods bound to any node (field selector ``spec.nodeName!=``), filtered
here by the agent's node set, rather than one watch per node as a kubelet has: the agent
plays kubelet for up to hundreds of nodes from one process, and one stream gives the same
events as hundreds of long-lived watch connections at a fraction of the apiserver's and
the agent's cost.

Deletion is honoured as the kubelet does it: a pod with ``deletionTimestamp`` gets
SIGTERM, ``deletionGracePeriodSeconds`` to exit, then SIGKILL; its final status is
reported, then the agent sends the final ``DELETE`` with ``gracePeriodSeconds: 0`` and a
UID precondition. A pod whose object vanishes (force delete) has its processes killed at
once. While a node is partitioned its pods' status writes are held back and graceful
deletions are not seen (as with a kubelet cut off from the apiserver); a force delete
still kills the process, so no straggler survives a gang restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.agent.events import EventRecorder
from localcluster.agent.hosts import HostsFiles
from localcluster.agent.ipam import Block
from localcluster.agent.kube import STRATEGIC_PATCH, Kube
from localcluster.agent.nodes import NodeManager
from localcluster.agent.runtime import RunPod, Sandbox
from localcluster.agent.simulate import SIMULATE_ANNOTATION, SimPod, Simulator
from localcluster.agent.status import (
    Conditions,
    ContainerStatus,
    disruption_condition,
    patch,
    terminated_state,
)
from localcluster.agent.volumes import Volumes
from localcluster.agent.writer import Writer

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def _path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


@dataclass
class PodManager:
    kube: Kube
    nodes: NodeManager
    block: Block
    writer: Writer
    pods_dir: Path
    sandbox: Sandbox
    hosts: HostsFiles
    volumes: Volumes
    service_env: dict[str, str]
    running: dict[str, RunPod] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    deferred: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    terminating: set[str] = field(default_factory=set)
    ips: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.simulator = Simulator(self._report_sim)
        self.events = EventRecorder(self.kube, self._submit_event)
        self._background: set[asyncio.Task[None]] = set()

    # Events ---------------------------------------------------------------------------

    def on_synced(self, items: list[dict[str, Any]]) -> None:
        present = {item["metadata"]["uid"] for item in items}
        for uid in list(self.latest):
            if uid not in present:
                self._gone(uid)
        for item in items:
            pod_ip = (item.get("status") or {}).get("podIP")
            if pod_ip and item["metadata"]["uid"] not in self.ips and self.block.reserve(pod_ip):
                self.ips[item["metadata"]["uid"]] = pod_ip
        for item in items:
            self.on_event("ADDED", item)

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        node_name = pod["spec"].get("nodeName")
        if kind == "DELETED":
            self._gone(uid)
            return
        if node_name not in self.nodes.nodes:
            return
        self.latest[uid] = pod
        if not self.nodes.reachable(node_name):
            return
        self._sync(pod)

    def _sync(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        tracked = uid in self.running or uid in self.simulator.pods
        phase = (pod.get("status") or {}).get("phase")
        if pod["metadata"].get("deletionTimestamp"):
            if uid not in self.terminating:
                self.terminating.add(uid)
                task = asyncio.create_task(self._terminate(pod), name=f"terminate-{uid[:8]}")
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return
        if tracked:
            if uid in self.running:
                self.running[uid].observe(pod)
            return
        if phase in TERMINAL:
            return
        node = self.nodes.nodes[pod["spec"]["nodeName"]]
        started_before = bool((pod.get("status") or {}).get("startTime"))
        pod_ip = self.ips.get(uid) or self.block.allocate()
        self.ips[uid] = pod_ip
        annotations = pod["metadata"].get("annotations") or {}
        if node.pool.mode == "simulate" or annotations.get(SIMULATE_ANNOTATION) == "true":
            self.simulator.start(pod, node.pool.simulate, node.ip, pod_ip)
        elif started_before:
            self._lost_on_restart(pod, node.ip, pod_ip)
        else:
            self._run(pod, node.ip, pod_ip)

    def _run(self, pod: dict[str, Any], host_ip: str, pod_ip: str) -> None:
        uid = pod["metadata"]["uid"]
        meta = pod["metadata"]
        run = RunPod(
            pod=pod,
            host_ip=host_ip,
            pod_ip=pod_ip,
            directory=self.pods_dir / meta["namespace"] / meta["name"],
            sandbox=self.sandbox,
            hosts=self.hosts,
            volumes=self.volumes,
            service_env=self.service_env,
            report=lambda body: self._report(pod, body),
            events=self.events,
        )
        self.running[uid] = run
        self.tasks[uid] = asyncio.create_task(self._guard(run), name=f"pod-{meta['name']}")

    async def _guard(self, run: RunPod) -> None:
        try:
            await run.run()
        except Exception:
            log.exception("pod %s/%s: agent error", run.namespace, run.name)
            run.message = "localcluster node agent error; see logs/node-agent.log"
            run.kill_now()

    def _lost_on_restart(self, pod: dict[str, Any], host_ip: str, pod_ip: str) -> None:
        """A run-mode pod started by an earlier agent: its processes died with that agent."""
        conditions = Conditions()
        for kind in ("ContainersReady", "Ready"):
            conditions.set(kind, False, "PodCompleted")
        message = "The container could not be located when the pod was terminated"
        containers = [
            ContainerStatus(
                c["name"],
                c.get("image", ""),
                terminated_state(137, "ContainerStatusUnknown", message=message),
            )
            for c in pod["spec"].get("containers") or []
        ]
        body = patch(
            pod, phase="Failed", host_ip=host_ip, pod_ip=pod_ip,
            start_time=pod["status"].get("startTime"), conditions=conditions, containers=containers,
        )  # fmt: skip
        self._report(pod, body)

    # Status writes --------------------------------------------------------------------

    def _report(self, pod: dict[str, Any], body: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]

        async def write() -> None:
            await self.kube.call(
                "PATCH", _path(namespace, name) + "/status", body, content_type=STRATEGIC_PATCH
            )

        self._submit(uid, pod["spec"]["nodeName"], write)

    def _report_sim(self, sim: SimPod) -> None:
        body = sim.to_patch()
        self._report(sim.pod, body)

    def _submit(self, uid: str, node: str, write: Callable[[], Awaitable[None]]) -> None:
        if self.nodes.reachable(node):
            self.writer.submit(uid, write)
        elif node in self.nodes.nodes:
            self.deferred[uid] = write

    def _submit_event(self, key: Hashable, write: Callable[[], Awaitable[None]]) -> None:
        """Events of a pod whose node is cut off from the apiserver are dropped."""
        uid = key[1] if isinstance(key, tuple) else None
        pod = self.latest.get(str(uid))
        if pod is not None and self.nodes.reachable(pod["spec"]["nodeName"]):
            self.writer.submit(key, write)

    def _final_delete(self, pod: dict[str, Any]) -> Callable[[], Awaitable[None]]:
        meta = pod["metadata"]

        async def delete() -> None:
            await self.kube.call(
                "DELETE",
                _path(meta["namespace"], meta["name"]),
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": meta["uid"]},
                },
                ok=(404, 409),
            )

        return delete

    # Termination ----------------------------------------------------------------------

    async def _terminate(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        node = pod["spec"]["nodeName"]
        run = self.running.get(uid)
        if run is not None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            await run.terminate(float(grace))
            final_body = run.last_patch
            delete = self._final_delete(pod)
            meta = pod["metadata"]

            async def finish() -> None:
                if final_body is not None:
                    await self.kube.call(
                        "PATCH",
                        _path(meta["namespace"], meta["name"]) + "/status",
                        final_body,
                        content_type=STRATEGIC_PATCH,
                        ok=(404, 409),
                    )
                await delete()

            self._submit(uid, node, finish)
        else:
            self.simulator.forget(uid)
            self._submit(uid, node, self._final_delete(pod))

    def _gone(self, uid: str) -> None:
        """The pod object no longer exists: kill what is left of it and forget it."""
        run = self.running.pop(uid, None)
        if run is not None:
            run.kill_now()
        self.tasks.pop(uid, None)
        self.simulator.forget(uid)
        self.events.forget(uid)
        self.latest.pop(uid, None)
        self.deferred.pop(uid, None)
        self.terminating.discard(uid)
        self.block.free(self.ips.pop(uid, None))

    # Faults and node events -----------------------------------------------------------

    def find(self, namespace: str, name: str) -> str | None:
        for uid, pod in self.latest.items():
            meta = pod["metadata"]
            if meta["namespace"] == namespace and meta["name"] == name:
                return uid
        return None

    def kill(
        self, namespace: str, name: str, exit_code: int, container: str | None, reason: str | None
    ) -> dict[str, Any]:
        uid = self.find(namespace, name)
        if uid is None:
            raise KeyError(f"{namespace}/{name}")
        if uid in self.running:
            killed = self.running[uid].kill_container(container, exit_code, reason)
            if not killed:
                raise LookupError(
                    f"pod {namespace}/{name} has no running process"
                    + (f" in container {container!r}" if container else "")
                )
            return {"killed": killed}
        if self.simulator.complete(uid, exit_code, reason):
            return {"killed": [c.name for c in self.simulator.pods[uid].containers]}
        raise LookupError(f"pod {namespace}/{name} is not running")

    def on_node_healed(self, node: str) -> None:
        for uid, pod in list(self.latest.items()):
            if pod["spec"].get("nodeName") != node:
                continue
            write = self.deferred.pop(uid, None)
            if write is not None:
                self.writer.submit(uid, write)
            self._sync(pod)

    async def on_node_deleted(self, node: str, graceful: bool) -> None:
        """The VM is gone (graceful: GKE's graceful node shutdown first)."""
        uids = [uid for uid, pod in self.latest.items() if pod["spec"].get("nodeName") == node]
        if graceful:
            condition = disruption_condition("TerminationByKubelet", SHUTDOWN_MESSAGE)
            waits = []
            for uid in uids:
                if uid in self.running:
                    run = self.running[uid]
                    run.disruption, run.reason, run.message = (
                        condition,
                        "Terminated",
                        SHUTDOWN_MESSAGE,
                    )
                    grace = min(
                        30.0, float(run.pod["spec"].get("terminationGracePeriodSeconds", 30))
                    )
                    waits.append(run.terminate(grace))
                elif uid in self.simulator.pods:
                    self.simulator.complete(uid, 143, "Error", condition)
            await asyncio.gather(*waits)
            await self.writer.drain()
        for uid in uids:
            gone = self.running.pop(uid, None)
            if gone is not None:
                gone.kill_now()
            self.simulator.forget(uid)
            self.deferred.pop(uid, None)

    def processes(self) -> list[dict[str, Any]]:
        out = []
        for run in self.running.values():
            out.append(
                {
                    "namespace": run.namespace,
                    "name": run.name,
                    "uid": run.uid,
                    "ip": run.pod_ip,
                    "phase": run.phase,
                    "processes": run.processes(),
                }
            )
        return out

    async def shutdown(self, grace: float = 5.0) -> None:
        await asyncio.gather(
            *(run.terminate(grace) for run in self.running.values()), return_exceptions=True
        )
