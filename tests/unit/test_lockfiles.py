"""The images' lock files: current with pyproject.toml, every package pinned and hashed,
and minimum versions above the published advisories."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _load_lock_module():
    spec = importlib.util.spec_from_file_location("lock", REPO / "scripts" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["lock"] = module
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()

# The first version without a published advisory, for each package whose minimum
# pyproject.toml raises on that account (the lock files pin newer ones still).
ADVISORY_FLOORS = {
    "aiohttp": "3.14.4",  # CVE-2025-69223 (3.13.3), 3.13.4, 3.14.1 and 3.14.4 advisories
    "orjson": "3.11.6",  # CVE-2025-67221
    "urllib3": "2.7.0",  # CVE-2026-44431, CVE-2026-44432
    "setuptools": "78.1.1",  # CVE-2025-47273
    "pydantic": "2.4.0",  # CVE-2024-3772
    "cryptography": "50.0.0",  # CVE-2026-69247
}

PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def pins(text: str) -> dict[str, tuple[Version, list[str]]]:
    """name -> (version, hashes) of a lock file written by scripts/lock.py."""
    entries: dict[str, tuple[Version, list[str]]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if match := PIN.match(line):
            name = str(canonicalize_name(match.group(1)))
            assert name not in entries, f"{name} pinned twice"
            current = []
            entries[name] = (Version(match.group(2)), current)
        elif current is not None and (hashed := re.search(r"--hash=(\w+):(\w+)", line)):
            algorithm, value = hashed.groups()
            assert algorithm == "sha256", line
            current.append(value)
    return entries


@pytest.mark.parametrize("entry", lock.LOCKS, ids=lambda entry: entry.name)
def test_lock_file_is_current_with_pyproject(entry):
    pyproject = lock.load_pyproject()
    assert entry.path.exists(), f"{entry.path} is missing; run `make lock`"
    recorded = lock.recorded_digest(entry.path.read_text())
    assert recorded == lock.inputs_digest(entry, pyproject), lock.stale(pyproject)


def test_a_changed_requirement_makes_its_lock_files_stale():
    pyproject = copy.deepcopy(lock.load_pyproject())
    operator = pyproject["project"]["optional-dependencies"]["operator"]
    operator[:] = [r if not r.startswith("aiohttp") else "aiohttp>=99" for r in operator]
    problems = lock.stale(pyproject)
    assert len(problems) == 1, problems
    assert "requirements/operator.txt" in problems[0] and "make lock" in problems[0]
    # A requirement of every image (the project's own dependencies) stales all of them.
    pyproject["project"]["dependencies"].append("rich")
    assert len(lock.stale(pyproject)) == len(lock.LOCKS)


@pytest.mark.parametrize("entry", lock.LOCKS, ids=lambda entry: entry.name)
def test_every_requirement_is_pinned_within_its_range_and_hashed(entry):
    locked = pins(entry.path.read_text())
    assert locked, entry.path
    for name, (version, hashes) in locked.items():
        assert hashes, f"{entry.path.name}: {name}=={version} has no hash"
    for text in lock.requirements(entry, lock.load_pyproject()):
        requirement = Requirement(text)
        name = str(canonicalize_name(requirement.name))
        assert name in locked, f"{entry.path.name} does not pin {name}"
        version = locked[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{entry.path.name} pins {name}=={version}, outside {requirement}"
        )
        for extra in requirement.extras:
            # jax[tpu] brings libtpu: an extra's packages are pinned too.
            assert extra != "tpu" or "libtpu" in locked, entry.path.name


def test_minimum_versions_are_above_published_advisories():
    pyproject = lock.load_pyproject()
    every = [
        *pyproject["build-system"]["requires"],
        *pyproject["project"]["dependencies"],
        *(r for group in pyproject["project"]["optional-dependencies"].values() for r in group),
    ]
    minimums: dict[str, Version] = {}
    for text in every:
        requirement = Requirement(text)
        for spec in requirement.specifier:
            if spec.operator in (">=", "==", "~="):
                minimums[str(canonicalize_name(requirement.name))] = Version(spec.version)
    for name, floor in ADVISORY_FLOORS.items():
        assert name in minimums, f"pyproject.toml states no minimum version of {name}"
        assert minimums[name] >= Version(floor), (
            f"pyproject.toml admits {name} {minimums[name]}, below {floor}"
        )
    for entry in lock.LOCKS:
        for name, (version, _) in pins(entry.path.read_text()).items():
            if name in ADVISORY_FLOORS:
                assert version >= Version(ADVISORY_FLOORS[name]), (entry.name, name, version)


def test_images_install_from_their_lock_files_with_hashes_only():
    script = (REPO / "scripts" / "install-package.sh").read_text()
    assert "--require-hashes --no-deps -r" in script
    assert "--no-deps --no-build-isolation --no-index" in script
    operator = (REPO / "Dockerfile").read_text()
    worker = (REPO / "worker-image" / "Dockerfile").read_text()
    assert "install-package.sh operator " in operator
    assert "ARG LOCK=worker\n" in worker and 'install-package.sh "$LOCK" ' in worker
    names = {entry.name for entry in lock.LOCKS}
    assert {"operator", "worker"} <= names
