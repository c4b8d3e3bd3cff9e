"""Per-pod ``/etc/hosts`` files: the pod's own name plus its headless-Service peers.

The kubelet gives every pod a managed hosts file (bind-mounted over ``/etc/hosts``) with
the pod's own hostname and FQDN; cluster DNS (CoreDNS) answers for the names of pods
behind headless Services. There is no cluster DNS here, so the agent writes those records
into each pod's hosts file too, computed from Services and Pods exactly as the
endpointslice controller and CoreDNS would: for a headless Service (``clusterIP: None``)
with a selector, every pod of its namespace that matches the selector, has an IP,
``spec.hostname`` set and ``spec.subdomain`` equal to the Service's name, is not terminal,
and is Ready (or the Service has ``publishNotReadyAddresses: true``) gives
``<hostname>.<service>.<ns>.svc.cluster.local``, ``<hostname>.<service>.<ns>.svc`` and
``<hostname>.<service>.<ns>``, and for pods of the same namespace also
``<hostname>.<service>`` (what the ``<ns>.svc.cluster.local`` search domain of a real
pod's resolv.conf gives). The EndpointSlices themselves cannot be used: the apiserver
rejects loopback addresses in them, so the real controller cannot publish 127.x pod IPs.

Peers appear after a pod starts, so files are rewritten in place: the bind mount pins the
inode, so the file cannot be replaced by a rename. A reader must never see an empty or
truncated file, so the new content is written with one ``pwrite`` at offset 0 and padded
with a comment to at least the old length (the file never shrinks; nothing is truncated).
Changes are coalesced: files are rewritten at most every 50 ms. The records are computed
only while some pod has a hosts file: simulate-mode pods have none, and recomputing the
records of thousands of them every 50 ms while they change was most of the agent's CPU in
scale runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"

_HEADER = """# Kubernetes-managed hosts file (localcluster node agent).
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
"""


@dataclass(frozen=True)
class Record:
    namespace: str
    service: str
    hostname: str
    ip: str

    def names(self, viewer_namespace: str) -> list[str]:
        base = f"{self.hostname}.{self.service}.{self.namespace}"
        names = [f"{base}.svc.{CLUSTER_DOMAIN}", f"{base}.svc", base]
        if viewer_namespace == self.namespace:
            names.append(f"{self.hostname}.{self.service}")
        return names


def own_entries(pod: Mapping[str, Any], pod_ip: str) -> str:
    """What the kubelet writes for the pod itself, plus spec.hostAliases."""
    metadata, spec = pod["metadata"], pod.get("spec", {})
    hostname = pod_hostname(pod)
    lines = ["# Entries for this pod."]
    if spec.get("subdomain"):
        fqdn = f"{hostname}.{spec['subdomain']}.{metadata['namespace']}.svc.{CLUSTER_DOMAIN}"
        lines.append(f"{pod_ip}\t{fqdn}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    aliases = spec.get("hostAliases") or []
    if aliases:
        lines.append("# Entries added by HostAliases.")
        lines += [f"{a['ip']}\t{' '.join(a.get('hostnames') or [])}" for a in aliases]
    return "\n".join(lines) + "\n"


def pod_hostname(pod: Mapping[str, Any]) -> str:
    # Kubernetes truncates the pod name to 63 characters when it is used as the hostname.
    return (pod.get("spec", {}).get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def write_in_place(path: Path, content: str) -> bool:
    """Make ``path`` hold ``content`` without ever being empty or changing its inode."""
    data = content.encode()
    if not path.exists():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == len(data) and os.pread(fd, size, 0) == data:
            return False
        if len(data) < size:
            gap = size - len(data)
            data += b"\n" if gap == 1 else b"#" + b" " * (gap - 2) + b"\n"
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    return True


@dataclass
class _PodFile:
    path: Path
    namespace: str
    own: str


@dataclass(frozen=True)
class _Endpoint:
    """What DNS needs to know of a pod with a hostname and a subdomain."""

    uid: str
    namespace: str
    subdomain: str
    hostname: str
    labels: tuple[tuple[str, str], ...]
    ip: str
    ready: bool
    deleting: bool


@dataclass(frozen=True)
class _Service:
    selector: tuple[tuple[str, str], ...]
    publish_not_ready: bool


def _endpoint(pod: Mapping[str, Any]) -> _Endpoint | None:
    metadata, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status") or {}
    if not spec.get("hostname") or not spec.get("subdomain") or not status.get("podIP"):
        return None
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return _Endpoint(
        uid=metadata["uid"],
        namespace=metadata["namespace"],
        subdomain=spec["subdomain"],
        hostname=pod_hostname(pod),
        labels=tuple(sorted((metadata.get("labels") or {}).items())),
        ip=status["podIP"],
        ready=ready,
        deleting=bool(metadata.get("deletionTimestamp")),
    )


def _service(service: Mapping[str, Any]) -> _Service | None:
    spec = service.get("spec", {})
    if spec.get("clusterIP") != "None" or not spec.get("selector"):
        return None
    return _Service(
        tuple(sorted(spec["selector"].items())), bool(spec.get("publishNotReadyAddresses"))
    )


@dataclass
class HostsFiles:
    """Pods and headless Services seen so far, and the pod hosts files fed from them."""

    _endpoints: dict[str, _Endpoint] = field(default_factory=dict)
    _services: dict[tuple[str, str], _Service] = field(default_factory=dict)
    _files: dict[str, _PodFile] = field(default_factory=dict)
    _records: list[Record] = field(default_factory=list)
    _flush: asyncio.TimerHandle | None = None
    _stale: bool = False
    """Inputs changed while no file needed the records (see ``_refresh``)."""

    def add_pod(self, uid: str, path: Path, pod: Mapping[str, Any], pod_ip: str) -> None:
        """Create the pod's hosts file (before its processes start)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._stale:
            self._stale = False
            self._records = self.records()
        self._files[uid] = _PodFile(path, pod["metadata"]["namespace"], own_entries(pod, pod_ip))
        write_in_place(path, self._render(self._files[uid]))

    def remove_pod(self, uid: str) -> None:
        self._files.pop(uid, None)

    # Inputs ---------------------------------------------------------------------------

    def set_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._endpoints = {}
        for pod in pods:
            endpoint = _endpoint(pod)
            if endpoint is not None:
                self._endpoints[endpoint.uid] = endpoint
        self._changed()

    def on_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        endpoint = None if event_type == "DELETED" else _endpoint(pod)
        if self._endpoints.get(uid) == endpoint:
            return
        if endpoint is None:
            self._endpoints.pop(uid, None)
        else:
            self._endpoints[uid] = endpoint
        self._changed()

    def set_services(self, services: Iterable[Mapping[str, Any]]) -> None:
        self._services = {}
        for service in services:
            parsed = _service(service)
            if parsed is not None:
                self._services[_key(service)] = parsed
        self._changed()

    def on_service(self, event_type: str, service: Mapping[str, Any]) -> None:
        key = _key(service)
        parsed = None if event_type == "DELETED" else _service(service)
        if self._services.get(key) == parsed:
            return
        if parsed is None:
            self._services.pop(key, None)
        else:
            self._services[key] = parsed
        self._changed()

    # Output ---------------------------------------------------------------------------

    def records(self) -> list[Record]:
        records = set()
        for endpoint in self._endpoints.values():
            service = self._services.get((endpoint.namespace, endpoint.subdomain))
            if service is None or not set(service.selector) <= set(endpoint.labels):
                continue
            if not service.publish_not_ready and (endpoint.deleting or not endpoint.ready):
                continue
            records.add(
                Record(endpoint.namespace, endpoint.subdomain, endpoint.hostname, endpoint.ip)
            )
        return sorted(records, key=_order)

    def _changed(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (unit tests): refresh now
            self._refresh()
            return
        if self._flush is None:
            self._flush = loop.call_later(0.05, self._refresh)

    def _render(self, pod_file: _PodFile) -> str:
        lines = [_HEADER, pod_file.own, "# Headless Service records (cluster DNS stand-in).\n"]
        lines += [f"{r.ip}\t{' '.join(r.names(pod_file.namespace))}\n" for r in self._records]
        return "".join(lines)

    def _refresh(self) -> None:
        self._flush = None
        if not self._files:
            self._stale = True  # nothing shows the records: computed when a file needs them
            return
        self._stale = False
        records = self.records()
        if records == self._records:
            return
        self._records = records
        for pod_file in self._files.values():
            write_in_place(pod_file.path, self._render(pod_file))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj["metadata"]
    return metadata["namespace"], metadata["name"]


def _order(record: Record) -> tuple[str, str, str, str]:
    return record.namespace, record.service, record.hostname, record.ip
