"""Kubeconfig files for the admin and each component, pointing at the local apiserver.

Certificates are referenced by absolute path (not embedded), so a kubeconfig stays small
and readable and the PKI has one copy.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CONTEXT = "localcluster"


def render(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    return _render(
        server,
        ca,
        user,
        {"client-certificate": str(cert.resolve()), "client-key": str(key.resolve())},
    )


def _render(server: str, ca: Path, user: str, credentials: dict[str, str]) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {"server": server, "certificate-authority": str(ca.resolve())},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write(path: Path, server: str, pki: Path, stem: str) -> Path:
    """Write a kubeconfig for the client certificate ``<pki>/<stem>.crt``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(server, pki / "ca.crt", pki / f"{stem}.crt", pki / f"{stem}.key", stem))
    path.chmod(0o600)
    return path


def write_token(path: Path, server: str, pki: Path, token: str, user: str) -> Path:
    """Write a kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_render(server, pki / "ca.crt", user, {"token": token}))
    path.chmod(0o600)
    return path
