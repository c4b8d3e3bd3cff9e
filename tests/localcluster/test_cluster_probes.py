"""Container probes in the node agent: handlers against real servers and processes, then
readiness, liveness, startup probes and readiness gates on pods of the local cluster.

The pods' scripts read flag files in their working directory (the pod's directory on this
machine, which the test also sees) so a test switches an endpoint between healthy and
failing without timing assumptions.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, pki
from localcluster.agent.probes import (
    Exec,
    HttpGet,
    Prober,
    ProbeSpec,
    Target,
    TcpSocket,
    attempt,
)
from localcluster.api import SyncApi
from localcluster.testing import pod, wait_until

pytestmark = pytest.mark.integration

# Handlers and the prober against real local servers and processes (no cluster) ------------


@asynccontextmanager
async def _http_server(
    codes: list[int], tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[int, list[bytes]]]:
    """Answers each request with the next code of ``codes`` (the last one repeats)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
        except asyncio.IncompleteReadError:  # a TCP probe: connect, close
            writer.close()
            return
        code = codes.pop(0) if len(codes) > 1 else codes[0]
        writer.write(f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield port, seen


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_http_and_tcp_handlers_against_a_real_server() -> None:
    async def scenario() -> None:
        async with _http_server([200, 500]) as (port, seen):
            container = {"name": "main", "ports": [{"name": "web", "containerPort": port}]}
            target = Target("127.0.0.1", container)
            spec = ProbeSpec("readiness", HttpGet("web", "/readyz", headers=(("X-A", "b"),)))
            assert await attempt(spec, target) == (True, "")
            assert await attempt(spec, target) == (False, "HTTP probe failed with statuscode: 500")
            assert seen[0].startswith(b"GET /readyz HTTP/1.1") and b"X-A: b" in seen[0]
            assert await attempt(ProbeSpec("liveness", TcpSocket(port)), target) == (True, "")
        ok, message = await attempt(ProbeSpec("liveness", TcpSocket(port)), target)
        assert not ok and "connect: connection refused" in message
        ok, message = await attempt(spec, target)
        assert not ok and message.startswith(f'Get "http://127.0.0.1:{port}/readyz": dial tcp')

    asyncio.run(scenario())


def test_https_probe_skips_certificate_verification(tmp_path: Path) -> None:
    """The server's certificate comes from a CA nobody trusts, as the kubelet allows."""
    pki.generate(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")

    async def scenario() -> list[tuple[bool, str]]:
        async with _http_server([204, 404], tls) as (port, _):
            spec = ProbeSpec("liveness", HttpGet(port, "/healthz", scheme="HTTPS"))
            target = Target("127.0.0.1", {"name": "main"})
            return [await attempt(spec, target), await attempt(spec, target)]

    assert asyncio.run(scenario()) == [
        (True, ""),
        (False, "HTTP probe failed with statuscode: 404"),
    ]


def test_exec_handler_output_exit_code_and_timeout() -> None:
    target = Target("127.0.0.1", {"name": "main"}, env={"PATH": os.defpath, "WHO": "probe"})
    script = "import os, sys; print(os.environ['WHO']); sys.exit(int(sys.argv[1]))"

    def run(*command: str, timeout: float = 1.0) -> tuple[bool, str]:
        return asyncio.run(attempt(ProbeSpec("readiness", Exec(command), timeout=timeout), target))

    assert run(sys.executable, "-c", script, "0") == (True, "probe\n")
    assert run(sys.executable, "-c", script, "3") == (False, "probe\n")
    assert run("sleep", "30") == (False, "command 'sleep 30' timed out")
    ok, output = run("no-such-binary-x")
    assert not ok and "no-such-binary-x" in output


def test_prober_startup_gates_readiness_and_liveness_kills() -> None:
    """Startup must succeed before readiness counts; a failing liveness probe kills once."""
    changes: list[tuple[bool | None, bool | None]] = []
    kills: list[str] = []
    events: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        killed = asyncio.Event()
        async with _http_server([500, 200]) as (port, _):
            specs = [
                ProbeSpec("startup", HttpGet(port, "/"), period=1.0, failure_threshold=5),
                ProbeSpec("readiness", TcpSocket(port), period=1.0),
                ProbeSpec("liveness", TcpSocket(_closed_port()), period=1.0, failure_threshold=2),
            ]
            prober: Prober | None = None

            def kill(spec: ProbeSpec, message: str) -> None:
                kills.append(message)
                killed.set()

            def changed() -> None:
                assert prober is not None
                changes.append((prober.started, prober.ready))

            prober = Prober(
                specs,
                Target("127.0.0.1", {"name": "main"}),
                changed=changed,
                kill=kill,
                event=lambda *event: events.append(event),
            )
            assert (prober.started, prober.ready) == (False, False)
            prober.start("test")
            try:
                await killed.wait()
            finally:
                prober.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    # Started after one failed attempt, ready at once, then killed by the liveness probe.
    assert changes == [(True, False), (True, True)]
    assert kills == ["Container main failed liveness probe, will be restarted"]
    kinds = [(kind, reason, message.split(":")[0]) for kind, reason, message in events]
    assert kinds[0] == ("Warning", "Unhealthy", "Startup probe failed")
    assert kinds.count(("Warning", "Unhealthy", "Liveness probe failed")) == 2


# Pods on the local cluster ----------------------------------------------------------------

SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    if os.path.exists("dead"):
        os.remove("dead")  # a restarted container is healthy again

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 503 if os.path.exists("unready") else 200
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
            print("GET", self.path, code, self.headers.get("User-Agent"), flush=True)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer((os.environ["POD_IP"], 8080), Handler)
    print("serving", flush=True)
    server.serve_forever()
    """
)
WAIT_THEN_LISTEN = textwrap.dedent(
    """
    import os, socket, time
    while not os.path.exists("listen"):
        time.sleep(0.1)
    server = socket.create_server((os.environ["POD_IP"], 9000))
    print("listening", flush=True)
    while True:
        server.accept()[0].close()
    """
)
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
PORTS = [{"name": "control", "containerPort": 8080}]


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def _get(api: SyncApi, namespace: str, name: str) -> dict[str, Any]:
    return api.get(f"{_pods(namespace)}/{name}")


def _condition(current: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (current.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def _container(current: dict[str, Any]) -> dict[str, Any]:
    statuses = (current.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def _ready(api: SyncApi, namespace: str, name: str, want: bool) -> dict[str, Any] | None:
    current = _get(api, namespace, name)
    ready = _condition(current, "Ready").get("status") == "True"
    return current if ready == want else None


def _events(api: SyncApi, namespace: str, name: str) -> list[dict[str, Any]]:
    items = api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == name]


def _event(api: SyncApi, namespace: str, name: str, reason: str, prefix: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for event in _events(api, namespace, name):
            if event["reason"] == reason and event["message"].startswith(prefix):
                return event
        return None

    return wait_until(find, timeout=60, message=f"event {reason} {prefix!r} on {name}")


def _describe(api: SyncApi, namespace: str, name: str) -> str:
    current = _get(api, namespace, name)
    status = current.get("status") or {}
    conditions = {c["type"]: (c["status"], c.get("reason")) for c in status.get("conditions", [])}
    return f"phase {status.get('phase')}, conditions {conditions}, container {_container(current)}"


def _wait_pod(
    api: SyncApi, namespace: str, name: str, check: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    def matching() -> dict[str, Any] | None:
        current = _get(api, namespace, name)
        return current if check(current) else None

    return wait_until(
        matching,
        timeout=90,
        message=lambda: f"pod {name}: {what}: {_describe(api, namespace, name)}",
    )


def _wait_ready(api: SyncApi, namespace: str, name: str, want: bool) -> dict[str, Any]:
    return wait_until(
        lambda: _ready(api, namespace, name, want),
        timeout=90,
        message=lambda: f"pod {name} Ready={want}: {_describe(api, namespace, name)}",
    )


def _directory(cluster: Cluster, namespace: str, name: str) -> Path:
    """The pod's directory: its containers' working directory, where the flags live."""
    return cluster.pod_log(namespace, name, "main").parent


def _http_pod(name: str, probes: dict[str, Any], restart_policy: str = "Never") -> dict[str, Any]:
    return pod(
        name,
        ["python", "-c", SERVER],
        restart_policy=restart_policy,
        grace=1,
        container={"env": [POD_IP], "ports": PORTS, **probes},
    )


def test_http_readiness_follows_the_endpoint_and_writes_only_changes(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    probe = {
        "httpGet": {"port": "control", "path": "/readyz"},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    api.call("POST", _pods(namespace), _http_pod("web", {"readinessProbe": probe}))
    ready = _wait_ready(api, namespace, "web", True)
    assert _condition(ready, "ContainersReady")["status"] == "True"
    assert _container(ready)["ready"] is True
    log = cluster.pod_log(namespace, "web", "main")
    assert "GET /readyz 200 kube-probe/" in log.read_text()

    # Steady state: probes keep running, the pod object is not written again.
    version = ready["metadata"]["resourceVersion"]
    probed = log.read_text().count("GET /readyz")
    wait_until(lambda: log.read_text().count("GET /readyz") >= probed + 3, timeout=60)
    assert _get(api, namespace, "web")["metadata"]["resourceVersion"] == version

    flag = _directory(cluster, namespace, "web") / "unready"
    flag.touch()
    unready = _wait_ready(api, namespace, "web", False)
    assert _condition(unready, "Ready")["reason"] == "ContainersNotReady"
    assert _condition(unready, "ContainersReady")["status"] == "False"
    assert _container(unready)["ready"] is False and _container(unready)["started"] is True
    assert unready["status"]["phase"] == "Running"
    # (Attempts before the server listened failed with "connection refused".)
    event = _event(api, namespace, "web", "Unhealthy", "Readiness probe failed: HTTP probe")
    assert event["message"] == "Readiness probe failed: HTTP probe failed with statuscode: 503"
    assert event["type"] == "Warning" and event["involvedObject"]["fieldPath"] == (
        "spec.containers{main}"
    )

    flag.unlink()
    _wait_ready(api, namespace, "web", True)


def test_tcp_readiness_waits_for_the_listener(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    probe = {"tcpSocket": {"port": 9000}, "periodSeconds": 1}
    manifest = pod(
        "tcp",
        ["python", "-c", WAIT_THEN_LISTEN],
        grace=1,
        container={"env": [POD_IP], "readinessProbe": probe},
    )
    api.call("POST", _pods(namespace), manifest)
    event = _event(api, namespace, "tcp", "Unhealthy", "Readiness probe failed:")
    assert "connect: connection refused" in event["message"]
    current = _get(api, namespace, "tcp")
    assert _condition(current, "Ready")["status"] == "False"
    assert _container(current)["state"].get("running")

    (_directory(cluster, namespace, "tcp") / "listen").touch()
    _wait_ready(api, namespace, "tcp", True)


def test_exec_probe_runs_inside_the_container(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    """The command sees the container's hostname (UTS namespace), environment and working
    directory."""
    check = 'test "$(hostname)" = "$EXPECT_HOST" && test "$FLAVOUR" = probe && test -e ok'
    probe = {"exec": {"command": ["sh", "-c", check]}, "periodSeconds": 1}
    manifest = pod(
        "exec",
        ["sleep", "300"],
        grace=1,
        spec={"hostname": "exec-host"},
        container={
            "env": [
                {"name": "EXPECT_HOST", "value": "exec-host"},
                {"name": "FLAVOUR", "value": "probe"},
            ],
            "readinessProbe": probe,
        },
    )
    api.call("POST", _pods(namespace), manifest)
    _event(api, namespace, "exec", "Unhealthy", "Readiness probe failed")
    assert _condition(_get(api, namespace, "exec"), "Ready")["status"] == "False"
    (_directory(cluster, namespace, "exec") / "ok").touch()
    _wait_ready(api, namespace, "exec", True)


def test_liveness_failure_restarts_the_container(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    probe = {
        "httpGet": {"port": 8080, "path": "/healthz"},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    liveness = {
        "exec": {"command": ["test", "!", "-e", "dead"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
        "terminationGracePeriodSeconds": 1,
    }
    manifest = _http_pod("alive", {"readinessProbe": probe, "livenessProbe": liveness}, "Always")
    api.call("POST", _pods(namespace), manifest)
    _wait_ready(api, namespace, "alive", True)
    (_directory(cluster, namespace, "alive") / "dead").touch()

    killed = _event(api, namespace, "alive", "Killing", "Container main failed liveness probe")
    assert killed["message"] == "Container main failed liveness probe, will be restarted"
    _event(api, namespace, "alive", "Unhealthy", "Liveness probe failed")
    restarted = _wait_pod(
        api,
        namespace,
        "alive",
        lambda c: (
            _container(c).get("restartCount") == 1 and bool(_container(c)["state"].get("running"))
        ),
        "a restarted, running container",
    )
    last = _container(restarted)["lastState"]["terminated"]
    assert last["exitCode"] == 143 and last["reason"] == "Error"  # SIGTERM, as the kubelet
    _wait_ready(api, namespace, "alive", True)
    assert _container(_get(api, namespace, "alive"))["restartCount"] == 1


def test_startup_probe_holds_readiness_and_grpc_is_ignored(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    probes = {
        "startupProbe": {
            "exec": {"command": ["test", "-e", "started"]},
            "periodSeconds": 1,
            "failureThreshold": 600,
        },
        "readinessProbe": {"grpc": {"port": 8080}},
    }
    api.call("POST", _pods(namespace), _http_pod("slow", probes))
    warning = _event(api, namespace, "slow", "ProbeWarning", "Readiness probe")
    assert "gRPC probes are not supported" in warning["message"]
    _event(api, namespace, "slow", "Unhealthy", "Startup probe failed")
    current = _get(api, namespace, "slow")
    assert _container(current)["state"].get("running")
    assert _container(current)["started"] is False and _container(current)["ready"] is False
    assert _condition(current, "Ready")["status"] == "False"

    (_directory(cluster, namespace, "slow") / "started").touch()
    ready = _wait_ready(api, namespace, "slow", True)  # no readiness probe runs (gRPC)
    assert _container(ready)["started"] is True


def test_readiness_gates_hold_the_ready_condition(
    api: SyncApi, cluster: Cluster, namespace: str
) -> None:
    gate = "example.com/warmed-up"
    manifest = pod(
        "gated", ["sleep", "300"], grace=1, spec={"readinessGates": [{"conditionType": gate}]}
    )
    api.call("POST", _pods(namespace), manifest)
    current = _wait_pod(
        api,
        namespace,
        "gated",
        lambda c: _condition(c, "ContainersReady").get("status") == "True",
        "ContainersReady",
    )
    assert _condition(current, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready",
        "status": "False",
        "reason": "ReadinessGatesNotReady",
        "lastProbeTime": None,
        "lastTransitionTime": None,
    }
    condition = {"type": gate, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    api.call(
        "PATCH",
        f"{_pods(namespace)}/gated/status",
        {"status": {"conditions": [condition]}},
        content_type="application/strategic-merge-patch+json",
    )
    _wait_ready(api, namespace, "gated", True)
