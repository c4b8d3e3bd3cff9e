"""The product's images, as the local cluster runs them: virtualenvs instead of containers.

The node agent ignores container images, so a pod runs a command from this machine. To
run the operator the way its image does, ``operator_venv`` installs the package with the
same script the Dockerfile runs (``scripts/install-package.sh operator``) into the build
cache, keyed by a digest of the sources, so it is built once per change and reused.
The cache lies outside /tmp on purpose: the chart mounts an emptyDir at /tmp, which hides
whatever the pod would have found there on the machine.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from localcluster import binaries

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "operator", "worker-image", "scripts/install-package.sh")


def sources_digest(repo: Path = REPO) -> str:
    digest = hashlib.sha256()
    for root in SOURCES:
        top = repo / root
        for path in sorted(top.rglob("*") if top.is_dir() else [top]):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(repo)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def operator_venv(repo: Path = REPO) -> Path:
    """A virtualenv with the operator installed as its image installs it; built if missing."""
    venv = binaries.cache_root() / "venvs" / f"operator-{sources_digest(repo)}"
    if (venv / "bin" / "tpu-operator").exists():
        return venv
    binaries.log(f"installing the operator as its image does into {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(
        ["sh", str(repo / "scripts" / "install-package.sh"), "operator", str(venv), str(repo)],
        check=True,
        timeout=900,
    )
    return venv
