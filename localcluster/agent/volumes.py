"""Pod volumes as local directories, bind-mounted into the pod's mount namespace.

Supported volume types: ``emptyDir`` (a directory per pod, shared by its containers),
``hostPath``, ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` (their sources
``serviceAccountToken``, ``configMap``, ``secret``, ``downwardAPI``). The ServiceAccount
token volume that admission adds to every pod (``kube-api-access-*``) therefore works as in
a real cluster: the agent asks the TokenRequest API for a token bound to the pod, so a
process using in-cluster configuration authenticates as the pod's ServiceAccount and is
subject to its RBAC. ConfigMap, Secret and token contents are written once, when the pod
starts (no live updates, no token rotation: bound tokens are valid for the pod's life).

A ConfigMap or Secret that does not exist yet (and is not ``optional``), or an apiserver
that does not answer, does not fail the pod: as the kubelet does, the pod stays Pending
(``ContainerCreating``, the reason in the container's waiting message) and the volumes are
prepared again until they can be. Every pod's ``kube-api-access-*`` volume names the
``kube-root-ca.crt`` ConfigMap, which the controller-manager creates in a new namespace a
moment after (or before) its default ServiceAccount: a pod created in between must wait
for it, not fail.

A ``persistentVolumeClaim`` is mounted as the kubelet mounts a claim: the directory of the
PersistentVolume the controller-manager bound it to, which must be a ``hostPath`` or
``local`` volume (every node of the local cluster is this machine, so every pod of a
ReadWriteMany claim sees the same files). A claim that does not exist or is not bound yet
keeps the pod Pending, as a missing ConfigMap does; a claim bound to another type of
volume fails the pod. ``fsGroup`` and ownership changes are not applied (the processes run
as the agent's user).

Other types (csi, nfs, ...) fail the pod with ``CreateContainerConfigError``. ``readOnly``
is not enforced. A mount point that does not exist on the machine is created there as an
empty directory (or file) before the bind mount: mount namespaces isolate mounts, not the
file system.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from localcluster.agent.envvars import UnsupportedEnv, field_value
from localcluster.agent.kube import Kube

log = logging.getLogger(__name__)


# PersistentVolume spec fields other than its volume source.
_PERSISTENT_VOLUME_FIELDS = frozenset(
    {
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    }
)


class UnsupportedVolume(UnsupportedEnv):
    """A volume the agent cannot provide; fails the pod with CreateContainerConfigError."""


class VolumeNotReady(Exception):
    """A volume cannot be prepared yet (its source is missing or the apiserver did not
    answer); the pod waits and the agent tries again."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str


@dataclass
class Volumes:
    kube: Kube

    async def prepare(self, pod: Mapping[str, Any], directory: Path) -> dict[str, Path]:
        """Materialize every volume of ``pod`` under ``directory``; name -> host path."""
        paths: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "hostPath" in volume:
                paths[name] = _host_path(name, volume["hostPath"])
                continue
            if "persistentVolumeClaim" in volume:
                paths[name] = await self._claim(pod, name, volume["persistentVolumeClaim"])
                continue
            target = directory / "volumes" / name
            target.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume:
                pass
            elif "configMap" in volume:
                await self._config_map(pod, volume["configMap"], target)
            elif "secret" in volume:
                await self._secret(pod, volume["secret"], target)
            elif "downwardAPI" in volume:
                self._downward(pod, volume["downwardAPI"], target)
            elif "projected" in volume:
                for source in volume["projected"].get("sources") or []:
                    await self._projection(pod, source, target)
            else:
                kind = next((k for k in volume if k != "name"), "unknown")
                raise UnsupportedVolume(
                    f"volume {name!r} is of type {kind}, which the local node agent does not "
                    "support (emptyDir, hostPath, persistentVolumeClaim of a hostPath or local "
                    "PersistentVolume, configMap, secret, downwardAPI, projected)"
                )
            paths[name] = target
        return paths

    def mounts(self, container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[Mount]:
        mounts = []
        for mount in container.get("volumeMounts") or []:
            source = volumes.get(mount["name"])
            if source is None:
                raise UnsupportedVolume(f"volumeMount {mount['name']!r} names no volume")
            if mount.get("subPath"):
                source = source / mount["subPath"]
            mounts.append(Mount(source, mount["mountPath"]))
        return mounts

    # Sources --------------------------------------------------------------------------

    async def _projection(
        self, pod: Mapping[str, Any], source: Mapping[str, Any], target: Path
    ) -> None:
        if "serviceAccountToken" in source:
            await self._token(pod, source["serviceAccountToken"], target)
        elif "configMap" in source:
            await self._config_map(pod, source["configMap"], target)
        elif "secret" in source:
            await self._secret(pod, source["secret"], target)
        elif "downwardAPI" in source:
            self._downward(pod, source["downwardAPI"], target)
        else:
            kind = next(iter(source), "unknown")
            raise UnsupportedVolume(f"projected source {kind} is not supported")

    async def _claim(self, pod: Mapping[str, Any], name: str, source: Mapping[str, Any]) -> Path:
        """The directory of the PersistentVolume a claim is bound to."""
        namespace, claim = pod["metadata"]["namespace"], source["claimName"]
        status, body = await self._request(
            "GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
        )
        if status == 404:
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
        if status >= 300:
            raise UnsupportedVolume(f"persistentVolumeClaim {claim!r}: HTTP {status}")
        bound = (body.get("spec") or {}).get("volumeName")
        if (body.get("status") or {}).get("phase") != "Bound" or not bound:
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" is not bound')
        status, volume = await self._request("GET", f"/api/v1/persistentvolumes/{bound}")
        if status >= 300:
            raise VolumeNotReady(f'persistentvolume "{bound}" of claim "{claim}": HTTP {status}')
        spec = volume.get("spec") or {}
        if "hostPath" in spec:
            return _host_path(name, spec["hostPath"])
        if "local" in spec:
            return _host_path(name, {"path": spec["local"]["path"], "type": "Directory"})
        kind = next((k for k in spec if k not in _PERSISTENT_VOLUME_FIELDS), "unknown")
        raise UnsupportedVolume(
            f"volume {name!r}: claim {claim!r} is bound to persistentvolume {bound!r} of type "
            f"{kind}, which the local node agent cannot mount (hostPath, local)"
        )

    async def _token(
        self, pod: Mapping[str, Any], projection: Mapping[str, Any], target: Path
    ) -> None:
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": int(projection.get("expirationSeconds", 3607)),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if projection.get("audience"):
            spec["audiences"] = [projection["audience"]]
        status, review = await self._request(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        if status >= 300:
            raise VolumeNotReady(f"token of serviceaccount {account!r}: HTTP {status}: {review}")
        _write(target / projection.get("path", "token"), review["status"]["token"].encode())

    async def _config_map(
        self, pod: Mapping[str, Any], source: Mapping[str, Any], target: Path
    ) -> None:
        namespace = pod["metadata"]["namespace"]
        status, body = await self._request(
            "GET", f"/api/v1/namespaces/{namespace}/configmaps/{source['name']}"
        )
        if status == 404 and source.get("optional"):
            return
        if status == 404:
            raise VolumeNotReady(f'configmap "{source["name"]}" not found')
        if status >= 300:
            raise UnsupportedVolume(f"configMap {source['name']!r}: HTTP {status}")
        data = {k: v.encode() for k, v in (body.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (body.get("binaryData") or {}).items()})
        _write_items(target, data, source.get("items"))

    async def _secret(
        self, pod: Mapping[str, Any], source: Mapping[str, Any], target: Path
    ) -> None:
        namespace = pod["metadata"]["namespace"]
        name = source.get("secretName") or source.get("name")
        status, body = await self._request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if status == 404 and source.get("optional"):
            return
        if status == 404:
            raise VolumeNotReady(f'secret "{name}" not found')
        if status >= 300:
            raise UnsupportedVolume(f"secret {name!r}: HTTP {status}")
        data = {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()}
        _write_items(target, data, source.get("items"))

    async def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request; a transport error, 429 or 5xx (an apiserver restarting, overloaded)
        means "not yet", not a broken pod."""
        try:
            status, payload = await self.kube.request(method, path, body)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise VolumeNotReady(f"{method} {path}: {error!r}") from error
        if status == 429 or status >= 500:
            raise VolumeNotReady(f"{method} {path}: HTTP {status}")
        return status, payload

    def _downward(self, pod: Mapping[str, Any], source: Mapping[str, Any], target: Path) -> None:
        for item in source.get("items") or []:
            if "fieldRef" not in item:
                raise UnsupportedVolume("downwardAPI volume items support fieldRef only")
            _write(target / item["path"], field_value(pod, item["fieldRef"]["fieldPath"]).encode())


def _write_items(
    target: Path, data: Mapping[str, bytes], items: list[Mapping[str, Any]] | None
) -> None:
    if items:
        for item in items:
            if item["key"] in data:
                _write(target / item["path"], data[item["key"]])
    else:
        for key, value in data.items():
            _write(target / key, value)


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _host_path(name: str, source: Mapping[str, Any]) -> Path:
    """A hostPath volume, checked or created as its ``type`` says (as the kubelet does)."""
    path = Path(source["path"])
    kind = source.get("type") or ""
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind == "Directory" and not path.is_dir():
        raise UnsupportedVolume(f"hostPath volume {name!r}: {path} is not a directory")
    elif kind == "File" and not path.is_file():
        raise UnsupportedVolume(f"hostPath volume {name!r}: {path} is not a file")
    elif kind == "" and not path.exists():
        # An unset type means no checks; the bind mount needs something to bind.
        path.mkdir(parents=True, exist_ok=True)
    return path
