"""Simulate-mode pods: kubelet-shaped status without any process, for scale runs.

A pod bound to a simulate-mode node is reported Running at once (pod IP, start time,
running containers, Ready). If its pool (or the pod, by annotation) says so, it terminates
after ``complete_after`` seconds with ``exit_code``. There are no per-pod tasks or
processes: completions are loop timers, and every status write goes through the agent's
shared bounded writer, so thousands of pods cost thousands of small PATCHes and nothing
else.

Per-pod overrides (annotations): ``localcluster.tpu-operator.dev/simulate: "true"`` simulates
a pod even on a run-mode node (tests that only check placement and wiring of manifests
meant for real TPUs), ``localcluster.tpu-operator.dev/simulate-complete-after`` (seconds)
and ``localcluster.tpu-operator.dev/simulate-exit-code``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localcluster.agent.status import (
    Conditions,
    ContainerStatus,
    now,
    patch,
    running_state,
    terminated_state,
)
from localcluster.pools import Simulate

ANNOTATION_PREFIX = "localcluster.tpu-operator.dev/"
SIMULATE_ANNOTATION = ANNOTATION_PREFIX + "simulate"
COMPLETE_AFTER_ANNOTATION = ANNOTATION_PREFIX + "simulate-complete-after"
EXIT_CODE_ANNOTATION = ANNOTATION_PREFIX + "simulate-exit-code"


@dataclass
class SimPod:
    pod: dict[str, Any]
    host_ip: str
    pod_ip: str
    start_time: str
    conditions: Conditions = field(default_factory=Conditions)
    containers: list[ContainerStatus] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    phase: str = "Running"
    disruption: dict[str, Any] | None = None
    """The DisruptionTarget condition of a pod stopped by a graceful node shutdown."""

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    def to_patch(self) -> dict[str, Any]:
        return patch(
            self.pod,
            phase=self.phase,
            host_ip=self.host_ip,
            pod_ip=self.pod_ip,
            start_time=self.start_time,
            conditions=self.conditions,
            containers=self.containers,
            extra_conditions=[self.disruption] if self.disruption else None,
        )


def completion(pod: dict[str, Any], defaults: Simulate) -> tuple[float | None, int]:
    annotations = pod["metadata"].get("annotations") or {}
    after = defaults.complete_after
    code = defaults.exit_code
    if COMPLETE_AFTER_ANNOTATION in annotations:
        after = float(annotations[COMPLETE_AFTER_ANNOTATION])
    if EXIT_CODE_ANNOTATION in annotations:
        code = int(annotations[EXIT_CODE_ANNOTATION])
    return after, code


class Simulator:
    """All simulate-mode pods of the agent."""

    def __init__(self, report: Callable[[SimPod], None]) -> None:
        self._report = report
        self.pods: dict[str, SimPod] = {}

    def start(self, pod: dict[str, Any], defaults: Simulate, host_ip: str, pod_ip: str) -> SimPod:
        status = pod.get("status") or {}
        started = status.get("startTime") or now()
        sim = SimPod(pod, host_ip, pod_ip, started)
        for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"):
            sim.conditions.set(kind, True)
        sim.containers = [
            ContainerStatus(
                c["name"],
                c.get("image", ""),
                running_state(started),
                container_id=f"simulated://{sim.uid[:8]}",
            )
            for c in pod["spec"].get("containers") or []
        ]
        self.pods[sim.uid] = sim
        after, code = completion(pod, defaults)
        if after is not None:
            loop = asyncio.get_running_loop()
            sim.timer = loop.call_later(max(0.0, after), self.complete, sim.uid, code, None)
        self._report(sim)
        return sim

    def complete(
        self,
        uid: str,
        exit_code: int,
        reason: str | None,
        disruption: dict[str, Any] | None = None,
    ) -> bool:
        sim = self.pods.get(uid)
        if sim is None or sim.phase != "Running":
            return False
        sim.disruption = disruption
        if sim.timer is not None:
            sim.timer.cancel()
        for container in sim.containers:
            started = (container.state.get("running") or {}).get("startedAt")
            container.state = terminated_state(
                exit_code, reason, started_at=started, container_id=container.container_id
            )
        sim.phase = "Succeeded" if exit_code == 0 else "Failed"
        for kind in ("ContainersReady", "Ready"):
            sim.conditions.set(kind, False, "PodCompleted")
        self._report(sim)
        return True

    def forget(self, uid: str) -> SimPod | None:
        sim = self.pods.pop(uid, None)
        if sim is not None and sim.timer is not None:
            sim.timer.cancel()
        return sim
