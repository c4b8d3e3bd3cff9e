"""The node agent's probe logic without a cluster or processes: parsing, named ports,
threshold counting, the HTTP request and verdict, exec command lines, the event rate limit
and container readiness in the status (handlers against real servers and processes are in
``test_cluster_probes.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, cast

import pytest

from localcluster.agent.events import BURST, REFILL, Bucket, EventRecorder
from localcluster.agent.kube import Kube
from localcluster.agent.probes import (
    Exec,
    HttpGet,
    Kind,
    ProbeError,
    Prober,
    ProbeSpec,
    Target,
    TcpSocket,
    Threshold,
    container_probes,
    exec_argv,
    http_outcome,
    http_request,
    parse_probe,
    resolve_port,
)
from localcluster.agent.status import ContainerStatus, running_state

pytestmark = pytest.mark.unit

CONTAINER = {"name": "main", "ports": [{"name": "control", "containerPort": 8471}]}


def test_parse_applies_api_defaults_and_minimums() -> None:
    spec = parse_probe("readiness", {"httpGet": {"port": 80}, "periodSeconds": 0})
    assert spec == ProbeSpec("readiness", HttpGet(port=80), 0.0, 1.0, 1.0, 1, 3, None)
    spec = parse_probe("liveness", {"tcpSocket": {"port": "control"}})
    assert (spec.period, spec.timeout, spec.failure_threshold) == (10.0, 1.0, 3)
    assert spec.handler == TcpSocket(port="control")


def test_parse_http_fields() -> None:
    raw = {
        "httpGet": {
            "port": "control",
            "path": "/readyz",
            "scheme": "https",
            "host": "10.1.2.3",
            "httpHeaders": [{"name": "X-Probe", "value": "1"}],
        },
        "initialDelaySeconds": 2,
        "periodSeconds": 1,
        "timeoutSeconds": 3,
        "successThreshold": 2,
        "failureThreshold": 1,
    }
    spec = parse_probe("readiness", raw)
    assert spec.handler == HttpGet("control", "/readyz", "10.1.2.3", "HTTPS", (("X-Probe", "1"),))
    assert (spec.initial_delay, spec.period, spec.timeout) == (2.0, 1.0, 3.0)
    assert (spec.success_threshold, spec.failure_threshold) == (2, 1)


def test_liveness_success_threshold_is_one_and_grace_applies_to_liveness_only() -> None:
    raw = {"exec": {"command": ["true"]}, "successThreshold": 3, "terminationGracePeriodSeconds": 5}
    liveness = parse_probe("liveness", raw)
    assert liveness.success_threshold == 1 and liveness.termination_grace == 5.0
    assert liveness.handler == Exec(("true",))
    readiness = parse_probe("readiness", raw)
    assert readiness.success_threshold == 3 and readiness.termination_grace is None


def test_grpc_and_empty_probes_are_ignored_with_a_warning() -> None:
    container = {
        "name": "main",
        "readinessProbe": {"grpc": {"port": 9000}},
        "livenessProbe": {"exec": {"command": []}},
        "startupProbe": {"tcpSocket": {"port": 1}},
    }
    specs, warnings = container_probes(container)
    assert [s.kind for s in specs] == ["startup"]
    assert len(warnings) == 2
    assert "gRPC probes are not supported" in warnings[1] and "readinessProbe" in warnings[1]


def test_named_and_numeric_ports() -> None:
    assert resolve_port("control", CONTAINER) == 8471
    assert resolve_port(8080, CONTAINER) == 8080
    assert resolve_port("8080", CONTAINER) == 8080
    with pytest.raises(ProbeError, match="couldn't find port: metrics"):
        resolve_port("metrics", CONTAINER)
    with pytest.raises(ProbeError, match="invalid port"):
        resolve_port(70000, CONTAINER)


def _spec(kind: Kind = "readiness", success: int = 1, failure: int = 3) -> ProbeSpec:
    return ProbeSpec(kind, TcpSocket(1), success_threshold=success, failure_threshold=failure)


def test_readiness_starts_failed_and_needs_consecutive_successes() -> None:
    spec = _spec(success=2, failure=2)
    state = Threshold.initial("readiness")
    assert state.result is False
    changes = [state.observe(ok, spec) for ok in (True, False, True, True)]
    assert changes == [False, False, False, True] and state.result is True
    changes = [state.observe(ok, spec) for ok in (False, True, False, False, False)]
    assert changes == [False, False, False, True, False] and state.result is False


def test_liveness_starts_succeeded_and_fails_after_threshold() -> None:
    spec = _spec("liveness", failure=3)
    state = Threshold.initial("liveness")
    assert state.result is True
    assert [state.observe(False, spec) for _ in range(3)] == [False, False, True]
    assert Threshold.initial("startup").result is False


def test_http_request_and_outcome() -> None:
    request = http_request(HttpGet(80, "readyz", headers=(("Host", "example"),)), "10.0.0.1", 80)
    text = request.decode()
    assert text.startswith("GET /readyz HTTP/1.1\r\n")
    assert "Host: example\r\n" in text and "10.0.0.1" not in text
    assert "User-Agent: kube-probe/" in text and text.endswith("\r\n\r\n")
    assert http_outcome(b"HTTP/1.1 200 OK\r\n") == (True, "")
    assert http_outcome(b"HTTP/1.1 302 Found\r\n") == (True, "")
    assert http_outcome(b"HTTP/1.0 503 Service Unavailable\r\n") == (
        False,
        "HTTP probe failed with statuscode: 503",
    )
    assert http_outcome(b"")[0] is False


def test_exec_argv_enters_the_container_namespaces() -> None:
    target = Target("127.0.0.1", CONTAINER, pid=42, nsenter="/usr/bin/nsenter", setpriv="/sp")
    argv = exec_argv(Exec(("cat", "/tmp/x")), target)
    assert argv == [
        "/sp", "--pdeathsig=KILL", "--",
        "/usr/bin/nsenter", "-t", "42", "--mount", "--uts", "-w", "--", "cat", "/tmp/x",
    ]  # fmt: skip
    assert exec_argv(Exec(("true",)), Target("127.0.0.1", CONTAINER)) == ["true"]


def test_token_bucket_allows_a_burst_then_refills() -> None:
    bucket = Bucket(stamp=0.0)
    assert all(bucket.take(0.0) for _ in range(BURST))
    assert not bucket.take(1.0)
    assert bucket.take(REFILL + 1.0)
    assert not bucket.take(REFILL + 1.0)


def test_container_status_ready_follows_probe_verdicts() -> None:
    status = ContainerStatus("main", "local", running_state("2026-01-01T00:00:00Z"))
    assert status.to_json()["ready"] is True
    status.probe_ready = False
    assert status.to_json()["ready"] is False and status.to_json()["started"] is True
    status.probe_started, status.probe_ready = False, None
    assert status.to_json()["started"] is False and status.to_json()["ready"] is False


def test_terminating_pods_keep_only_readiness_probes() -> None:
    def prober(*kinds: Kind) -> Prober:
        specs = [_spec(kind) for kind in kinds]
        return Prober(specs, Target("127.0.0.1", CONTAINER), changed=_none, kill=_none, event=_none)

    running = prober("startup", "liveness", "readiness")
    assert [s.kind for s in running._active()] == ["startup"]  # not started yet
    running.states["startup"].result = True
    assert [s.kind for s in running._active()] == ["liveness", "readiness"]
    running.stop_liveness_and_startup()
    assert [s.kind for s in running._active()] == ["readiness"]
    starting = prober("startup", "readiness")
    starting.stop_liveness_and_startup()
    assert starting._active() == []


def _none(*_: object) -> None:
    return None


class _Api:
    """Records the requests the recorder makes (the apiserver's part is not under test)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def call(self, method: str, path: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append((method, path, body))


POD = {
    "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
    "spec": {"nodeName": "node-0"},
}


def test_repeated_events_raise_the_count_and_new_ones_are_rate_limited() -> None:
    api = _Api()
    pending: dict[Hashable, Callable[[], Awaitable[None]]] = {}

    async def flush() -> None:
        while pending:
            await pending.pop(next(iter(pending)))()

    async def scenario() -> None:
        recorder = EventRecorder(cast(Kube, api), pending.__setitem__, burst=2, flush_interval=0.05)

        def record(message: str) -> None:
            recorder.record(
                POD, kind="Warning", reason="Unhealthy", message=message, container="main"
            )

        for _ in range(3):
            record("Readiness probe failed: 503")
        await flush()  # the first write runs late: it posts the count it sees then
        record("Readiness probe failed: refused")
        record("Liveness probe failed: refused")  # over the burst of 2: dropped
        await flush()
        await asyncio.sleep(0.1)  # the deferred update finds count 3 written: no request
        await flush()
        # The deferred update stamped its write when its timer fired, which a loaded machine
        # can delay: wait a whole interval past it so the repeat is not deferred too.
        await asyncio.sleep(0.06)
        record("Readiness probe failed: 503")  # a repeat after the interval: patched at once
        await flush()

    asyncio.run(scenario())
    posts = [body for method, _, body in api.calls if method == "POST"]
    assert [(b["message"], b["count"]) for b in posts] == [
        ("Readiness probe failed: 503", 3),
        ("Readiness probe failed: refused", 1),
    ]
    first = posts[0]
    assert first["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert first["source"] == {"component": "kubelet", "host": "node-0"}
    assert first["metadata"]["name"].startswith("web.")
    assert [method for method, _, _ in api.calls] == ["POST", "POST", "PATCH"]
    _, path, body = api.calls[2]
    assert path == f"/api/v1/namespaces/ns/events/{first['metadata']['name']}"
    assert body["count"] == 4 and set(body) == {"count", "lastTimestamp"}
