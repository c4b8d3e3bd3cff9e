"""The previous release: the chart, CRDs and operator image of an earlier commit.

The upgrade test (tests/e2e/test_upgrade.py) installs this version, runs a job on it and
upgrades to the checkout's own chart and operator. ``PREVIOUS`` is a commit of this
repository whose CRDs differ from today's (later commits added ``status.recreatedSlices``,
``status.slices[].failures`` and ``poolFailures``, ``failurePolicy.maxSliceFailuresPerPool``),
so the CRD upgrade is a real one. When releases are tagged, the last tag takes its place.

Its tree is extracted with ``git archive`` into the build cache once per commit, and its
operator image is built from that tree as the checkout's own is (``images.ensure``, keyed by
its inputs, under a name of its own so that builds of the current image never prune it):
a warm run pays a ``podman image inspect``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from localcluster import binaries, images

PREVIOUS = "ec336202642be32484b3129eda830e724f641bcb"
"""The version upgraded from (main before the per-slice failure budget)."""

PREVIOUS_OPERATOR = images.ImageSpec("tpu-operator-previous", "Dockerfile")


class PreviousError(RuntimeError):
    """The previous version's tree is not in this checkout's history."""


def tree(commit: str = PREVIOUS, repo: Path = images.REPO) -> Path:
    """The commit's files (``git archive``) in the build cache, extracted once."""
    target = binaries.cache_root() / "previous" / commit
    if (target / ".complete").exists():
        return target
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise PreviousError(
            f"commit {commit} is not in {repo}'s history ({archive.stderr.decode().strip()}): "
            "the upgrade test needs the full history (git fetch --unshallow; in GitHub "
            "Actions, actions/checkout with fetch-depth: 0)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{commit[:12]}-"))
    with tempfile.TemporaryFile() as handle:
        handle.write(archive.stdout)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(staging, filter="data")
    (staging / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def chart(commit: str = PREVIOUS) -> Path:
    return tree(commit) / "charts" / "tpu-operator"


def crds(commit: str = PREVIOUS) -> Path:
    """The chart's crds/ directory of that version (what ``helm show crds`` prints)."""
    return chart(commit) / "crds"


def operator_image(commit: str = PREVIOUS) -> images.ImageConfig:
    """The commit's operator image, built from its own Dockerfile and sources."""
    return images.ensure(PREVIOUS_OPERATOR, tree(commit))
