"""Loopback addresses for nodes and pods, unique across every cluster on this machine.

All of 127.0.0.0/8 is local on Linux, so a process can bind any 127.x.y.z without
configuring an interface. Each running agent claims one /16 block 127.B.0.0 (B in
64..127) by holding an flock on a per-block file in the temp dir for its whole life: two
clusters on one machine (two engineers' test runs) never hand out the same pod IP, and a
crashed agent's block is free again as soon as its process is gone. Inside the block,
nodes get 127.B.192.0 and up, pods 127.B.0.1 .. 127.B.191.254; last octets 0 and 255
are skipped to keep addresses unsurprising.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import tempfile
from pathlib import Path
from typing import IO

FIRST_BLOCK, LAST_BLOCK = 64, 127
_NODE_THIRD_OCTET = 192


class AddressesExhausted(RuntimeError):
    pass


class Block:
    """One claimed 127.B.0.0/16 block and its node and pod allocators."""

    def __init__(self, octet: int, handle: IO[str]) -> None:
        self.octet = octet
        self._handle = handle
        self._pods_used: set[str] = set()
        self._next_pod = 0
        self._nodes: dict[str, str] = {}

    @classmethod
    def claim(cls, lock_dir: Path | None = None) -> Block:
        directory = lock_dir or Path(tempfile.gettempdir()) / "localcluster-ipblocks"
        directory.mkdir(parents=True, exist_ok=True)
        for octet in range(FIRST_BLOCK, LAST_BLOCK + 1):
            handle = open(directory / f"127.{octet}.lock", "w")  # noqa: SIM115 - held for life
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            return cls(octet, handle)
        raise AddressesExhausted(
            f"all loopback blocks 127.{FIRST_BLOCK}-{LAST_BLOCK}.0.0/16 are held by other agents"
        )

    def release(self) -> None:
        self._handle.close()

    def contains(self, address: str) -> bool:
        return address.startswith(f"127.{self.octet}.")

    def node_ip(self, name: str) -> str:
        """A stable address per node name (same node, same address, for this agent's life)."""
        if name not in self._nodes:
            index = len(self._nodes)
            third, fourth = divmod(index, 254)
            if _NODE_THIRD_OCTET + third > 255:
                raise AddressesExhausted("more than 16,000 nodes")
            self._nodes[name] = f"127.{self.octet}.{_NODE_THIRD_OCTET + third}.{fourth + 1}"
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
            address = f"127.{self.octet}.{third}.{fourth + 1}"
            if address not in self._pods_used:
                self._pods_used.add(address)
                return address
        raise AddressesExhausted(f"all {capacity} pod addresses of 127.{self.octet}.0.0/16 in use")

    def free(self, address: str | None) -> None:
        if address:
            self._pods_used.discard(address)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
