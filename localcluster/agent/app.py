"""The node agent process: wires nodes, pods, hosts files and the control API together.

Started by the launcher as ``python -m localcluster.agent --cluster-dir DIR --server URL``
(it reads its certificates, pool file and paths from the cluster directory) or in-process
with :func:`run_agent`. One asyncio loop; blocking work is limited to writing small files.
SIGTERM/SIGINT stop it gracefully: running pods get SIGTERM and a short grace, then
SIGKILL, so no pod process outlives the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localcluster.agent import control
from localcluster.agent.hosts import HostsFiles
from localcluster.agent.ipam import POD_ADDRESSES, Block
from localcluster.agent.kube import Kube, list_watch
from localcluster.agent.nodes import NodeManager
from localcluster.agent.pods import PodManager
from localcluster.agent.provisioner import AutoProvisioner, Autoprovisioning
from localcluster.agent.runtime import Sandbox
from localcluster.agent.slicecontroller import SliceController
from localcluster.agent.volumes import Volumes
from localcluster.agent.writer import Writer
from localcluster.layout import Layout
from localcluster.pools import Pool, load_pools

log = logging.getLogger("localcluster.agent")


@dataclass
class AgentConfig:
    layout: Layout
    server: str
    pools: list[Pool]
    node_monitor_grace_period: float = 20.0
    write_concurrency: int = 16
    autoprovisioning: Autoprovisioning | None = None
    """The simulated cluster autoscaler and node auto-provisioner (None: off)."""
    pod_addresses: str = "loopback"
    """``loopback`` (127.B.0.0/16) or ``routed`` (100.B.0.0/16 made local by a route, so
    that the endpoint controllers can publish pod IPs: ``ipam``)."""


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        pki = config.layout.pki
        self.kube = Kube(
            config.server, pki / "ca.crt", pki / "node-agent.crt", pki / "node-agent.key"
        )
        self.block = Block.claim(addresses=config.pod_addresses)
        self.sandbox = Sandbox.detect()
        self.writer = Writer(config.write_concurrency)
        self.hosts = HostsFiles()
        self.nodes = NodeManager(self.kube, self.block, config.node_monitor_grace_period)
        self.pods = PodManager(
            kube=self.kube,
            nodes=self.nodes,
            block=self.block,
            writer=self.writer,
            pods_dir=config.layout.pods,
            sandbox=self.sandbox,
            hosts=self.hosts,
            volumes=Volumes(self.kube),
            service_env=service_env(config.server),
        )
        self.ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.provisioner: AutoProvisioner | None = None
        self._provisioner_task: asyncio.Task[None] | None = None

    async def set_autoprovisioning(self, config: Autoprovisioning | None) -> None:
        """Start, reconfigure or (None) stop the simulated autoscaler."""
        if self._provisioner_task is not None:
            self._provisioner_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._provisioner_task
        self._provisioner_task = None
        if config is None:
            if self.provisioner is not None:
                log.info("autoprovisioner off")
            self.provisioner = None
            return
        previous = self.provisioner
        self.provisioner = AutoProvisioner(self.kube, self.nodes, self.pods, config)
        self.provisioner.templates = {p.name: p for p in self.config.pools if p.autoscaling}
        if previous is not None:
            self.provisioner.templates.update(previous.templates)
            self.provisioner.created = previous.created
            self.provisioner.run_started = previous.run_started
        self._provisioner_task = asyncio.create_task(self.provisioner.run(), name="provisioner")
        log.info("autoprovisioner on: %s", json.dumps(config.to_json()))

    def status(self) -> dict[str, Any]:
        return {
            "ready": self.ready.is_set(),
            "block": self.block.cidr,
            "namespaces": self.sandbox.unshare is not None,
            "pools": [p.to_dict() for p in self.nodes.pools.values()],
            "nodes": self.nodes.summary(),
            "pods": self.pods.processes(),
            "simulated_pods": len(self.pods.simulator.pods),
            "autoprovisioning": (
                self.provisioner.config.to_json() if self.provisioner is not None else None
            ),
        }

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        self.hosts.on_pod(kind, pod)
        self.pods.on_event(kind, pod)

    def _on_pods_synced(self, items: list[dict[str, Any]]) -> None:
        self.hosts.set_pods(items)
        self.pods.on_synced(items)

    async def run(self, stop: asyncio.Event) -> None:
        layout = self.config.layout
        runner = await control.serve(self, layout.agent_socket)
        self.writer.start()
        try:
            if not await self.kube.wait_serving(stop):
                return
            await self.nodes.add_pools(self.config.pools)
            self._tasks = [
                asyncio.create_task(self.nodes.run(), name="leases"),
                asyncio.create_task(
                    list_watch(
                        self.kube,
                        "/api/v1/services",
                        {},
                        self.hosts.on_service,
                        on_synced=self.hosts.set_services,
                    ),
                    name="services",
                ),
                asyncio.create_task(
                    list_watch(
                        self.kube,
                        "/api/v1/nodes",
                        {},
                        self.nodes.on_node_event,
                        on_synced=self.nodes.on_nodes_synced,
                    ),
                    name="nodes",
                ),
                asyncio.create_task(
                    list_watch(
                        self.kube,
                        "/api/v1/pods",
                        {"fieldSelector": "spec.nodeName!="},
                        self._on_pod,
                        on_synced=self._on_pods_synced,
                    ),
                    name="pods",
                ),
                asyncio.create_task(
                    SliceController(
                        self.kube,
                        lambda: any(p.dynamic_slicing for p in self.nodes.pools.values()),
                    ).run(),
                    name="slices",
                ),
            ]
            if self.config.autoprovisioning is not None:
                await self.set_autoprovisioning(self.config.autoprovisioning)
            self.ready.set()
            log.info(
                "agent ready: %d node(s), pod IPs from %s, namespaces %s",
                len(self.nodes.nodes),
                self.block.cidr,
                "on" if self.sandbox.unshare else "OFF",
            )
            await stop.wait()
        finally:
            log.info("agent stopping")
            await self.set_autoprovisioning(None)
            await self.pods.shutdown()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.writer.stop()
            await runner.cleanup()
            await self.kube.close()
            self.block.release()
            layout.agent_socket.unlink(missing_ok=True)


def service_env(server: str) -> dict[str, str]:
    """The ``kubernetes`` Service variables every container gets (in-cluster clients)."""
    url = urlsplit(server)
    host, port = url.hostname or "127.0.0.1", str(url.port or 443)
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "KUBERNETES_SERVICE_PORT_HTTPS": port,
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        "KUBERNETES_PORT_443_TCP": f"tcp://{host}:{port}",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_ADDR": host,
        "KUBERNETES_PORT_443_TCP_PORT": port,
    }


async def run_agent(config: AgentConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Agent(config).run(stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.agent", description=__doc__)
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--server", required=True, help="apiserver URL")
    parser.add_argument("--pools", type=Path, help="pool file (default: <cluster-dir>/pools.yaml)")
    parser.add_argument("--node-monitor-grace-period", type=float, default=20.0)
    parser.add_argument(
        "--pod-addresses",
        choices=sorted(POD_ADDRESSES),
        default="loopback",
        help="loopback: pod IPs from 127.B.0.0/16 (the apiserver refuses them in "
        "EndpointSlices); routed: from 100.B.0.0/16, made local by a route (needs "
        "CAP_NET_ADMIN), published by the endpoint controllers as on GKE",
    )
    parser.add_argument(
        "--autoprovisioning",
        help="JSON settings of the simulated cluster autoscaler / NAP (default: off)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    layout = Layout(args.cluster_dir)
    config = AgentConfig(
        layout=layout,
        server=args.server,
        pools=load_pools(args.pools or layout.pools_file),
        node_monitor_grace_period=args.node_monitor_grace_period,
        pod_addresses=args.pod_addresses,
        autoprovisioning=(
            Autoprovisioning.from_json(json.loads(args.autoprovisioning))
            if args.autoprovisioning
            else None
        ),
    )
    asyncio.run(run_agent(config))
    return 0
