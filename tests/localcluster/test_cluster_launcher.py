"""The launcher's promises: port retries, crash recovery, no orphans, detached mode."""

from __future__ import annotations

import ipaddress
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import Cluster, ClusterError, Pool, controlplane
from localcluster.agent.ipam import Block, RouteError
from localcluster.layout import Layout, read_state, recorded_processes
from localcluster.procs import ProcessRecord
from localcluster.testing import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TINY = [Pool(name="cpu", vms=1)]


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "c"
    yield path
    # Whatever a test leaves running is stopped (and must be stoppable).
    if any(r.alive() for r in recorded_processes(read_state(Layout(path))).values()):
        subprocess.run(
            [sys.executable, "-m", "localcluster", "down", f"--dir={path}"], cwd=REPO, check=False
        )


def _records(directory: Path) -> dict[str, ProcessRecord]:
    return recorded_processes(read_state(Layout(directory)))


def test_port_in_use_is_retried_with_another(
    directory: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = controlplane.pick_ports
    calls = []

    def first_one_taken() -> controlplane.Ports:
        ports = real()
        calls.append(ports)
        if len(calls) == 1:
            return controlplane.Ports(ports.etcd_client, ports.etcd_peer, taken.getsockname()[1])
        return ports

    monkeypatch.setattr(controlplane, "pick_ports", first_one_taken)
    try:
        with Cluster.start(directory, pools=TINY) as cluster:
            assert len(calls) == 2
            assert cluster.server.endswith(f":{calls[1].apiserver}")
            assert "kube-apiserver could not bind its port" in capfd.readouterr().err
            cluster.kubectl("get", "nodes")
    finally:
        taken.close()


def test_crashed_run_leaves_no_process_and_its_directory_is_reused(directory: Path) -> None:
    script = (
        "import sys, time\n"
        "from localcluster import Cluster, Pool\n"
        f"Cluster.start({str(directory)!r}, pools=[Pool(name='cpu', vms=1)])\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline().strip() == "up"
        records = _records(directory)
        assert set(records) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "node-agent",
        }
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        wait_until(
            lambda: not any(r.alive() for r in records.values()),
            timeout=20,
            message=lambda: f"orphans to die: {[n for n, r in records.items() if r.alive()]}",
        )
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    # The directory still says "running": the next start must see the crash and recover.
    assert read_state(Layout(directory))["status"] == "running"
    with Cluster.start(directory, pools=TINY) as cluster:
        assert cluster.kubectl("get", "nodes", "-o", "name").stdout.strip() == "node/cpu-0"


def test_second_start_in_a_live_directory_is_refused(directory: Path) -> None:
    with (
        Cluster.start(directory, pools=TINY),
        pytest.raises(ClusterError, match="already running"),
    ):
        Cluster.start(directory, pools=TINY)


def test_cli_up_status_fault_down_detached(directory: Path) -> None:
    def cli(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "localcluster", command, f"--dir={directory}", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    up = cli("up")
    assert up.returncode == 0, up.stderr
    assert f"KUBECONFIG={directory}/kubeconfig" in up.stdout
    assert "cluster up in" in up.stderr
    records = _records(directory)
    assert all(r.alive() for r in records.values()), "detached components outlive `up`"
    daemon = ProcessRecord.from_json(read_state(Layout(directory))["supervisor"])
    assert daemon.alive(), "so does the daemon that supervises them"

    status = cli("status")
    assert status.returncode == 0 and '"cpu-0"' in status.stdout, status.stderr
    fault = cli("fault", "not-ready", "cpu-0")
    assert fault.returncode == 0, fault.stderr
    nodes = cli("kubectl", "get", "nodes")
    assert "NotReady" in nodes.stdout, nodes.stdout + nodes.stderr
    bad = cli("fault", "heal", "no-such-node")
    assert bad.returncode == 1 and "not found" in bad.stderr

    down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not any(r.alive() for r in records.values()) and not daemon.alive()
    supervisor_log = (directory / "logs" / "supervisor.log").read_text().splitlines()
    assert supervisor_log[-1].endswith(f"cluster in {directory} stopped"), "by the daemon"
    again = cli("status")
    assert again.returncode == 1 and "no cluster is running" in again.stderr


def test_pool_file_is_honoured_by_cli(directory: Path, tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - {name: tiny, accelerator: tpu-v6e-slice, topology: 2x2, vms: 1, chips_per_vm: 4}\n"
    )
    started = time.monotonic()
    up = subprocess.run(
        [sys.executable, "-m", "localcluster", "up", f"--dir={directory}", f"--pools={pools}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert time.monotonic() - started < 60
    cluster = Cluster.attach(directory)
    try:
        labels = cluster.api().get("/api/v1/nodes/tiny-0")["metadata"]["labels"]
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
        assert labels["node.kubernetes.io/instance-type"] == "ct6e-standard-4t"
    finally:
        cluster.stop()
    assert not cluster.layout.agent_socket.exists()


def test_routed_pod_addresses_are_published_and_reached_by_name(
    directory: Path, tmp_path: Path
) -> None:
    """``pod_addresses="routed"``: pods get 100.B addresses, which the endpoint controllers
    publish in the Service's EndpointSlice (loopback ones are refused), and a peer reaches
    a pod by its DNS name on that address."""
    try:
        Block.claim(tmp_path / "locks", addresses="routed").release()
    except RouteError as error:
        pytest.skip(f"this machine cannot route a block locally: {error}")
    serve = (
        "import socket, time\n"
        "s = socket.socket(); s.bind((socket.gethostbyname(socket.gethostname()), 8471))\n"
        "s.listen()\n"
        "c, _ = s.accept(); c.sendall(b'hello'); time.sleep(600)\n"
    )
    ask = (
        "import socket, time\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        print(socket.create_connection(('w0.w', 8471), 2).recv(5).decode()); break\n"
        "    except OSError: time.sleep(0.2)\n"
    )

    def pod(name: str, code: str, restart: str) -> dict[str, object]:
        container = {"name": "c", "image": "python", "command": [sys.executable, "-c", code]}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "w"}},
            "spec": {
                "hostname": name,
                "subdomain": "w",
                "restartPolicy": restart,
                "containers": [container],
            },
        }

    with Cluster.start(directory, pools=TINY, pod_addresses="routed") as cluster:
        api = cluster.api()
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "w"},
            "spec": {"clusterIP": "None", "selector": {"app": "w"}},
        }
        api.call("POST", "/api/v1/namespaces/default/services", service)
        api.call("POST", "/api/v1/namespaces/default/pods", pod("w0", serve, "Always"))
        api.call("POST", "/api/v1/namespaces/default/pods", pod("w1", ask, "Never"))

        def phase(name: str) -> str:
            return str(api.get(f"/api/v1/namespaces/default/pods/{name}")["status"].get("phase"))

        wait_until(lambda: phase("w1") == "Succeeded", timeout=60, message="w1 to succeed")
        assert cluster.pod_log("default", "w1", "c").read_text().strip() == "hello"
        address = api.get("/api/v1/namespaces/default/pods/w0")["status"]["podIP"]
        assert ipaddress.ip_address(address) in ipaddress.ip_network("100.64.0.0/10")

        def published() -> list[str] | None:
            slices = api.get(
                "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
                "?labelSelector=kubernetes.io%2Fservice-name%3Dw"
            )["items"]
            found = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
            return found if address in found else None

        wait_until(published, timeout=30, message="w0's address in the Service's EndpointSlice")
        warnings = api.get("/api/v1/namespaces/default/events?fieldSelector=type%3DWarning")
        refused = [e["message"] for e in warnings["items"] if "is invalid" in e["message"]]
        assert refused == [], "the apiserver refused the endpoint controllers' writes"
