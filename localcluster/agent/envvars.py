"""A container's environment as the kubelet builds it, for a process run on this machine.

Supported: literal ``value``s with ``$(VAR)`` expansion (``$$`` escapes, unknown
references stay as written, as in Kubernetes), and downward-API ``fieldRef``s for
``metadata.name``, ``metadata.namespace``, ``metadata.uid``, ``metadata.labels['k']``,
``metadata.annotations['k']``, ``spec.nodeName``, ``spec.serviceAccountName``,
``status.podIP``, ``status.podIPs``, ``status.hostIP``, ``status.hostIPs``.
Not supported (the pod fails with reason ``CreateContainerConfigError`` naming the
variable): ``configMapKeyRef``, ``secretKeyRef``, ``resourceFieldRef``, ``envFrom``.

The process does not inherit the agent's environment (a container does not inherit the
node's either), except a few variables that make local tools work: ``PATH`` with the
agent's own Python environment first (so ``python -m tpu_worker...`` or ``tpu-worker``
resolve to the project's virtualenv), ``HOME``, locale, time zone and CA bundles.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PASSTHROUGH = (
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "USER",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
_FIELD_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class UnsupportedEnv(ValueError):
    """The container asks for an environment the agent cannot provide."""

    reason = "CreateContainerConfigError"


class NoCommand(UnsupportedEnv):
    """The container relies on its image's entrypoint, which is not run here."""

    reason = "CreateContainerError"


def base_path() -> str:
    # Not resolved: a virtualenv's bin dir holds symlinks to the base interpreter, and the
    # venv is found through the symlink's location.
    venv_bin = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    if not rest:
        rest = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    return os.pathsep.join([venv_bin, *rest])


def base_env(hostname: str) -> dict[str, str]:
    env = {key: os.environ[key] for key in PASSTHROUGH if key in os.environ}
    env["PATH"] = base_path()
    env["HOSTNAME"] = hostname
    return env


def field_value(pod: Mapping[str, Any], field_path: str) -> str:
    metadata = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    if field_path in simple:
        return simple[field_path]
    match = _FIELD_SUBSCRIPT.match(field_path)
    if match:
        return (metadata.get(match.group(1)) or {}).get(match.group(2), "")
    raise UnsupportedEnv(f"fieldRef {field_path!r} is not supported by the local node agent")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` is a literal ``$``, unknown refs are kept."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], base: Mapping[str, str]
) -> dict[str, str]:
    """The environment of one container process (raises :class:`UnsupportedEnv`)."""
    if container.get("envFrom"):
        raise UnsupportedEnv(
            f"container {container.get('name')!r} uses envFrom (ConfigMap/Secret), which the "
            "local node agent does not support"
        )
    env = dict(base)
    declared: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            declared[name] = expand(item.get("value") or "", declared)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            declared[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        else:
            kind = next(iter(source), "valueFrom")
            raise UnsupportedEnv(
                f"env {name!r} of container {container.get('name')!r} uses {kind}, which the "
                "local node agent does not support (only value and fieldRef)"
            )
    env.update(declared)
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with ``$(VAR)`` expanded; images are not run, so a command is required."""
    command = list(container.get("command") or [])
    if not command:
        raise NoCommand(
            f"container {container.get('name')!r} has no command: the local node agent ignores "
            "images (it cannot run an image's entrypoint), so set command (and args)"
        )
    args = list(container.get("args") or [])
    return [expand(part, env) for part in command + args]
