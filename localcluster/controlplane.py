"""Command lines of the control-plane components, and the ports they listen on.

One function per component turns the cluster directory and the chosen ports into argv.
Everything binds to 127.0.0.1. The controller-manager and scheduler serve no HTTPS of
their own (``--secure-port=0``): nothing here scrapes them, and two clusters on one
machine would otherwise fight over their fixed default ports.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from localcluster.layout import Layout

SERVICE_CIDR = "10.0.0.0/24"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver}"

    def to_json(self) -> dict[str, int]:
        return {
            "etcd_client": self.etcd_client,
            "etcd_peer": self.etcd_peer,
            "apiserver": self.apiserver,
        }


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (callers retry on a bind race)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def pick_ports() -> Ports:
    etcd_client, etcd_peer, apiserver = free_ports(3)
    return Ports(etcd_client, etcd_peer, apiserver)


def etcd(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=localcluster",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=localcluster={peer}",
        "--initial-cluster-state=new",
        # Test data is throwaway: skipping fsync makes every write an order faster.
        "--unsafe-no-fsync",
        "--log-level=warn",
        "--quota-backend-bytes=4294967296",
    ]


def apiserver(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    pki = layout.pki
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--event-ttl=30m",
        # Webhooks and aggregated APIs of a Service are dialled at its endpoints (there is
        # no kube-proxy for ClusterIPs): Kueue's webhooks run on this machine
        # (localcluster/kueue.py).
        "--enable-aggregator-routing=true",
        # The front proxy's identity towards aggregated APIs (Kueue's visibility API), as
        # kubeadm sets it up (localcluster/pki.py).
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
    ]


def _controller_base(binary: Path, layout: Layout, component: str) -> list[str]:
    """What the controller-manager and the scheduler share: their own kubeconfig for
    everything, no serving port, a single instance (no leader election)."""
    kubeconfig = layout.component_kubeconfig(component)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--secure-port=0",
        "--leader-elect=false",
    ]


def controller_manager(binary: Path, layout: Layout, node_monitor_grace_period: float) -> list[str]:
    pki = layout.pki
    return [
        *_controller_base(binary, layout, "controller-manager"),
        # Each controller acts as its own ServiceAccount, so RBAC is exercised as in a
        # real cluster (and the ServiceAccount token path is used from the start).
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--node-monitor-grace-period={node_monitor_grace_period:g}s",
        "--node-monitor-period=2s",
        # Client-side throttling at the defaults (20 QPS) would make the controllers, not
        # the code under test, the bottleneck of scale runs with thousands of pods.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]


def scheduler(binary: Path, layout: Layout) -> list[str]:
    return [
        *_controller_base(binary, layout, "scheduler"),
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    ]
