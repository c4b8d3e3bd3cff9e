"""Unit tests of localcluster's pure parts: pools, env, hosts files, status, writer, builds."""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localcluster import binaries
from localcluster.agent import envvars, ipam
from localcluster.agent.hosts import HostsFiles, write_in_place
from localcluster.agent.ipam import FIRST_BLOCK, Block, RouteError
from localcluster.agent.kube import KubeError
from localcluster.agent.status import ContainerStatus, pod_phase, terminated_state
from localcluster.agent.writer import Writer
from localcluster.pools import TPU_TAINT, Pool, PoolError, default_pools, pool_from_dict
from localcluster.procs import ProcessRecord

pytestmark = pytest.mark.unit


# Pools ----------------------------------------------------------------------------------


def test_default_pools_are_valid_and_include_multislice_and_cpu() -> None:
    pools = {p.name: p for p in default_pools()}
    assert pools["v5e-2x4"].multi_host and pools["v5e-2x4"].vms == 2
    assert pools["v5e-4x4"].vms == 4
    v5p = [p for p in pools.values() if p.accelerator == "tpu-v5p-slice"]
    assert len(v5p) == 2 and all(p.topology == "2x2x2" for p in v5p)
    assert not pools["v5e-2x2"].multi_host and pools["v5e-2x2"].vms >= 2
    assert not pools["cpu"].is_tpu


def test_tpu_node_manifest_has_gke_labels_capacity_and_taint() -> None:
    pool = Pool(
        name="p",
        accelerator="tpu-v5p-slice",
        topology="2x2x2",
        vms=2,
        spot=True,
        reservation="r1",
    )
    node = pool.node_manifest("p-1", "127.64.192.2")
    labels = node["metadata"]["labels"]
    assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert labels["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    assert labels["cloud.google.com/gke-nodepool"] == "p"
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert labels["cloud.google.com/reservation-name"] == "r1"
    assert labels["node.kubernetes.io/instance-type"] == "ct5p-hightpu-4t"
    assert labels["kubernetes.io/hostname"] == "p-1"
    assert node["status"]["capacity"]["google.com/tpu"] == "4"
    assert node["status"]["allocatable"]["google.com/tpu"] == "4"
    assert node["spec"]["taints"] == [TPU_TAINT]


def test_cpu_node_has_no_tpu_labels_resource_or_taint() -> None:
    node = Pool(name="cpu", vms=1).node_manifest("cpu-0", "127.64.192.1")
    assert "google.com/tpu" not in node["status"]["capacity"]
    assert node["spec"]["taints"] == []
    assert "cloud.google.com/gke-tpu-accelerator" not in node["metadata"]["labels"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"accelerator": "tpu-v5p-slice", "topology": "4x4x4", "vms": 3}, r"vms \* chips_per_vm"),
        ({"accelerator": "tpu-v5p-slice"}, "needs a topology"),
        ({"topology": "2x2"}, "accelerator is not"),
        ({"accelerator": "tpu-v5p-slice", "topology": "2xx2"}, "not like 2x4"),
        ({"mode": "dry"}, "mode must be"),
        ({"vms": 0}, "vms must be"),
        ({"colour": "red"}, "unknown field"),
    ],
)
def test_invalid_pools_name_the_problem(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(PoolError, match=words):
        pool_from_dict({"name": "bad", **fields})


def test_large_simulate_pool_is_cheap_to_declare() -> None:
    pool = Pool(
        name="big", accelerator="tpu-v5p-slice", topology="8x8x16", vms=256, mode="simulate"
    )
    assert len(pool.node_names()) == 256 and pool.multi_host


# Environment ----------------------------------------------------------------------------

POD = {
    "metadata": {
        "name": "w-0",
        "namespace": "ns",
        "uid": "u1",
        "labels": {"job": "j"},
        "annotations": {"a": "b"},
    },
    "spec": {"nodeName": "n-0", "serviceAccountName": "default"},
    "status": {"podIP": "127.64.0.9", "hostIP": "127.64.192.1"},
}


def test_env_literals_expansion_and_downward_api() -> None:
    field = lambda path: {"fieldRef": {"fieldPath": path}}  # noqa: E731
    container = {
        "name": "main",
        "command": ["echo", "$(NAME)", "$$(NAME)", "$(MISSING)"],
        "env": [
            {"name": "NAME", "valueFrom": field("metadata.name")},
            {"name": "JOB", "valueFrom": field("metadata.labels['job']")},
            {"name": "ANN", "valueFrom": field("metadata.annotations['a']")},
            {"name": "IP", "valueFrom": field("status.podIP")},
            {"name": "HOST", "valueFrom": field("status.hostIP")},
            {"name": "NODE", "valueFrom": field("spec.nodeName")},
            {"name": "NS", "valueFrom": field("metadata.namespace")},
            {"name": "ADDR", "value": "$(IP):8476"},
        ],
    }
    env = envvars.container_env(POD, container, {"PATH": "/bin"})
    assert env["NAME"] == "w-0" and env["JOB"] == "j" and env["ANN"] == "b"
    assert env["IP"] == "127.64.0.9" and env["HOST"] == "127.64.192.1"
    assert env["NODE"] == "n-0" and env["NS"] == "ns" and env["ADDR"] == "127.64.0.9:8476"
    assert envvars.container_argv(container, env) == ["echo", "w-0", "$(NAME)", "$(MISSING)"]


def test_base_env_puts_the_agents_python_first_and_drops_the_rest() -> None:
    env = envvars.base_env("w-0")
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["HOSTNAME"] == "w-0"
    assert "PYTEST_CURRENT_TEST" not in env


@pytest.mark.parametrize(
    ("container", "error", "words"),
    [
        ({"name": "c", "command": []}, envvars.NoCommand, "has no command"),
        ({"name": "c", "command": ["x"], "envFrom": [{}]}, envvars.UnsupportedEnv, "envFrom"),
        (
            {
                "name": "c",
                "command": ["x"],
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {}}}],
            },
            envvars.UnsupportedEnv,
            "configMapKeyRef",
        ),
    ],
)
def test_unsupported_env_and_missing_command(
    container: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        env = envvars.container_env(POD, container, {})
        envvars.container_argv(container, env)


# Hosts files ----------------------------------------------------------------------------


def _pod(name: str, ip: str, ready: bool, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels or {"j": "1"}},
        "spec": {"hostname": name, "subdomain": "svc"},
        "status": {
            "podIP": ip,
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _service(publish: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": "svc", "namespace": "ns"},
        "spec": {"clusterIP": "None", "selector": {"j": "1"}, "publishNotReadyAddresses": publish},
    }


def test_hosts_records_follow_headless_service_rules(tmp_path: Path) -> None:
    hosts = HostsFiles()
    hosts.set_services([_service(publish=False)])
    hosts.set_pods([_pod("a", "127.64.0.1", True), _pod("b", "127.64.0.2", False)])
    hosts.on_pod("ADDED", _pod("c", "127.64.0.3", True, labels={"other": "x"}))
    assert [r.hostname for r in hosts.records()] == ["a"], "not ready / not selected: no record"
    hosts.on_service("MODIFIED", _service(publish=True))
    assert [r.hostname for r in hosts.records()] == ["a", "b"]

    path = tmp_path / "p.hosts"
    viewer = _pod("a", "127.64.0.1", True)
    hosts.add_pod("a", path, viewer, "127.64.0.1")
    text = path.read_text()
    assert "127.64.0.1\ta.svc.ns.svc.cluster.local\ta\n" in text
    assert "127.64.0.2\tb.svc.ns.svc.cluster.local b.svc.ns.svc b.svc.ns b.svc\n" in text

    inode = path.stat().st_ino
    hosts.on_pod("DELETED", _pod("b", "127.64.0.2", False))
    assert path.stat().st_ino == inode
    assert "b.svc" not in path.read_text()


def test_write_in_place_keeps_inode_and_never_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    write_in_place(path, "1.2.3.4 long-name-here\n" * 3)
    inode, size = path.stat().st_ino, path.stat().st_size
    assert write_in_place(path, "1.2.3.4 x\n")
    assert path.stat().st_ino == inode
    assert path.stat().st_size == size
    assert path.read_text().startswith("1.2.3.4 x\n#")
    assert not write_in_place(path, path.read_text())


# Status, addresses, writer --------------------------------------------------------------


def test_pod_phase_rules() -> None:
    def done(code: int) -> ContainerStatus:
        return ContainerStatus("c", "", terminated_state(code))

    running = ContainerStatus("r", "", {"running": {"startedAt": "x"}})
    assert pod_phase([done(0), running]) == "Running"
    assert pod_phase([done(0), done(0)]) == "Succeeded"
    assert pod_phase([done(0), done(2)]) == "Failed"
    assert terminated_state(0)["terminated"]["reason"] == "Completed"
    assert terminated_state(1)["terminated"]["reason"] == "Error"


def test_address_blocks_are_exclusive_and_pod_ips_unique(tmp_path: Path) -> None:
    first = Block.claim(tmp_path)
    second = Block.claim(tmp_path)
    try:
        assert first.octet != second.octet
        ips = {first.allocate() for _ in range(600)}
        assert len(ips) == 600 and all(first.contains(ip) for ip in ips)
        assert not any(ip.endswith((".0", ".255")) for ip in ips)
        assert first.node_ip("n") == first.node_ip("n") != first.node_ip("m")
        assert not first.reserve(next(iter(ips)))
    finally:
        first.release()
        second.release()
    third = Block.claim(tmp_path)
    assert third.octet == first.octet, "a released block is free again"
    third.release()


def local_routes() -> str:
    return subprocess.run(
        ["ip", "route", "show", "table", "local"], capture_output=True, text=True, check=True
    ).stdout


def test_routed_blocks_are_local_while_claimed_and_outside_loopback(tmp_path: Path) -> None:
    """``--pod-addresses routed``: a 100.B.0.0/16 block made local by a route, which an
    EndpointSlice may hold (the apiserver refuses loopback addresses there)."""
    try:
        block = Block.claim(tmp_path, addresses="routed")
    except RouteError as error:
        pytest.skip(f"this machine cannot route a block locally: {error}")
    try:
        address = block.allocate()
        assert address.startswith(f"100.{block.octet}.") and block.contains(address)
        assert not ipaddress.ip_address(address).is_loopback
        assert ipaddress.ip_address(address) in ipaddress.ip_network("100.64.0.0/10")
        assert f"local {block.cidr} dev lo" in local_routes()
        with socket.socket() as server:
            server.bind((address, 0))  # a pod's process binds its own address
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=5):
                pass
        loopback = Block.claim(tmp_path)
        assert loopback.octet == block.octet, "the two kinds of block do not share locks"
        loopback.release()
    finally:
        block.release()
    assert f"local {block.cidr} dev lo" not in local_routes(), "the route goes with the block"


def test_a_routed_block_that_cannot_be_routed_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ipam.shutil, "which", lambda _: None)
    with pytest.raises(RouteError, match=r"iproute2's ip .* --pod-addresses loopback"):
        Block.claim(tmp_path, addresses="routed")
    with open(tmp_path / f"100.{FIRST_BLOCK}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the failed claim let go of it


def test_writer_coalesces_and_orders_writes_per_key() -> None:
    async def scenario() -> list[str]:
        writer = Writer(concurrency=4)
        writer.start()
        log: list[str] = []
        gate = asyncio.Event()

        def write(tag: str, wait: bool = False) -> Any:
            async def run() -> None:
                if wait:
                    await gate.wait()
                log.append(tag)

            return run

        writer.submit("k", write("first", wait=True))
        await asyncio.sleep(0.01)  # "first" is now in flight
        writer.submit("k", write("second"))
        writer.submit("k", write("third"))  # replaces "second", which never ran
        writer.submit("gone", _raise(KubeError(404, "gone", "PATCH", "/x")))
        gate.set()
        await writer.drain()
        await writer.stop()
        return log

    assert asyncio.run(scenario()) == ["first", "third"]


def _raise(error: Exception) -> Any:
    async def run() -> None:
        raise error

    return run


# Processes and builds -------------------------------------------------------------------


def test_process_record_detects_exit_and_pid_reuse() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    record = ProcessRecord.of(child.pid)
    assert record.alive()
    assert not ProcessRecord(child.pid, record.start_time + 1).alive(), "other start time"
    child.kill()
    child.wait()
    assert not record.alive()


def test_missing_go_names_component_version_and_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPU_OPERATOR_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    with pytest.raises(binaries.BuildError) as error:
        binaries.ensure(binaries.ETCD)
    message = str(error.value)
    assert f"etcd {binaries.ETCD.version}" in message and "`go`" in message
    assert "KUBEBUILDER_ASSETS" in message


def test_failed_build_names_component_version_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_go = tmp_path / "bin" / "go"
    fake_go.parent.mkdir()
    fake_go.write_text("#!/bin/sh\necho 'compile error: something broke' >&2\nexit 2\n")
    fake_go.chmod(0o755)
    monkeypatch.setenv("TPU_OPERATOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{fake_go.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    with pytest.raises(binaries.BuildError) as error:
        binaries.ensure(binaries.HELM)
    message = str(error.value)
    log_file = tmp_path / "cache" / "logs" / f"build-helm-{binaries.HELM.version}.log"
    assert f"helm {binaries.HELM.version} failed (exit 2)" in message
    assert str(log_file) in message and "something broke" in message
    assert not (binaries.component_dir(binaries.HELM)).exists(), "no half-built cache entry"


def test_kubebuilder_assets_are_used_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in binaries.ETCD.commands:
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert binaries.ensure(binaries.ETCD) == {"etcd": tmp_path / "etcd"}
