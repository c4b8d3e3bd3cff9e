"""Pod status as the kubelet reports it, built as strategic-merge patches of ``pods/status``.

Strategic merge keeps what other writers own: conditions merge by ``type`` (so the
scheduler's PodScheduled and the apiserver's DisruptionTarget stay), container statuses by
``name``. A container ``state`` is a struct, so switching from ``running`` to
``terminated`` must null the other members explicitly, as the kubelet's patches do.
``metadata.uid`` in the patch is a precondition: a patch meant for a deleted pod never
lands on a new pod of the same name.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CONDITION_TYPES = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def running_state(started_at: str) -> dict[str, Any]:
    return {"running": {"startedAt": started_at}, "waiting": None, "terminated": None}


def waiting_state(reason: str, message: str | None = None) -> dict[str, Any]:
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    return {"waiting": waiting, "running": None, "terminated": None}


def terminated_state(
    exit_code: int,
    reason: str | None = None,
    *,
    started_at: str | None = None,
    finished_at: str | None = None,
    message: str | None = None,
    container_id: str | None = None,
    signal: int | None = None,
) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "finishedAt": finished_at or now(),
    }
    if started_at:
        terminated["startedAt"] = started_at
    if message:
        terminated["message"] = message
    if container_id:
        terminated["containerID"] = container_id
    if signal:
        terminated["signal"] = signal
    return {"terminated": terminated, "running": None, "waiting": None}


@dataclass
class ContainerStatus:
    name: str
    image: str
    state: dict[str, Any]
    restart_count: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str | None = None
    probe_started: bool | None = None
    """The startup probe's verdict (None: no startup probe, started once running)."""
    probe_ready: bool | None = None
    """The readiness probe's verdict (None: no readiness probe, ready once started)."""

    @property
    def running(self) -> bool:
        return bool(self.state.get("running"))

    @property
    def started(self) -> bool:
        return self.running and self.probe_started is not False

    @property
    def ready(self) -> bool:
        return self.started and self.probe_ready is not False

    @property
    def terminated(self) -> dict[str, Any] | None:
        return self.state.get("terminated")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": self.state,
            "lastState": self.last_state or {"running": None, "waiting": None, "terminated": None},
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
        }
        if self.container_id:
            data["containerID"] = self.container_id
        return data


@dataclass
class Conditions:
    """Pod conditions the kubelet owns, with transition times kept across updates."""

    _current: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)

    def set(self, kind: str, status: bool, reason: str | None = None) -> None:
        value = "True" if status else "False"
        previous = self._current.get(kind)
        since = previous[2] if previous and previous[0] == value else now()
        self._current[kind] = (value, reason, since)

    def to_json(self) -> list[dict[str, Any]]:
        out = []
        for kind in CONDITION_TYPES:
            if kind not in self._current:
                continue
            value, reason, since = self._current[kind]
            condition: dict[str, Any] = {
                "type": kind,
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": since,
            }
            if reason:
                condition["reason"] = reason
            out.append(condition)
        return out


def pod_phase(statuses: list[ContainerStatus]) -> str:
    """The kubelet's phase rule once containers were started (restarts are decided earlier:
    a container that will restart is waiting, not terminated)."""
    if any(not s.terminated for s in statuses):
        return "Running"
    codes = [s.terminated["exitCode"] for s in statuses if s.terminated]
    return "Succeeded" if all(code == 0 for code in codes) else "Failed"


def patch(
    pod: Mapping[str, Any],
    *,
    phase: str,
    host_ip: str | None,
    pod_ip: str | None,
    start_time: str | None,
    conditions: Conditions,
    containers: list[ContainerStatus],
    init_containers: list[ContainerStatus] | None = None,
    reason: str | None = None,
    message: str | None = None,
    extra_conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions.to_json() + list(extra_conditions or []),
        "containerStatuses": [c.to_json() for c in containers],
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        "reason": reason,
        "message": message,
    }
    if init_containers:
        status["initContainerStatuses"] = [c.to_json() for c in init_containers]
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if start_time:
        status["startTime"] = start_time
    return {"metadata": {"uid": pod["metadata"]["uid"]}, "status": status}


def disruption_condition(reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": now(),
    }
