"""The project's one version number, and the checks the release workflow makes.

One version, X.Y.Z, names every part of a release: the chart (Chart.yaml `version` and
`appVersion`), the Python package that holds the operator and the worker
(`tpu_operator.__version__`, which pyproject.toml reads), and both images
(ghcr.io/tpu-operator/tpu-operator:X.Y.Z, ghcr.io/tpu-operator/tpu-worker:X.Y.Z; the
chart's image tag is empty and so follows appVersion). Docs and examples that name a
published image or the published chart name it at this version. The rule for which part
of the number a change bumps is in docs/contributing/release.md.

    python3 scripts/release.py version          # the version; fails when the places disagree
    python3 scripts/release.py set X.Y.Z        # writes X.Y.Z into every place
    python3 scripts/release.py check-tag vX.Y.Z # the release workflow's gate (below)
    python3 scripts/release.py check-bump vA.B.C [--crds-changed]
    python3 scripts/release.py notes X.Y.Z      # CHANGELOG.md's section for X.Y.Z
    python3 scripts/release.py helm             # path of the helm the tests use (built if missing)
    python3 scripts/release.py base-image Dockerfile            # the base it names, by tag
    python3 scripts/release.py pin-base Dockerfile sha256:<hex> # that base at the digest

The standard library only: the release workflow runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
"""A release version: MAJOR.MINOR.PATCH, no leading zeros, no pre-release or build part."""

PACKAGE_INIT = Path("operator/tpu_operator/__init__.py")
CHART_YAML = Path("charts/tpu-operator/Chart.yaml")
VALUES_YAML = Path("charts/tpu-operator/values.yaml")
CHANGELOG = Path("CHANGELOG.md")

IMAGES = ("tpu-operator", "tpu-worker")
REGISTRY = "ghcr.io/tpu-operator"
CHART_OCI = f"oci://{REGISTRY}/charts/tpu-operator"

# References to a published artifact at a version, in docs and examples: an image of
# either registry the docs use (the project's, or REGISTRY for one of your own), and the
# chart's `helm install|upgrade ... oci://.../tpu-operator --version X`.
_VERSION = r"(?P<version>\d+\.\d+\.\d+)"
REFERENCES = (
    re.compile(rf"(?:{re.escape(REGISTRY)}|REGISTRY)/(?:{'|'.join(IMAGES)}):{_VERSION}\b"),
    re.compile(rf"{re.escape(CHART_OCI)}(?:\s|\\\n)+--version[ =]{_VERSION}\b"),
)
# Where such references live. CHANGELOG.md is history and may name earlier versions.
REFERENCE_ROOTS = ("README.md", "docs", "examples", "charts", "bench")
REFERENCE_SUFFIXES = {".md", ".yaml", ".yml", ".txt", ".tpl", ".json"}

_INIT_VERSION = re.compile(r'^__version__ = "(?P<version>[^"]*)"$', re.M)
_CHART_FIELD = r'^{field}:[ \t]*"?(?P<version>[^"\s#]*)"?[ \t]*$'


class ReleaseError(Exception):
    """A version disagreement or a bad tag; the message says where and what is valid."""


@dataclass(frozen=True)
class Place:
    """One place that states the version."""

    path: Path
    what: str
    version: str


def parse(version: str) -> tuple[int, int, int]:
    match = SEMVER.fullmatch(version)
    if not match:
        raise ReleaseError(
            f"{version!r} is not a release version: MAJOR.MINOR.PATCH, three numbers "
            "without leading zeros and without a pre-release part (e.g. 0.2.0)"
        )
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _field(text: str, pattern: re.Pattern[str], path: Path, what: str) -> str:
    match = pattern.search(text)
    if not match:
        raise ReleaseError(f"{path}: no {what} found")
    return match.group("version")


def _chart_field(field: str) -> re.Pattern[str]:
    return re.compile(_CHART_FIELD.format(field=field), re.M)


def image_tag_default(values_text: str) -> str | None:
    """The `image.tag` of values.yaml (unquoted), or None when the file has none."""
    block = re.search(r"^image:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", values_text, re.M)
    if not block:
        return None
    tag = re.search(r"^[ \t]+tag:[ \t]*(?P<tag>[^#\n]*?)[ \t]*(?:#.*)?$", block.group(1), re.M)
    if not tag:
        return None
    return tag.group("tag").strip("\"'")


def places(repo: Path = REPO) -> list[Place]:
    """Every place that states the version, each with the version it states."""
    init = (repo / PACKAGE_INIT).read_text()
    chart = (repo / CHART_YAML).read_text()
    found = [
        Place(
            PACKAGE_INIT,
            "tpu_operator.__version__",
            _field(init, _INIT_VERSION, PACKAGE_INIT, "__version__"),
        ),
        Place(
            CHART_YAML,
            "chart version",
            _field(chart, _chart_field("version"), CHART_YAML, "version"),
        ),
        Place(
            CHART_YAML,
            "chart appVersion",
            _field(chart, _chart_field("appVersion"), CHART_YAML, "appVersion"),
        ),
    ]
    for path in reference_files(repo):
        text = (repo / path).read_text()
        for pattern in REFERENCES:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(Place(path, f"line {line}: {match.group(0)}", match.group("version")))
    return found


def reference_files(repo: Path) -> list[Path]:
    files: list[Path] = []
    for root in REFERENCE_ROOTS:
        top = repo / root
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [
            path.relative_to(repo)
            for path in candidates
            if path.is_file() and (path.suffix in REFERENCE_SUFFIXES or path == top)
        ]
    return files


def version(repo: Path = REPO) -> str:
    """The one version, after checking that every place states it and that the chart's
    operator image follows appVersion."""
    found = places(repo)
    package = found[0].version
    parse(package)
    wrong = [place for place in found if place.version != package]
    if wrong:
        lines = "\n".join(f"  {p.path}: {p.what} is {p.version}" for p in wrong)
        raise ReleaseError(
            f"the version is {package} ({PACKAGE_INIT}), but\n{lines}\n"
            f"run `python3 scripts/release.py set {package}` (or the version meant) to write "
            "one version everywhere"
        )
    tag = image_tag_default((repo / VALUES_YAML).read_text())
    if tag is None:
        raise ReleaseError(f"{VALUES_YAML}: no image.tag found")
    if tag:
        raise ReleaseError(
            f'{VALUES_YAML}: image.tag defaults to {tag!r}; it must be empty ("") so that the '
            "operator image follows the chart's appVersion"
        )
    return package


def set_version(new: str, repo: Path = REPO) -> list[Path]:
    """Write ``new`` into every place that states the version; the files changed."""
    parse(new)
    changed: list[Path] = []

    def rewrite(path: Path, text: str) -> None:
        if text != (repo / path).read_text():
            (repo / path).write_text(text)
            changed.append(path)

    init = (repo / PACKAGE_INIT).read_text()
    rewrite(PACKAGE_INIT, _INIT_VERSION.sub(f'__version__ = "{new}"', init, count=1))
    chart = (repo / CHART_YAML).read_text()
    chart = _chart_field("version").sub(f"version: {new}", chart, count=1)
    chart = _chart_field("appVersion").sub(f'appVersion: "{new}"', chart, count=1)
    rewrite(CHART_YAML, chart)

    def replace(match: re.Match[str]) -> str:
        start = match.start("version") - match.start()
        end = match.end("version") - match.start()
        return match.group(0)[:start] + new + match.group(0)[end:]

    for path in reference_files(repo):
        text = (repo / path).read_text()
        for pattern in REFERENCES:
            text = pattern.sub(replace, text)
        rewrite(path, text)
    return changed


def check_tag(tag: str, repo: Path = REPO) -> str:
    """The release workflow's gate: ``tag`` is ``v`` + the one version, and CHANGELOG.md
    has that version's section. Returns the version."""
    if not tag.startswith("v"):
        raise ReleaseError(f"tag {tag!r}: release tags are v + the version, e.g. v0.2.0")
    parse(tag[1:])
    current = version(repo)
    if tag[1:] != current:
        raise ReleaseError(
            f"tag {tag} does not match the version {current} the chart, the package and the "
            f"images state: tag v{current}, or bump to {tag[1:]} with "
            f"`python3 scripts/release.py set {tag[1:]}` and tag that commit"
        )
    notes(current, (repo / CHANGELOG).read_text())
    return current


def check_bump(previous_tag: str, current: str, *, crds_changed: bool) -> None:
    """The version moves forward from the previous release's, and a release that changes
    the CRDs is at least a minor release (a patch release never needs the CRD step of an
    upgrade)."""
    previous = parse(previous_tag.removeprefix("v"))
    now = parse(current)
    if now <= previous:
        raise ReleaseError(f"version {current} is not after the previous release {previous_tag}")
    if crds_changed and now[:2] == previous[:2]:
        raise ReleaseError(
            f"the CRDs changed since {previous_tag}, so {current} cannot be a patch release: "
            f"bump MAJOR or MINOR (e.g. {previous[0]}.{previous[1] + 1}.0; "
            "docs/contributing/release.md)"
        )


_RELEASE_HEADING = re.compile(r"^## \[?(?P<version>\d+\.\d+\.\d+)\]?(?:[ \t].*)?$", re.M)


def notes(release: str, changelog: str) -> str:
    """CHANGELOG.md's section for ``release``: from its heading (``## X.Y.Z`` with an
    optional date after it) to the previous release's heading, without the heading."""
    headings = list(_RELEASE_HEADING.finditer(changelog))
    for index, heading in enumerate(headings):
        if heading.group("version") == release:
            end = headings[index + 1].start() if index + 1 < len(headings) else len(changelog)
            body = changelog[heading.end() : end].strip()
            if not body:
                raise ReleaseError(f"{CHANGELOG}: the section `## {release}` is empty")
            return body + "\n"
    raise ReleaseError(
        f"{CHANGELOG} has no section for {release}: add a heading `## {release} (YYYY-MM-DD)` "
        "above the entries this release ships (docs/contributing/release.md)"
    )


BASE_ARG = "PYTHON_IMAGE"
"""The Dockerfiles' global build argument naming their base image."""
_BASE_ARG = re.compile(rf"^ARG[ \t]+{BASE_ARG}=(?P<reference>\S+)[ \t]*$", re.M)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def base_image(dockerfile: Path) -> str:
    """The base image a Dockerfile names by tag (its ``ARG PYTHON_IMAGE=`` default)."""
    text = dockerfile.read_text()
    found = _BASE_ARG.findall(text)
    if len(found) != 1 or f"FROM ${{{BASE_ARG}}}" not in text:
        raise ReleaseError(
            f"{dockerfile}: expected one `ARG {BASE_ARG}=<image>:<tag>` that its stages start "
            f"FROM (`FROM ${{{BASE_ARG}}}`), so that a release can build it from a digest"
        )
    reference: str = found[0]
    if "@" in reference:
        raise ReleaseError(f"{dockerfile}: {BASE_ARG} is already pinned ({reference})")
    return reference


def pin_base(dockerfile: Path, digest: str) -> str:
    """The build argument's value for a release: the base at the digest the registry gave."""
    if not _DIGEST.fullmatch(digest):
        raise ReleaseError(
            f"base image digest {digest!r}: expected sha256:<64 hex digits>, as "
            "`docker buildx imagetools inspect` prints for the image's index"
        )
    return f"{base_image(dockerfile)}@{digest}"


def helm() -> Path:
    """The helm binary the test suite uses: the pinned version, built from its Go module
    with the same flags (``localcluster/binaries.py``, standard library only, loaded
    without the rest of ``localcluster``), cached in ~/.cache/tpu-operator/bin."""
    spec = importlib.util.spec_from_file_location("binaries", REPO / "localcluster" / "binaries.py")
    assert spec and spec.loader
    binaries = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("binaries", binaries)
    spec.loader.exec_module(binaries)
    path: Path = binaries.ensure(binaries.HELM)["helm"]
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print the version; fail when the places disagree")
    set_ = commands.add_parser("set", help="write a new version into every place")
    set_.add_argument("version")
    tag = commands.add_parser("check-tag", help="the tag is v + the version, with CHANGELOG notes")
    tag.add_argument("tag")
    bump = commands.add_parser("check-bump", help="the version follows the previous release's")
    bump.add_argument("previous_tag")
    bump.add_argument("--crds-changed", action="store_true")
    notes_ = commands.add_parser("notes", help="CHANGELOG.md's section for a version")
    notes_.add_argument("version")
    commands.add_parser("helm", help="path of the helm the tests use, built if missing")
    base = commands.add_parser("base-image", help="the base image a Dockerfile names, by tag")
    base.add_argument("dockerfile", type=Path)
    pin = commands.add_parser("pin-base", help="a Dockerfile's base image at a digest")
    pin.add_argument("dockerfile", type=Path)
    pin.add_argument("digest")
    args = parser.parse_args(argv)
    try:
        if args.command == "version":
            print(version())
        elif args.command == "set":
            for path in set_version(args.version):
                print(path)
            version()
        elif args.command == "check-tag":
            print(check_tag(args.tag))
        elif args.command == "check-bump":
            check_bump(args.previous_tag, version(), crds_changed=args.crds_changed)
        elif args.command == "helm":
            print(helm())
        elif args.command == "base-image":
            print(base_image(args.dockerfile))
        elif args.command == "pin-base":
            print(pin_base(args.dockerfile, args.digest))
        else:
            sys.stdout.write(notes(args.version, (REPO / CHANGELOG).read_text()))
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
