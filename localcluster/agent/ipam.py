"""Addresses for nodes and pods, unique across every cluster on this machine.

All of 127.0.0.0/8 is local on Linux, so a process can bind any 127.x.y.z without
configuring an interface. Each running agent claims one /16 block 127.B.0.0 (B in
64..127) by holding an flock on a per-block file in the temp dir for its whole life: two
clusters on one machine (two engineers' test runs) never hand out the same pod IP, and a
crashed agent's block is free again as soon as its process is gone. Inside the block,
nodes get 127.B.192.0 and up, pods 127.B.0.1 .. 127.B.191.254; last octets 0 and 255
are skipped to keep addresses unsurprising.

Loopback pod IPs have one cost a GKE cluster does not: the apiserver refuses loopback
addresses in Endpoints and EndpointSlices, so the endpoint controllers' writes for a
headless Service fail and are retried, each with a Warning event, for as long as its pods
exist. With ``routed`` addresses (``--pod-addresses routed``) the block is 100.B.0.0/16
instead (shared address space, RFC 6598, B in 64..127 again: 100.64.0.0/10), made local
by one route (``ip route replace local 100.B.0.0/16 dev lo``, root with CAP_NET_ADMIN;
the route goes with the block): pods bind and reach those addresses as they do loopback
ones, and the endpoint controllers publish them as on GKE.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

FIRST_BLOCK, LAST_BLOCK = 64, 127
_NODE_THIRD_OCTET = 192
POD_ADDRESSES = {"loopback": 127, "routed": 100}
"""``--pod-addresses`` -> the first octet of the blocks it hands out."""


class AddressesExhausted(RuntimeError):
    pass


class RouteError(RuntimeError):
    """Routed addresses could not be made local (no ``ip``, no CAP_NET_ADMIN)."""


class Block:
    """One claimed B.0.0/16 block (127.B or, routed, 100.B) and its node and pod
    allocators."""

    def __init__(self, octet: int, handle: IO[str], first: int = 127) -> None:
        self.octet = octet
        self.prefix = f"{first}.{octet}."
        self._handle = handle
        self._pods_used: set[str] = set()
        self._next_pod = 0
        self._nodes: dict[str, str] = {}
        self._routed = False

    @property
    def cidr(self) -> str:
        return f"{self.prefix}0.0/16"

    @classmethod
    def claim(cls, lock_dir: Path | None = None, addresses: str = "loopback") -> Block:
        """Claim a free block; ``addresses``: ``loopback`` or ``routed`` (then the block
        is made local by a route, and ``RouteError`` says why it could not be)."""
        first = POD_ADDRESSES[addresses]
        directory = lock_dir or Path(tempfile.gettempdir()) / "localcluster-ipblocks"
        directory.mkdir(parents=True, exist_ok=True)
        for octet in range(FIRST_BLOCK, LAST_BLOCK + 1):
            handle = open(directory / f"{first}.{octet}.lock", "w")  # noqa: SIM115 - held for life
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            block = cls(octet, handle, first)
            if addresses == "routed":
                try:
                    block._route("replace")
                except RouteError:
                    block.release()
                    raise
                block._routed = True
            return block
        raise AddressesExhausted(
            f"all {addresses} blocks {first}.{FIRST_BLOCK}-{LAST_BLOCK}.0.0/16 are held by "
            "other agents"
        )

    def _route(self, verb: str) -> None:
        ip = shutil.which("ip")
        argv = [ip or "ip", "route", verb, "local", self.cidr, "dev", "lo", "table", "local"]
        if ip is None:
            raise RouteError(
                f"routed pod addresses need iproute2's ip to make {self.cidr} local "
                "(apt-get install iproute2), or run with --pod-addresses loopback"
            )
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RouteError(
                f"{' '.join(argv)} failed: {done.stderr.strip() or done.returncode}; routed "
                "pod addresses need root with CAP_NET_ADMIN (or run with --pod-addresses "
                "loopback)"
            )

    def release(self) -> None:
        if self._routed:
            self._routed = False
            with contextlib.suppress(RouteError):  # the next claim replaces the route
                self._route("del")
        self._handle.close()

    def contains(self, address: str) -> bool:
        return address.startswith(self.prefix)

    def node_ip(self, name: str) -> str:
        """A stable address per node name (same node, same address, for this agent's life)."""
        if name not in self._nodes:
            index = len(self._nodes)
            third, fourth = divmod(index, 254)
            if _NODE_THIRD_OCTET + third > 255:
                raise AddressesExhausted("more than 16,000 nodes")
            self._nodes[name] = f"{self.prefix}{_NODE_THIRD_OCTET + third}.{fourth + 1}"
        return self._nodes[name]

    def reserve(self, address: str) -> bool:
        """Mark an address (from an existing pod's status) used; False if taken or foreign."""
        if not self.contains(address) or address in self._pods_used:
            return False
        self._pods_used.add(address)
        return True

    def allocate(self) -> str:
        capacity = _NODE_THIRD_OCTET * 254
        for _ in range(capacity):
            third, fourth = divmod(self._next_pod, 254)
            self._next_pod = (self._next_pod + 1) % capacity
            address = f"{self.prefix}{third}.{fourth + 1}"
            if address not in self._pods_used:
                self._pods_used.add(address)
                return address
        raise AddressesExhausted(f"all {capacity} pod addresses of {self.cidr} in use")

    def free(self, address: str | None) -> None:
        if address:
            self._pods_used.discard(address)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
