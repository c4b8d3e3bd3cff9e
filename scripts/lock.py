"""Lock files with hashes for the images, resolved from pyproject.toml (``make lock``).

    python scripts/lock.py          # write requirements/*.txt
    python scripts/lock.py --check  # exit 1 if one is stale (tests/unit/test_lockfiles.py)

Each image installs from its lock file with ``pip install --require-hashes --no-deps``
(scripts/install-package.sh), so what it contains is exactly what was resolved here: every
distribution pinned to one version and checked against its published hashes. A lock file
holds the project's dependencies, one extra, and the build backend
(``build-system.requires``: the project is built from source inside the image without
build isolation, so setuptools comes from the lock too). It is resolved with uv for the
images' interpreter (CPython 3.11 on Debian bookworm's glibc, x86_64); its hashes cover
every file of each pinned version on PyPI. Its second line is a digest of the inputs it was
resolved from: when pyproject.toml changes them, the file is stale until ``make lock``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
OUTPUT_DIR = REPO / "requirements"

# The images' interpreter: python:3.11-slim-bookworm (and its local stand-in, Debian
# bookworm's python3.11). glibc 2.36.
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_36"
INPUTS_PREFIX = "# inputs: "


@dataclass(frozen=True)
class Lock:
    """One lock file: which extra of the project it resolves, and for which image."""

    name: str
    extra: str
    image: str

    @property
    def path(self) -> Path:
        return OUTPUT_DIR / f"{self.name}.txt"


LOCKS = (
    Lock("operator", "operator", "Dockerfile"),
    Lock("worker", "tpu", "worker-image/Dockerfile"),
    Lock(
        "worker-cpu",
        "worker",
        "worker-image/Dockerfile --build-arg LOCK=worker-cpu",
    ),
)


def requirements(lock: Lock, pyproject: dict) -> list[str]:
    """The requirement strings a lock file is resolved from, as pyproject.toml states them."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    if lock.extra not in extras:
        raise KeyError(f"pyproject.toml has no optional dependency group {lock.extra!r}")
    return [
        *pyproject["build-system"]["requires"],
        *project["dependencies"],
        *extras[lock.extra],
    ]


def inputs_digest(lock: Lock, pyproject: dict) -> str:
    """A digest of everything a lock file depends on: its requirements and the target."""
    document = {
        "requirements": sorted(requirements(lock, pyproject)),
        "python": PYTHON_VERSION,
        "platform": PYTHON_PLATFORM,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def recorded_digest(text: str) -> str | None:
    for line in text.splitlines()[:5]:
        if line.startswith(INPUTS_PREFIX):
            return line[len(INPUTS_PREFIX) :].strip()
    return None


def load_pyproject(path: Path = PYPROJECT) -> dict:
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def stale(pyproject: dict | None = None) -> list[str]:
    """What is out of date, one sentence per lock file; empty when all are current."""
    pyproject = pyproject or load_pyproject()
    problems = []
    for lock in LOCKS:
        if not lock.path.exists():
            problems.append(f"{lock.path.relative_to(REPO)} is missing; run `make lock`")
            continue
        recorded = recorded_digest(lock.path.read_text())
        expected = inputs_digest(lock, pyproject)
        if recorded != expected:
            problems.append(
                f"{lock.path.relative_to(REPO)} was resolved from other inputs than "
                f"pyproject.toml now states (digest {recorded}, now {expected}); "
                "run `make lock` and commit the result"
            )
    return problems


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not found:
        raise SystemExit("uv is not installed: `make venv` installs it with the dev extras")
    return found


def write(lock: Lock, pyproject: dict) -> None:
    digest = inputs_digest(lock, pyproject)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "requirements.in"
        source.write_text("\n".join(requirements(lock, pyproject)) + "\n")
        output = Path(tmp) / "out.txt"
        subprocess.run(
            [
                uv(),
                "pip",
                "compile",
                "--quiet",
                "--generate-hashes",
                "--no-header",
                "--no-annotate",
                "--python-version",
                PYTHON_VERSION,
                "--python-platform",
                PYTHON_PLATFORM,
                "--output-file",
                str(output),
                str(source),
            ],
            check=True,
        )
        body = output.read_text()
    header = (
        f"# {lock.path.relative_to(REPO)}: written by `make lock` (scripts/lock.py).\n"
        f"{INPUTS_PREFIX}{digest}\n"
        f"# tpu-operator[{lock.extra}] and its build backend for {lock.image}, CPython "
        f"{PYTHON_VERSION} on {PYTHON_PLATFORM}.\n"
        "# Installed with `pip install --require-hashes --no-deps -r`"
        " (scripts/install-package.sh).\n"
    )
    lock.path.write_text(header + body)
    print(f"wrote {lock.path.relative_to(REPO)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale lock files")
    args = parser.parse_args(argv)
    pyproject = load_pyproject()
    if args.check:
        problems = stale(pyproject)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    OUTPUT_DIR.mkdir(exist_ok=True)
    for lock in LOCKS:
        write(lock, pyproject)
    return 0


if __name__ == "__main__":
    sys.exit(main())
