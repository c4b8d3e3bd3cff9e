"""In-place gang restarts over the in-memory API (tests/unit/fakeapi.py).

The supervisors are stood in for by ``FakeChannel``: one training process per pod IP
with the states a real supervisor has (tests/worker/test_supervisor.py runs the real
one). Each scenario checks what the job decides (kind, attempt, counting), what it does to
the pods (stopped, carried into the next attempt by their slice's record, started; never
deleted nor written to), the barrier (no start before every process of the old attempt
stopped and every pod of the new one runs), and each fallback to recreating the pods.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from tests.unit.fakeapi import NS, FakeCluster, stamp
from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator.builders.supervision import MAX_STOP_GRACE_SECONDS
from tpu_operator.placement.pools import spares_of
from tpu_operator.policies.plan import MIN_REQUEUE_SECONDS
from tpu_operator.reconcile.supervisors import Supervisors
from tpu_operator.runtime.control import ControlError, ProcessState
from tpu_operator.runtime.ownership import SliceOwners

pytestmark = pytest.mark.unit

V5P = ("tpu-v5p-slice", "2x2x2")  # v5p-16: 2 hosts of 4 chips


class FakeChannel:
    """Supervisors by pod IP: the process state each would report, and every call."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.processes: dict[str, ProcessState] = {}
        self.calls: list[tuple[str, str, int]] = []
        self.unreachable: set[str] = set()
        self.slow_stops: dict[str, int] = {}
        """Stops answered "stopping" (the process still ends) before one that ends it."""
        self.graces: list[float] = []
        self.hang: set[str] = set()
        """Supervisors that take a stop and never answer."""
        self.starts_saw: list[bool] = []
        """At each start: whether no process of an older attempt ran in any pod."""

    def key_for(self, job_uid: str) -> bytes:
        return f"key-of-{job_uid}".encode()

    async def close(self) -> None:
        pass

    def _check(self, pod_uid: str, ip: str | None, verb: str) -> None:
        assert ip is not None
        # Every request is addressed to one pod: the UID of the pod at that IP.
        owner = [p for p in pods_of(self) if p["status"].get("podIP") == ip]
        assert [p["metadata"]["uid"] for p in owner] == [pod_uid], (verb, ip, pod_uid)
        if ip in self.unreachable:
            raise ControlError(f"{verb} http://{ip}: ClientConnectorError: refused")

    async def status(self, job_uid: str, pod_uid: str, ip: str | None) -> ProcessState:
        self._check(pod_uid, ip, "status")
        assert ip is not None
        self.calls.append(("status", ip, self.processes[ip].attempt))
        return self.processes[ip]

    async def stop(
        self, job_uid: str, pod_uid: str, ip: str | None, attempt: int, grace: float
    ) -> ProcessState:
        self._check(pod_uid, ip, "stop")
        assert ip is not None
        self.calls.append(("stop", ip, attempt))
        self.graces.append(grace)
        if ip in self.hang:
            await asyncio.Event().wait()
        current = self.processes[ip]
        if current.attempt > attempt:
            raise ControlError("newer attempt", status=409, state=current)
        if current.running and self.slow_stops.get(ip, 0) > 0:
            self.slow_stops[ip] -= 1
            self.processes[ip] = ProcessState("stopping", current.attempt)
        elif current.running:
            self.processes[ip] = ProcessState("exited", current.attempt, 143, "Signaled: SIGTERM")
        return self.processes[ip]

    async def start(
        self, job_uid: str, pod_uid: str, ip: str | None, attempt: int, env: dict[str, str]
    ) -> ProcessState:
        self._check(pod_uid, ip, "start")
        assert ip is not None
        assert env[contract.ENV_RESTART_ATTEMPT] == str(attempt)
        self.calls.append(("start", ip, attempt))
        self.starts_saw.append(
            all(
                not self.processes[p["status"]["podIP"]].running
                or self.processes[p["status"]["podIP"]].attempt >= attempt
                for p in pods_of(self)
            )
        )
        if self.processes[ip].attempt < attempt:
            self.processes[ip] = ProcessState("running", attempt)
        return self.processes[ip]


def attempts(cluster: FakeCluster) -> dict[str, int]:
    """The attempt each pod of job "j" belongs to, as the operator's caches have it."""
    cluster._index()
    return {v.name: v.attempt for v in cluster.caches.pods_of_job(NS, "j")}


def labels(cluster: FakeCluster) -> dict[str, str]:
    """Each pod's restart-attempt label: the attempt it was created for."""
    return {
        n: p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT]
        for n, p in cluster.pods("j").items()
    }


def pod_writes(cluster: FakeCluster) -> list[str]:
    """The PATCHes and PUTs of pods (not their status: the kubelet's) the operator sent."""
    return [
        f"{r.verb} {r.path}"
        for r in cluster.requests
        if r.verb in ("PATCH", "PUT") and "/pods/" in r.path and not r.path.endswith("/status")
    ]


def restarting_event(cluster: FakeCluster) -> str:
    """The message of the job's last Restarting event."""
    messages = [
        m for n, _, r, m in cluster.recorded.events if n == "TPUJob/j" and r == "Restarting"
    ]
    assert messages, cluster.recorded.events
    return messages[-1]


def pods_of(channel: FakeChannel) -> list[dict[str, Any]]:
    return list(channel.cluster.pods("j").values())


def supervised_cluster() -> tuple[FakeCluster, FakeChannel]:
    cluster = FakeCluster()
    channel = FakeChannel(cluster)
    cluster.ctx.supervisors = Supervisors(
        channel,  # type: ignore[arg-type]
        cluster,  # type: ignore[arg-type]
        clock=lambda: cluster.monotonic,
    )
    return cluster, channel


def job_spec(
    command: list[str] | None = None, monitoring: dict[str, Any] | None = None, **policy: Any
) -> dict[str, Any]:
    worker: dict[str, Any] = {"name": "worker", "image": "w"}
    worker["command"] = command if command is not None else ["tpu-worker", "demo"]
    spec = {
        "slice": {"type": "v5p-16"},
        "template": {"spec": {"containers": [worker]}},
        "failurePolicy": {"backoffSeconds": 0, **policy},
    }
    if monitoring is not None:
        spec["monitoring"] = monitoring
    return spec


def start_processes(cluster: FakeCluster, channel: FakeChannel, attempt: int) -> None:
    """Every pod runs, its supervisor's process of ``attempt`` runs, and it is ready."""
    cluster.run_pods("j")
    for index, pod in enumerate(sorted(pods_of(channel), key=lambda p: p["metadata"]["name"])):
        status = pod["status"]
        ip = status.setdefault("podIP", f"10.0.0.{index + 1}")
        status.setdefault(
            "containerStatuses",
            [
                {
                    "name": contract.WORKER_CONTAINER,
                    "state": {"running": {"startedAt": stamp(cluster.now)}},
                }
            ],
        )
        if channel.processes.get(ip, ProcessState("idle", 0)).attempt < attempt:
            channel.processes[ip] = ProcessState("running", attempt)
        set_ready(cluster, pod, True)


def set_ready(cluster: FakeCluster, pod: dict[str, Any], ready: bool) -> None:
    """The kubelet's readiness probe result, with the condition's transition time."""
    conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != "Ready"]
    conditions.append(
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": stamp(cluster.now),
        }
    )
    pod["status"]["conditions"] = conditions


def process_exits(cluster: FakeCluster, channel: FakeChannel, name: str, code: int) -> None:
    """The training process in pod ``name`` ends; the container (supervisor) runs on."""
    cluster.advance(1)
    pod = cluster.pods("j")[name]
    ip = pod["status"]["podIP"]
    attempt = channel.processes[ip].attempt
    channel.processes[ip] = ProcessState("exited", attempt, code, "Exited", cluster.now.timestamp())
    set_ready(cluster, pod, False)


def running_job(
    cluster: FakeCluster,
    channel: FakeChannel,
    monitoring: dict[str, Any] | None = None,
    slices: int = 1,
    **policy: Any,
) -> dict[str, str]:
    """Job "j" of ``slices`` v5p-16 slices, one pool each (p1, p2, ...), Running; its pods'
    UIDs by name."""
    for index in range(slices):
        cluster.add_pool(f"p{index + 1}", *V5P, hosts=2)
    cluster.apply_job("j", {**job_spec(monitoring=monitoring, **policy), "numSlices": slices})
    cluster.settle()
    start_processes(cluster, channel, 1)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    return {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items()}


def test_supervised_pods_get_the_probe_port_key_and_their_job_a_secret():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    pod = cluster.pods("j")["j-0-0"]
    assert pod["metadata"]["annotations"][contract.ANNOTATION_SUPERVISED] == "true"
    (worker,) = pod["spec"]["containers"]
    assert worker["readinessProbe"]["httpGet"]["port"] == contract.PORT_NAME_CONTROL
    assert worker["readinessProbe"]["periodSeconds"] == 1
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env[contract.ENV_CONTROL_PORT] == str(contract.DEFAULT_CONTROL_PORT)
    key = channel.key_for(cluster.job("j")["metadata"]["uid"])
    assert key.decode() not in str(worker["env"])  # never in env
    # The key's id (the only key the supervisor uses) and the pod's UID (what every
    # request is signed for).
    assert env[contract.ENV_CONTROL_KEY_ID] == sv.key_id(key)
    uid_env = next(e for e in worker["env"] if e["name"] == contract.ENV_POD_UID)
    assert uid_env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == contract.CONTROL_VOLUME)
    secrets = [o for k, o in cluster.objects.items() if "/secrets/" in k]
    # Named after the key's id, which only the operator can compute; immutable.
    assert [s["metadata"]["name"] for s in secrets] == [f"j-control-{sv.key_id(key)}"]
    assert volume["secret"]["secretName"] == secrets[0]["metadata"]["name"]
    assert secrets[0]["immutable"] is True
    assert secrets[0]["metadata"]["ownerReferences"][0]["kind"] == contract.JOB_KIND
    assert base64.b64decode(secrets[0]["data"][contract.CONTROL_KEY_FILE]) == key
    slice_spec = cluster.objects[next(k for k in cluster.objects if "/tpuslices/" in k)]["spec"]
    assert slice_spec["controlKeyId"] == sv.key_id(key)


def test_a_stop_answered_stopping_is_asked_again_before_anything_moves():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel)
    ip1 = cluster.pods("j")["j-0-1"]["status"]["podIP"]
    channel.slow_stops[ip1] = 2  # its process takes two answers to end
    process_exits(cluster, channel, "j-0-0", 1)
    cluster.reconcile_job("j")  # the restart is committed
    cluster.reconcile_job("j")  # stops sent: j-0-1 answers "stopping"
    assert not [c for c in channel.calls if c[0] == "start"]
    assert channel.processes[ip1].running  # its process of attempt 1 still runs
    cluster.settle()
    assert [c[0] for c in channel.calls if c[1] == ip1 and c[0] == "stop"] == ["stop"] * 3
    assert all(channel.starts_saw) and channel.starts_saw
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items()} == uids
    assert cluster.job("j")["status"]["restartKind"] == "InPlace"


def test_a_reconcile_cancelled_mid_restart_leaves_the_committed_restart_to_the_next():
    """The restart is committed, then the act hangs on a supervisor that never answers
    and the reconcile is cancelled at its deadline: nothing half-done is left (no start,
    the restart counted once), and the next reconcile goes on from the committed status."""
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel)
    ip1 = cluster.pods("j")["j-0-1"]["status"]["podIP"]
    channel.hang.add(ip1)
    process_exits(cluster, channel, "j-0-0", 1)
    for _ in range(5):  # the reconcile that acts on the committed restart hangs
        try:
            cluster._index()
            asyncio.run(asyncio.wait_for(cluster.jobs((NS, "j")), 1.0))
        except TimeoutError:
            break
        cluster.advance(1)
    else:
        raise AssertionError(f"no reconcile reached the hanging stop: {channel.calls}")
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restarts"], status["restartKind"]) == (2, 1, "InPlace")
    assert ("stop", ip1, 1) in channel.calls
    assert not [c for c in channel.calls if c[0] == "start"]
    channel.hang.clear()
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restarts"], status["inPlaceRestarts"]) == (2, 1, 1)
    assert all(channel.starts_saw) and len(channel.starts_saw) == 2
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items()} == uids


def test_the_stop_grace_has_a_ceiling():
    cluster, channel = supervised_cluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    spec = job_spec()
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 10**9
    cluster.apply_job("j", spec)
    cluster.settle()
    start_processes(cluster, channel, 1)
    cluster.settle()
    process_exits(cluster, channel, "j-0-0", 1)
    cluster.settle()
    assert channel.graces and set(channel.graces) == {MAX_STOP_GRACE_SECONDS}
    assert cluster.job("j")["status"]["restartKind"] == "InPlace"


def test_with_the_network_policy_hostnetwork_pods_are_not_supervised():
    cluster, channel = supervised_cluster()
    cluster.ctx.control_network_policy = frozenset({NS})
    cluster.add_pool("p1", *V5P, hosts=2)
    spec = job_spec()
    spec["template"]["spec"]["hostNetwork"] = True
    cluster.apply_job("j", spec)
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"
    pod = cluster.pods("j")["j-0-0"]
    assert contract.ANNOTATION_SUPERVISED not in (pod["metadata"].get("annotations") or {})
    assert not any("/secrets/" in k for k in cluster.objects)
    refused = [m for n, _, r, m in cluster.recorded.events if r == "InPlaceRestartsRefused"]
    assert len(refused) == 1 and "hostNetwork" in refused[0], cluster.recorded.events
    cluster.exit_pod("j-0-1", 1)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"]) == (2, "Recreate")
    assert "the control-port NetworkPolicy cannot guard" in restarting_event(cluster)
    assert not channel.calls


def test_a_process_exit_restarts_every_process_in_the_same_pods():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel)
    process_exits(cluster, channel, "j-0-1", 1)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2
    assert status["restartKind"] == "InPlace"
    assert status["lastFailure"]["exitCode"] == 1
    assert status["lastFailure"]["reason"] == "Failed"
    assert (status["restarts"], status["countedRestarts"], status["inPlaceRestarts"]) == (1, 1, 1)
    # the same pods, carried into attempt 2 by their slice's record (no pod written to),
    # never deleted; every process of 2 started
    pods = cluster.pods("j")
    assert {n: p["metadata"]["uid"] for n, p in pods.items()} == uids
    assert set(attempts(cluster).values()) == {2}
    assert set(labels(cluster).values()) == {"1"}
    slice_spec = cluster.slice("j-0")["spec"]
    assert (slice_spec["attempt"], slice_spec["inPlaceFrom"]) == (2, 1)
    assert pod_writes(cluster) == []
    assert not any(p["metadata"].get("deletionTimestamp") for p in pods.values())
    assert sorted(c[0] for c in channel.calls if c[0] != "status") == [
        "start",
        "start",
        "stop",
        "stop",
    ]
    assert channel.starts_saw and all(channel.starts_saw)
    assert "restarting in place (only training processes stopped" in restarting_event(cluster)
    # the processes of attempt 2 come up: the job runs again
    cluster.advance(1)
    for pod in pods.values():
        set_ready(cluster, pod, True)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Running"


def test_no_start_while_a_process_of_the_old_attempt_runs_anywhere():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    # worker 1's process keeps running after worker 0's ended (no abort yet); its
    # supervisor does not answer the first stop: nothing may be started anywhere
    process_exits(cluster, channel, "j-0-0", 1)
    ip1 = cluster.pods("j")["j-0-1"]["status"]["podIP"]
    channel.unreachable.add(ip1)
    cluster.reconcile_job("j")
    assert not [c for c in channel.calls if c[0] == "start"]
    assert all(channel.starts_saw)
    # that supervisor never answers: the restart falls back to recreating the pods
    cluster.settle()
    assert cluster.job("j")["status"]["lastFailure"]["reason"] == "SupervisorUnreachable"
    assert not [c for c in channel.calls if c[0] == "start"]


def test_an_evicted_pod_recreates_the_pods():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel)
    cluster.evict_pod("j-0-1")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"]) == (2, "Recreate")
    assert "by recreating the pods (a pod or its node is gone (Evicted))" in restarting_event(
        cluster
    )
    cluster.confirm_deletions()
    cluster.settle()
    new = {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items()}
    assert new and set(new.values()).isdisjoint(uids.values())
    assert not [c for c in channel.calls if c[0] in ("stop", "start")]


@pytest.mark.parametrize(
    ("command", "policy", "expected"),
    [
        (["python", "train.py"], {}, "does not run tpu-worker"),
        (["tpu-worker", "demo"], {"restartMode": "Recreate"}, "restartMode is Recreate"),
    ],
)
def test_without_the_supervisor_restarts_recreate(
    command: list[str], policy: dict[str, Any], expected: str
):
    cluster, _ = supervised_cluster()
    cluster.add_pool("p1", *V5P, hosts=2)
    cluster.apply_job("j", job_spec(command, **policy))
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    pod = cluster.pods("j")["j-0-0"]
    assert contract.ANNOTATION_SUPERVISED not in (pod["metadata"].get("annotations") or {})
    assert not any("/secrets/" in k for k in cluster.objects)
    cluster.exit_pod("j-0-1", 1)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"]) == (2, "Recreate")
    assert expected in restarting_event(cluster)


def test_a_supervisor_that_does_not_stop_falls_back_to_recreating_the_pods():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel)
    process_exits(cluster, channel, "j-0-0", 1)
    channel.unreachable.add(cluster.pods("j")["j-0-1"]["status"]["podIP"])
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["attempt"] == 3
    assert status["restartKind"] == "Recreate"
    assert status["lastFailure"]["reason"] == "SupervisorUnreachable"
    assert not status["lastFailure"]["counted"]
    assert status["countedRestarts"] == 1  # the process exit; its fallback is not counted
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods("j").values())
    cluster.confirm_deletions()
    cluster.settle()
    new = cluster.pods("j")
    assert len(new) == 2 and {p["metadata"]["uid"] for p in new.values()}.isdisjoint(uids.values())
    assert {p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in new.values()} == {"3"}


def test_an_in_place_restart_that_does_not_come_up_in_time_recreates_the_pods():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel, inPlaceTimeoutSeconds=30)
    process_exits(cluster, channel, "j-0-0", 1)
    cluster.settle()
    assert cluster.job("j")["status"]["attempt"] == 2
    # the processes were started but never become ready
    cluster.advance(31)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"]) == (3, "Recreate")
    assert status["lastFailure"]["reason"] == "InPlaceRestartTimeout"


def test_the_supervisor_that_does_not_answer_ends_the_attempt_after_three_asks():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    pod = cluster.pods("j")["j-0-0"]
    channel.unreachable.add(pod["status"]["podIP"])
    process_exits(cluster, channel, "j-0-0", 1)
    for _ in range(2):
        cluster.reconcile_job("j")
        assert cluster.job("j")["status"]["attempt"] == 1
        cluster.advance(1)
    cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["attempt"] == 2
    assert status["lastFailure"]["reason"] == "SupervisorUnreachable"
    assert status["restartKind"] == "Recreate"


def test_a_readiness_flap_with_the_process_running_is_not_a_failure():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    cluster.advance(1)
    set_ready(cluster, cluster.pods("j")["j-0-0"], False)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["phase"]) == (1, "Running")
    asks = [c for c in channel.calls if c[0] == "status"]
    cluster.settle()
    assert [c for c in channel.calls if c[0] == "status"] == asks  # asked once per flap


def test_an_echo_failure_waits_for_the_first_failures_report():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    # worker 0 ends because its peer died (75) and is noticed first; worker 1's own
    # exit (1) shows a probe period later
    process_exits(cluster, channel, "j-0-0", 75)
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["attempt"] == 1  # waiting for the cause
    process_exits(cluster, channel, "j-0-1", 1)
    channel.processes[cluster.pods("j")["j-0-1"]["status"]["podIP"]] = ProcessState(
        "exited", 1, 1, "Exited", cluster.now.timestamp() - 1.0
    )
    cluster.settle()
    failure = cluster.job("j")["status"]["lastFailure"]
    assert (failure["pod"], failure["exitCode"]) == ("j-0-1", 1)


def test_an_echo_failure_alone_restarts_after_the_wait():
    cluster, channel = supervised_cluster()
    running_job(cluster, channel)
    process_exits(cluster, channel, "j-0-0", 75)
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["attempt"] == 1
    cluster.advance(3)
    cluster.settle()
    failure = cluster.job("j")["status"]["lastFailure"]
    assert (failure["pod"], failure["exitCode"]) == ("j-0-0", 75)
    assert cluster.job("j")["status"]["restartKind"] == "InPlace"


class Checkpoints(FakeChannel):
    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(cluster)
        self.asked: list[tuple[str, str]] = []

    async def checkpoint(
        self, job_uid: str, pod_uid: str, ip: str | None, attempt: int, request_id: str
    ) -> ProcessState:
        self._check(pod_uid, ip, "checkpoint")
        assert ip is not None
        self.asked.append((ip, request_id))
        return self.processes[ip]


class Killed(Exception):
    """The operator's process ends here."""


class Dying(Checkpoints):
    """Supervisors, and an operator that dies the moment it would ask one (``killing``)."""

    killing = False

    async def checkpoint(
        self, job_uid: str, pod_uid: str, ip: str | None, attempt: int, request_id: str
    ) -> ProcessState:
        if self.killing:
            raise Killed
        return await super().checkpoint(job_uid, pod_uid, ip, attempt, request_id)


def supervised(cluster: FakeCluster) -> Dying:
    """A fresh operator's memory of the supervisors (as after a restart of the operator)."""
    channel = Dying(cluster)
    cluster.ctx.supervisors = Supervisors(
        channel,  # type: ignore[arg-type]
        cluster,  # type: ignore[arg-type]
        clock=lambda: cluster.monotonic,
    )
    return channel


def test_a_maintenance_notice_asks_every_worker_to_checkpoint_once():
    cluster = FakeCluster()
    channel = Checkpoints(cluster)
    cluster.ctx.supervisors = Supervisors(
        channel,  # type: ignore[arg-type]
        cluster,  # type: ignore[arg-type]
        clock=lambda: cluster.monotonic,
    )
    running_job(cluster, channel, monitoring={"enabled": False})
    # a notice on a node none of the job's workers run on asks nothing of them
    (idle, _) = cluster.add_pool("idle", *V5P, hosts=2)
    cluster.objects[f"/api/v1/nodes/{idle}"]["metadata"]["labels"][
        "cloud.google.com/scheduled-maintenance-time"
    ] = "1795399137"
    cluster.advance(1)
    cluster.settle()
    assert channel.asked == [] and cluster.job("j")["status"].get("checkpointRequests", 0) == 0
    node = cluster.pods("j")["j-0-0"]["spec"]["nodeName"]
    cluster.objects[f"/api/v1/nodes/{node}"]["metadata"]["labels"][
        "cloud.google.com/scheduled-maintenance-time"
    ] = "1795399137"
    cluster.advance(1)
    cluster.settle()
    assert len(channel.asked) == 2 and len({r for _, r in channel.asked}) == 1
    status = cluster.job("j")["status"]
    assert status["checkpointRequests"] == 1
    assert status["disruptionNotices"] == [
        "attempt 1: maintenance scheduled at 1795399137 "
        "(cloud.google.com/scheduled-maintenance-time)"
    ]
    assert cluster.recorded.reasons("j").count("CheckpointRequested") == 1
    cluster.advance(5)
    cluster.settle()
    assert len(channel.asked) == 2  # once per notice
    # the taint GKE's maintenance handler sets before terminating the node: a new notice
    cluster.objects[f"/api/v1/nodes/{node}"].setdefault("spec", {})["taints"] = [
        {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    ]
    cluster.advance(1)
    cluster.settle()
    assert len(channel.asked) == 4
    assert cluster.job("j")["status"]["checkpointRequests"] == 2


@pytest.mark.parametrize("lost", ["operator killed before asking", "a worker unreachable"])
def test_a_maintenance_notice_request_not_delivered_is_sent_again(lost):
    """The request is committed with the notice, then sent; an operator that dies in
    between, or a supervisor that does not answer, must not leave a worker unasked while
    the notice stands (the notice is remembered: it is never new again)."""
    cluster = FakeCluster()
    channel = supervised(cluster)
    running_job(cluster, channel, monitoring={"enabled": False})
    node = cluster.pods("j")["j-0-0"]["spec"]["nodeName"]
    missed = cluster.pods("j")["j-0-1"]["status"]["podIP"]
    cluster.objects[f"/api/v1/nodes/{node}"]["metadata"]["labels"][
        "cloud.google.com/scheduled-maintenance-time"
    ] = "1795399137"
    cluster.advance(1)
    if lost == "operator killed before asking":
        channel.killing = True
        with pytest.raises(Killed):
            cluster.reconcile_job("j")
        assert channel.asked == []
        processes = channel.processes
        channel = supervised(cluster)  # its successor, to the same supervisors
        channel.processes = processes
    else:
        channel.unreachable.add(missed)
        cluster.reconcile_job("j")
        assert [ip for ip, _ in channel.asked] != [] and missed not in dict(channel.asked)
        channel.unreachable.clear()
    assert cluster.job("j")["status"]["checkpointRequests"] == 1
    cluster.advance(2)
    cluster.settle()
    # Every worker asked, under the one id; counted and said once.
    assert sorted(ip for ip, _ in channel.asked) == sorted(
        p["status"]["podIP"] for p in cluster.pods("j").values()
    )
    assert len({r for _, r in channel.asked}) == 1
    cluster.advance(5)
    cluster.settle()
    assert len(channel.asked) == 2  # not again once every worker acknowledged it
    assert cluster.job("j")["status"]["checkpointRequests"] == 1
    assert cluster.recorded.reasons("j").count("CheckpointRequested") == 1


def test_a_pod_lost_in_one_slice_recreates_that_slice_and_restarts_the_other_in_place():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel, slices=2)
    kept = {n: u for n, u in uids.items() if n.startswith("j-0-")}
    kept_ips = {cluster.pods("j")[n]["status"]["podIP"] for n in kept}
    cluster.evict_pod("j-1-0")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"], status["recreatedSlices"]) == (
        2,
        "Mixed",
        [1],
    )
    assert (status["restarts"], status["inPlaceRestarts"]) == (1, 1)
    assert "restarting slice by slice (slice 1 recreated (slice 1: pod j-1-0" in (
        restarting_event(cluster)
    )
    assert "slice 0 in place" in restarting_event(cluster)
    # Slice 0's processes were stopped and its pods carried into attempt 2 (by its
    # slice's record; no pod written to); slice 1's pods of attempt 1 are being deleted.
    # Nothing starts while a pod of attempt 1 is left.
    pods = cluster.pods("j")
    assert {n: pods[n]["metadata"]["uid"] for n in kept} == kept
    assert {attempts(cluster)[n] for n in kept} == {2}
    assert {labels(cluster)[n] for n in kept} == {"1"}
    assert pod_writes(cluster) == []
    assert all(pods[n]["metadata"].get("deletionTimestamp") for n in ("j-1-0", "j-1-1"))
    assert {ip for verb, ip, _ in channel.calls if verb == "stop"} == kept_ips
    assert not [c for c in channel.calls if c[0] == "start"]
    cluster.confirm_deletions()
    cluster.settle()
    # Slice 1's pods are created anew for attempt 2; slice 0 waits until they run.
    pods = cluster.pods("j")
    fresh = {n: p for n, p in pods.items() if n.startswith("j-1-")}
    assert len(fresh) == 2 and not {p["metadata"]["uid"] for p in fresh.values()} & set(
        uids.values()
    )
    assert {p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT] for p in fresh.values()} == {
        "2"
    }
    for pod in fresh.values():  # their supervisors wait for the operator's start
        (worker,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in worker["env"]}
        assert env[contract.ENV_AWAIT_START] == "true"
    assert not [c for c in channel.calls if c[0] == "start"]
    assert cluster.job("j")["status"]["phase"] != "Running"
    # The new pods run, their supervisors waiting: every pod is started.
    cluster.run_pods("j")
    for index, name in enumerate(sorted(fresh)):
        pod = cluster.pods("j")[name]
        pod["status"]["podIP"] = ip = f"10.0.1.{index + 1}"
        pod["status"]["containerStatuses"] = [
            {
                "name": contract.WORKER_CONTAINER,
                "state": {"running": {"startedAt": stamp(cluster.now)}},
            }
        ]
        channel.processes[ip] = ProcessState("idle", 0)
        set_ready(cluster, pod, False)
    fresh_ips = {cluster.pods("j")[n]["status"]["podIP"] for n in fresh}
    assert not any(channel.processes[ip].running for ip in kept_ips)
    # The pass that sends the starts wrote Starting; nothing about the pods changes after
    # it (a started process's pod stays Ready), so it asks to look again at once.
    requeue = cluster.reconcile_job("j")
    assert [c for c in channel.calls if c[0] == "start"]
    assert cluster.job("j")["status"]["phase"] == "Starting"
    assert requeue is not None and requeue <= MIN_REQUEUE_SECONDS
    for name in fresh:  # the started processes' readiness
        set_ready(cluster, cluster.pods("j")[name], True)
    cluster.reconcile_job("j")
    assert cluster.job("j")["status"]["phase"] == "Running"
    cluster.settle()
    starts = [c for c in channel.calls if c[0] == "start"]
    assert {ip for _, ip, _ in starts} == kept_ips | fresh_ips, starts
    assert all(channel.processes[ip].attempt == 2 for ip in kept_ips | fresh_ips)
    assert all(channel.starts_saw) and channel.starts_saw
    status = cluster.job("j")["status"]
    assert status["phase"] == "Running" and status["attempt"] == 2
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items() if n in kept} == kept


def test_a_mixed_restart_writes_the_slice_it_recreates_before_those_it_keeps():
    """The recreated slice is the restart's critical path (its pods are deleted and made
    again): its record is written, and answered, before any kept slice's is sent."""
    cluster, channel = supervised_cluster()
    running_job(cluster, channel, slices=3)
    cluster.clear_requests()
    cluster.evict_pod("j-1-0")
    cluster.settle()
    assert cluster.job("j")["status"]["recreatedSlices"] == [1]
    slice_writes = [
        r.path.rsplit("/", 1)[-1]
        for r in cluster.requests
        if r.verb == "PATCH"
        and f"/{contract.SLICE_PLURAL}/" in r.path
        and not r.path.endswith("/status")
    ]
    assert slice_writes[:3] == ["j-1", "j-0", "j-2"], slice_writes


def test_a_slice_that_keeps_failing_on_its_pool_is_recreated_on_another():
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel, slices=2, maxRestarts=10, maxSliceFailuresPerPool=2)
    pools = cluster.job("j")["status"]["nodePools"]
    cluster.add_pool("p3", *V5P, hosts=2)  # free from now on
    # Slice 1's worker fails once: an in-place restart, counted on its slice.
    process_exits(cluster, channel, "j-1-0", 1)
    cluster.settle()
    for pod in cluster.pods("j").values():
        set_ready(cluster, pod, True)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"], status["restartKind"]) == (
        "Running",
        2,
        "InPlace",
    )
    assert [(s["failures"], s["poolFailures"]) for s in status["slices"]] == [(0, 0), (1, 1)]
    # Twice on the same pool: the next restart recreates slice 1 on the free pool.
    process_exits(cluster, channel, "j-1-1", 1)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"], status["recreatedSlices"]) == (
        3,
        "Mixed",
        [1],
    )
    assert status["nodePools"] == [pools[0], "p3"]
    moved = [m for n, _, r, m in cluster.recorded.events if r == "NodePoolUnhealthy"]
    assert moved == [
        f"slice 1: its workers failed 2 times on node pool {pools[1]} "
        "(failurePolicy.maxSliceFailuresPerPool: 2); moved to node pool p3"
    ]
    cluster.confirm_deletions()
    cluster.settle()
    fresh = {n: p for n, p in cluster.pods("j").items() if n.startswith("j-1-")}
    assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in fresh.values()} == {
        "p3"
    }
    kept = {n: u for n, u in uids.items() if n.startswith("j-0-")}
    assert {n: cluster.pods("j")[n]["metadata"]["uid"] for n in kept} == kept
    # On its new pool the slice's count starts again.
    cluster.run_pods("j")
    cluster.settle()
    (summary,) = [s for s in cluster.job("j")["status"]["slices"] if s["index"] == 1]
    assert (summary["failures"], summary["poolFailures"], summary["nodePool"]) == (2, 0, "p3")


def test_a_slice_whose_vm_is_deleted_moves_to_a_free_pool():
    """A VM of slice 1's pool is deleted (GKE will replace it, some time): its pod is
    gone, the pool has 1 of the 2 VMs the slice needs. Slice 1 is recreated on the free
    pool at once; slice 0 restarts in place."""
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel, slices=2)
    cluster.add_pool("p3", *V5P, hosts=2)
    pools = cluster.job("j")["status"]["nodePools"]
    pod = cluster.pods("j")["j-1-0"]
    node = pod["spec"]["nodeName"]
    del cluster.objects[f"/api/v1/nodes/{node}"]
    cluster.evict_pod("j-1-0", reason="DeletionByPodGC")
    cluster.confirm_deletion("j-1-0")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"], status["recreatedSlices"]) == (
        2,
        "Mixed",
        [1],
    )
    assert status["nodePools"] == [pools[0], "p3"]
    (moved,) = [m for n, _, r, m in cluster.recorded.events if r == "NodePoolUnhealthy"]
    assert f"{pools[1]} has 1 of the 2 VMs its slice needs; moved to node pool p3" in moved
    kept = {n: u for n, u in uids.items() if n.startswith("j-0-")}
    assert {n: cluster.pods("j")[n]["metadata"]["uid"] for n in kept} == kept


def new_operator(cluster: FakeCluster) -> None:
    """The operator is SIGKILLed and another starts: what it remembered of the restart
    (stops confirmed, starts sent) and of the slices' records is gone; it has only what
    the API holds."""
    assert cluster.ctx.supervisors is not None
    cluster.ctx.supervisors = Supervisors(
        cluster.ctx.supervisors.channel, cluster, clock=lambda: cluster.monotonic
    )
    cluster.caches.owners = SliceOwners()


def test_a_mixed_restart_survives_new_operators_at_each_step_and_writes_no_pod():
    """A new operator after the restart is committed, after the recreated slice's new
    pods exist, and after the starts went out: the kept pods keep their UIDs and are
    never written to, each pod of the recreated slice is created once, no process of
    attempt 2 starts while one of attempt 1 runs, and the job runs attempt 2."""
    cluster, channel = supervised_cluster()
    uids = running_job(cluster, channel, slices=2)
    kept = {n: u for n, u in uids.items() if n.startswith("j-0-")}
    cluster.evict_pod("j-1-0")
    cluster.reconcile_job("j")  # the restart is committed (and acted on once)
    new_operator(cluster)
    cluster.settle()
    assert {attempts(cluster)[n] for n in kept} == {2}  # from the slice's record alone
    cluster.confirm_deletions()
    cluster.settle()
    fresh = {n: p["metadata"]["uid"] for n, p in cluster.pods("j").items() if n.startswith("j-1-")}
    assert len(fresh) == 2 and not set(fresh.values()) & set(uids.values())
    new_operator(cluster)
    cluster.run_pods("j")
    for index, name in enumerate(sorted(fresh)):
        pod = cluster.pods("j")[name]
        pod["status"]["podIP"] = ip = f"10.0.1.{index + 1}"
        pod["status"]["containerStatuses"] = [
            {
                "name": contract.WORKER_CONTAINER,
                "state": {"running": {"startedAt": stamp(cluster.now)}},
            }
        ]
        channel.processes[ip] = ProcessState("idle", 0)  # waiting for its start
        set_ready(cluster, pod, False)
    cluster.reconcile_job("j")  # the starts go out
    new_operator(cluster)
    for pod in cluster.pods("j").values():
        set_ready(cluster, pod, True)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Running", 2, 1)
    pods = cluster.pods("j")
    assert {n: p["metadata"]["uid"] for n, p in pods.items()} == {**kept, **fresh}
    assert set(attempts(cluster).values()) == {2}
    ips = {p["status"]["podIP"] for p in pods.values()}
    assert all(channel.processes[ip].attempt == 2 and channel.processes[ip].running for ip in ips)
    assert channel.starts_saw and all(channel.starts_saw)
    assert pod_writes(cluster) == []


def test_a_new_pods_supervisor_not_listening_yet_is_started_on_a_later_pass():
    """The recreated slice's pods run, but one supervisor has not bound its port yet: its
    start fails to connect and is sent again on later passes (not an unreachable
    supervisor, which would recreate every pod), until it answers."""
    cluster, channel = supervised_cluster()
    running_job(cluster, channel, slices=2)
    cluster.evict_pod("j-1-0")
    cluster.settle()
    cluster.confirm_deletions()
    cluster.settle()
    fresh = sorted(n for n in cluster.pods("j") if n.startswith("j-1-"))
    cluster.run_pods("j")
    for index, name in enumerate(fresh):
        pod = cluster.pods("j")[name]
        pod["status"]["podIP"] = ip = f"10.0.1.{index + 1}"
        pod["status"]["containerStatuses"] = [
            {
                "name": contract.WORKER_CONTAINER,
                "state": {"running": {"startedAt": stamp(cluster.now)}},
            }
        ]
        channel.processes[ip] = ProcessState("idle", 0)
        set_ready(cluster, pod, False)
    late = "10.0.1.1"
    channel.unreachable.add(late)
    for _ in range(5):
        cluster.reconcile_job("j")
        cluster.advance(1)
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"]) == (2, "Mixed"), status.get("lastFailure")
    assert not channel.processes[late].running
    channel.unreachable.discard(late)  # its supervisor listens now
    cluster.reconcile_job("j")
    assert channel.processes[late] == ProcessState("running", 2)
    for pod in cluster.pods("j").values():
        set_ready(cluster, pod, True)
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Running", 2, 1)


def test_the_operator_s_spares_are_kept_from_placements_and_taken_to_replace_a_slice():
    """The operator's spare selector names pool p0-spare: the job's first placement
    leaves it (though it sorts first); when a VM of slice 1's pool is deleted, slice 1
    moves to the spare (though free pool p0 sorts before it), slice 0 restarts in place,
    and the pool left is reported until it has all its VMs again."""
    cluster, channel = supervised_cluster()
    cluster.ctx.default_spares = spares_of(match_labels={"example.com/pool-role": "spare"})
    for name in cluster.add_pool("p0-spare", *V5P, hosts=2):
        cluster.objects[f"/api/v1/nodes/{name}"]["metadata"]["labels"]["example.com/pool-role"] = (
            "spare"
        )
    uids = running_job(cluster, channel, slices=2)
    pools = cluster.job("j")["status"]["nodePools"]
    assert pools == ["p1", "p2"]
    cluster.add_pool("p0", *V5P, hosts=2)
    node = cluster.pods("j")["j-1-0"]["spec"]["nodeName"]
    deleted = cluster.objects.pop(f"/api/v1/nodes/{node}")
    cluster.evict_pod("j-1-0", reason="DeletionByPodGC")
    cluster.confirm_deletion("j-1-0")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["restartKind"], status["recreatedSlices"]) == (
        2,
        "Mixed",
        [1],
    )
    assert status["nodePools"] == ["p1", "p0-spare"]
    (moved,) = [m for n, _, r, m in cluster.recorded.events if r == "NodePoolUnhealthy"]
    assert "p2 has 1 of the 2 VMs its slice needs; moved to spare node pool p0-spare" in moved
    (broken,) = status["brokenNodePools"]
    assert (broken["nodePool"], broken["movedTo"], broken["spare"]) == ("p2", "p0-spare", True)
    (healthy,) = [c for c in status["conditions"] if c["type"] == "NodePoolsHealthy"]
    assert (healthy["status"], healthy["reason"]) == ("False", "NodePoolUnhealthy")
    kept = {n: u for n, u in uids.items() if n.startswith("j-0-")}
    assert {n: cluster.pods("j")[n]["metadata"]["uid"] for n in kept} == kept
    assert cluster.recorded.moves == ["spare"]
    # GKE replaces the VM: the pool leaves the report and is held as the job's spare in
    # place of the one slice 1 took.
    cluster.objects[f"/api/v1/nodes/{node}"] = deleted
    cluster.confirm_deletions()
    cluster.run_pods("j")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status.get("brokenNodePools", []) == []
    (healthy,) = [c for c in status["conditions"] if c["type"] == "NodePoolsHealthy"]
    assert (healthy["status"], healthy["reason"]) == ("True", "NodePoolsHealthy")
    assert "NodePoolsHealthy" in cluster.recorded.reasons("j")
    assert status["spareNodePools"] == ["p2"]
    # Another job's placement leaves it (p2 sorts before p3), as it leaves a named spare.
    cluster.add_pool("p3", *V5P, hosts=2)
    cluster.apply_job("k", {**job_spec(), "numSlices": 2})
    cluster.settle()
    assert cluster.job("k")["status"]["nodePools"] == ["p0", "p3"]
    # Slice 0's pool breaks: it moves to the job's held spare (p2), not to free p10 that
    # sorts before it; p2 is a spare no more.
    cluster.add_pool("p10", *V5P, hosts=2)
    node = cluster.pods("j")["j-0-0"]["spec"]["nodeName"]
    cluster.objects.pop(f"/api/v1/nodes/{node}")
    cluster.evict_pod("j-0-0", reason="DeletionByPodGC")
    cluster.confirm_deletion("j-0-0")
    cluster.settle()
    status = cluster.job("j")["status"]
    assert (status["attempt"], status["nodePools"]) == (3, ["p2", "p0-spare"]), status
    assert status.get("spareNodePools", []) == []
    (broken,) = status["brokenNodePools"]
    assert (broken["nodePool"], broken["movedTo"], broken["spare"]) == ("p1", "p2", True)
