"""The docs checked against the code they describe.

- The generated reference (``docs/reference/``, ``tpu-operator docs --write``) is current.
- The index (``docs/README.md``) lists every page; every relative link and anchor resolves.
- Every flag, chart value, CRD field, metric name, condition, reason, phase and
  repository path the docs name exists; every TPUJob and TPUSlice manifest in them is one
  the CRDs accept.
- Every reason the operator reports is in the troubleshooting page, and every reason
  there is one the operator reports.
- Every name a worker pod gets (env, labels, annotations, ports, volumes, tolerations,
  node selectors) is in the pod contract page.
- Every abbreviation on the user's path is defined in the glossary.

Docs are README.md, docs/**, bench/README.md and CHANGELOG.md; CHANGELOG.md tells history
and may name what no longer exists, so it is checked for links only.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_operator import catalog, cli, contract, crdgen, docgen
from tpu_operator import worker_metrics as wm
from tpu_operator.api.job import TPUJobSpec
from tpu_operator.api.slice import TPUSliceSpec
from tpu_operator.api.status import ConditionType, Phase, Reason
from tpu_operator.builders import workload
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.supervision import Supervision
from tpu_operator.builders.wiring import PodWiring, Ports
from tpu_operator.policies import slice_check
from tpu_operator.runtime import lease

pytestmark = pytest.mark.unit

REPO = crdgen.REPO_ROOT
DOCS = REPO / "docs"
INDEX = DOCS / "README.md"
CHANGELOG = REPO / "CHANGELOG.md"
PAGES = sorted(DOCS.rglob("*.md"))
CHECKED = [REPO / "README.md", *PAGES, REPO / "bench" / "README.md"]
"""Pages whose names are checked against the code (history excluded)."""
LINKED = [*CHECKED, CHANGELOG]
"""Pages whose links are checked."""
USER_PATH = [REPO / "README.md", *(p for p in PAGES if "contributing" not in p.parts)]
"""Pages a user reads: their abbreviations must be in the glossary."""


# Reading Markdown


@dataclass(frozen=True)
class Page:
    path: Path
    prose: list[tuple[int, str]]
    """(line number, text) of the lines outside fenced code blocks."""
    blocks: list[tuple[int, str, str]]
    """(line number, language, text) of the fenced code blocks."""

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO))

    def spans(self) -> Iterator[tuple[int, str]]:
        """(line, text) of every inline code span of the prose."""
        for number, line in self.prose:
            for match in re.finditer(r"(`+)(.+?)\1", line):
                yield number, match[2].strip()

    def text_without_code(self) -> Iterator[tuple[int, str]]:
        for number, line in self.prose:
            yield number, re.sub(r"(`+).+?\1", " ", line)


@functools.cache
def page(path: Path) -> Page:
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, str]] = []
    fence: str | None = None
    language, start, body = "", 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence, language, start, body = stripped[:3], stripped[3:].strip(), number, []
        elif fence is not None and stripped.startswith(fence):
            blocks.append((start, language, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append((number, line))
    assert fence is None, f"{path}: a code block opened on line {start} is never closed"
    return Page(path, prose, blocks)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in page(path).prose:
        match = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if not match:
            continue
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


LINK = re.compile(r"\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE_DEF = re.compile(r"^\s*\[([^\]]+)\]:\s*(\S+)")
REFERENCE_USE = re.compile(r"\]\[([^\]]+)\]")


def links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in page(path).text_without_code():
        for match in LINK.finditer(line):
            yield number, match[1]
        definition = REFERENCE_DEF.match(line)
        if definition:
            yield number, definition[2]


def local_target(path: Path, target: str) -> tuple[Path, str] | None:
    """The file and anchor a relative link points to (None: an external link)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None
    file, _, anchor = target.partition("#")
    return ((path.parent / file).resolve() if file else path), anchor


def problem_with_link(path: Path, target: str) -> str | None:
    resolved = local_target(path, target)
    if resolved is None:
        return None
    file, anchor = resolved
    if not file.exists():
        return f"{target}: no such file"
    if REPO not in file.parents and file != REPO:
        return f"{target}: outside the repository"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{target}: no heading #{anchor} in {file.relative_to(REPO)}"
    return None


# The index and the links


def test_the_index_lists_every_page():
    listed = set()
    for _, target in links(INDEX):
        resolved = local_target(INDEX, target)
        if resolved is not None:
            listed.add(resolved[0])
    missing = [str(p.relative_to(REPO)) for p in PAGES if p != INDEX and p not in listed]
    assert not missing, f"docs/README.md does not list {missing}"


def test_the_readme_points_to_the_index():
    targets = {t for _, t in links(REPO / "README.md")}
    assert "docs/README.md" in targets


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(path: Path):
    problems = []
    definitions = set()
    for _, line in page(path).text_without_code():
        definition = REFERENCE_DEF.match(line)
        if definition:
            definitions.add(definition[1].lower())
    for number, target in links(path):
        problem = problem_with_link(path, target)
        if problem:
            problems.append(f"line {number}: {problem}")
    for number, line in page(path).text_without_code():
        for match in REFERENCE_USE.finditer(line):
            if match[1].lower() not in definitions:
                problems.append(f"line {number}: [{match[1]}] is not defined")
    assert not problems, f"{path.relative_to(REPO)}: " + "; ".join(problems)


# The generated reference


def test_the_generated_reference_is_current():
    for name, text in docgen.pages(cli._parser()).items():
        path = docgen.OUTPUT_DIR / name
        assert path.exists(), f"{path} is missing; run `make docs`"
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} is stale; run `make docs` (tpu-operator docs --write) "
            "and commit the result"
        )


def test_every_label_and_annotation_of_the_contract_is_described():
    described = set(docgen._OPERATOR_LABELS) | set(docgen._NODE_FACTS)
    assert set(docgen.contract_names()) <= described


def test_computed_cel_messages_show_their_computed_parts():
    rule = {"messageExpression": "'type: ' + self.type + ' is unknown; use ' + {'a': 'b'}[x]"}
    assert docgen.cel_message(rule) == "type: <...> is unknown; use <...>"
    assert docgen.cel_message({"message": "plain", "messageExpression": "'x'"}) == "plain"


# Names the docs use


def inline_and_code(path: Path) -> Iterator[tuple[int, str]]:
    """Every code span of the prose, and every line of every code block."""
    doc = page(path)
    yield from doc.spans()
    for start, _, text in doc.blocks:
        for offset, line in enumerate(text.splitlines(), 1):
            yield start + offset, line


EXTERNAL_FLAGS = {
    # gcloud and xpk (tasks/dynamic-slicing.md)
    "--enable-slice-controller",
    "--accelerator-topology",
    "--accelerator-topology-mode",
    "--super-slicing",
    "--sub-slicing",
    # helm
    "--set",
    "--create-namespace",
    "--reuse-values",
    "--api-versions",
    "--version",
    "--strict",
    # kubectl
    "--type",
    "--server-side",
    "--force-conflicts",
    "--dry-run",
    "--field-selector",
    "--all",
    "--request-timeout",
    # chart-testing's ct, pluto (contributing/chart.md)
    "--check-version-increment",
    "--validate-maintainers",
    "--target-versions",
    # mount, py-spy
    "--bind",
    "--native",
    # kube-apiserver flags the local control plane does not pass (contributing/localcluster.md)
    "--requestheader-client-ca-file",
    "--proxy-client-cert-file",
    "--proxy-client-key-file",
    # gcloud container
    "--cluster",
    "--location",
    "--machine-type",
    "--tpu-topology",
    "--num-nodes",
    "--spot",
    "--reservation-affinity",
    "--reservation",
    "--placement-policy",
    "--enable-managed-prometheus",
    # docker, docker buildx, cosign (contributing/release.md)
    "--build-arg",
    "--sbom",
    "--provenance",
    "--certificate-identity",
    "--certificate-oidc-issuer",
    # pip, go, uv
    "--require-hashes",
    "--no-deps",
    "--no-build-isolation",
    "--no-index",
}
"""Flags of other tools the docs show in commands."""


@functools.cache
def parser_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    found = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= parser_flags(sub)
    return frozenset(found)


@functools.cache
def known_flags() -> frozenset[str]:
    """The project's flags: its command lines' parsers, and the flags its code passes to
    the programs it runs (localcluster's components, the benchmarks' scripts)."""
    from localcluster import cli as localcluster_cli
    from tpu_worker import cli as worker_cli
    from tpu_worker.demo import options

    found = set(parser_flags(cli._parser()))
    found |= parser_flags(localcluster_cli.parser())
    found |= parser_flags(worker_cli.worker_flags())
    found |= parser_flags(options.parser())
    for source in [*REPO.glob("localcluster/**/*.py"), *REPO.glob("bench/*.py")]:
        found |= set(re.findall(r"[\"'](--[a-z0-9][a-z0-9-]*)", source.read_text()))
    return frozenset(found | EXTERNAL_FLAGS)


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def flags_in(text: str) -> Iterator[str]:
    """The flags in ``text``; ``--requestheader-*-headers`` (a family of flags) is none."""
    for match in FLAG.finditer(text):
        if not match[0].endswith("-"):
            yield match[0]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_named_exists(path: Path):
    unknown = {
        f"{flag} (line {number})"
        for number, text in inline_and_code(path)
        for flag in flags_in(text)
        if flag not in known_flags()
    }
    assert not unknown, f"{path.relative_to(REPO)} names unknown flags: {sorted(unknown)}"


@functools.cache
def chart_values() -> dict[str, Any]:
    return yaml.safe_load(docgen.VALUES.read_text())


def value_problem(path: str) -> str | None:
    """Why a dotted chart value path does not exist (None: it does)."""
    node: Any = chart_values()
    walked = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if isinstance(node, list) or (isinstance(node, dict) and not node):
            return None  # a list or an empty map: entries are the user's
        if part.startswith("["):
            return f"{'.'.join(walked)} is not a list"
        if not isinstance(node, dict) or part not in node:
            return f"no value {'.'.join([*walked, part])}"
        node = node[part]
        walked.append(part)
    return None


@functools.cache
def schemas() -> dict[str, dict[str, Any]]:
    """Kind -> its CRD's openAPIV3Schema."""
    return {
        crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for crd in crdgen.crds().values()
    }


def field_problem(schema: dict[str, Any], parts: list[str]) -> str | None:
    node = schema
    for part in parts:
        name = part.removesuffix("[]")
        properties = node.get("properties") or {}
        if name in properties:
            node = properties[name]
        elif node.get("x-kubernetes-preserve-unknown-fields") or isinstance(
            node.get("additionalProperties"), dict
        ):
            return None  # a pod template part, or a map: keys are the user's
        else:
            return f"no field {name}"
        if part.endswith("[]") or (node.get("type") == "array" and "items" in node):
            node = node.get("items") or node
    return None


def crd_field_problem(path: str) -> str | None:
    """Why ``spec.a.b`` / ``status.a.b`` (or ``a.b`` below spec) is no field of TPUJob
    or TPUSlice (None: it is one of either)."""
    parts = path.split(".")
    if parts[0] not in ("spec", "status"):
        parts = ["spec", *parts]
    problems = [field_problem(schema, parts) for schema in schemas().values()]
    return None if None in problems else problems[0]


FOREIGN_FIELDS = {
    # Kueue's Workload, ResourceFlavor and ClusterQueue (docs/tasks/kueue.md)
    "spec.queueName",
    "spec.podSets",
    "spec.priorityClassRef",
    "spec.priority",
    "spec.active",
    "spec.nodeLabels",
    "spec.tolerations",
    "status.admission",
    "status.admission.podSetAssignments[].topologyAssignment",
    "status.reclaimablePods",
    # a Pod's and a Lease's (docs/reference/pod-contract.md, contributing/localcluster.md)
    "spec.nodeName",
    "spec.hostname",
    "spec.subdomain",
    "spec.serviceAccountName",
    "spec.renewTime",
}
"""Fields of other kinds the docs name with a ``spec.`` or ``status.`` prefix."""

DOTTED = re.compile(r"^([a-z][A-Za-z0-9]*)((?:\.[A-Za-z][A-Za-z0-9]*|\[\d*\])+)(?:[=:].*)?$")


def named_paths(path: Path) -> Iterator[tuple[int, str, bool]]:
    """Dotted paths in code spans (``spec.placement.spot``, ``podMonitor.enabled=true``),
    and the keys of ``--set`` anywhere (True: a chart value for certain)."""
    for number, span in page(path).spans():
        match = DOTTED.match(span)
        if match and not is_path(span):
            yield number, match[1] + match[2], False
    for number, line in inline_and_code(path):
        for assignments in re.findall(r"--set[ =](\S+)", line):
            for assignment in assignments.split(","):
                key = assignment.split("=", 1)[0]
                if "<" not in key:  # not a placeholder (--set <value>=...)
                    yield number, key, True


def path_problem(dotted: str) -> str | None:
    """Why a dotted path the docs name is neither a chart value nor a CRD field."""
    head = dotted.split(".", 1)[0].split("[", 1)[0]
    spec_fields = {
        name for schema in schemas().values() for name in schema["properties"]["spec"]["properties"]
    }
    if dotted in FOREIGN_FIELDS:
        return None
    if head in ("spec", "status"):
        return crd_field_problem(dotted)
    candidates = []
    if head in chart_values():
        candidates.append(value_problem(dotted))
    if head in spec_fields:
        candidates.append(crd_field_problem(dotted))
    if not candidates:
        return None  # not a value or field path (a module, a host name, a YAML key)
    return None if None in candidates else candidates[0]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_chart_value_and_crd_field_named_exists(path: Path):
    problems = {
        f"{dotted} (line {number}: {problem})"
        for number, dotted, value in named_paths(path)
        if (problem := value_problem(dotted) if value else path_problem(dotted))
    }
    assert not problems, f"{path.relative_to(REPO)}: {sorted(problems)}"


def manifests(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for start, language, text in page(path).blocks:
        if language not in ("yaml", "yml"):
            continue
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as error:
            raise AssertionError(f"{path.relative_to(REPO)}:{start}: not YAML: {error}") from None
        for document in documents:
            if isinstance(document, dict):
                yield start, document


def unknown_fields(schema: dict[str, Any], value: Any, where: str) -> Iterator[str]:
    if isinstance(value, dict) and schema.get("properties") is not None:
        for key, child in value.items():
            if key in schema["properties"]:
                yield from unknown_fields(schema["properties"][key], child, f"{where}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{where}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from unknown_fields(schema["items"], item, f"{where}[{index}]")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_manifest_in_the_docs_is_one_the_crds_accept(path: Path):
    """TPUJobs and TPUSlices: no unknown field, values the models accept; a bare
    ``status:`` example: no unknown field."""
    problems = []
    models = {contract.JOB_KIND: TPUJobSpec, contract.SLICE_KIND: TPUSliceSpec}
    for start, document in manifests(path):
        kind = document.get("kind")
        if kind in models and document.get("apiVersion") == contract.API_VERSION:
            schema = schemas()[kind]
            problems += [f"line {start}: {f}" for f in unknown_fields(schema, document, kind)]
            try:
                models[kind].model_validate(document.get("spec") or {})
            except ValueError as error:
                problems.append(f"line {start}: {error}")
        elif set(document) == {"status"}:
            schema = schemas()[contract.JOB_KIND]
            problems += [
                f"line {start}: {f}" for f in unknown_fields(schema, document, contract.JOB_KIND)
            ]
    assert not problems, f"{path.relative_to(REPO)}: {problems}"


@functools.cache
def metric_series() -> frozenset[str]:
    found = set()
    for name, kind, _, _ in docgen.operator_metrics():
        found.add(name)
        if kind == "histogram":
            found |= {name + "_bucket", name + "_sum", name + "_count"}
    for name in wm.METRICS:
        found |= {name, *wm.series(name)}
    return frozenset(found)


METRIC = re.compile(r"\b(tpu_(?:operator|worker)_[a-z0-9_]*)")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_metric_named_exists(path: Path):
    unknown = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for name in METRIC.findall(line):
            if name.endswith("_"):  # a family: tpu_operator_job_*
                if not any(s.startswith(name) for s in metric_series()):
                    unknown.add(f"{name}* (line {number})")
            elif name not in metric_series():
                unknown.add(f"{name} (line {number})")
    assert not unknown, f"{path.relative_to(REPO)} names unknown metrics: {sorted(unknown)}"


KUEUE_CONDITIONS = {
    workload.QUOTA_RESERVED,
    workload.ADMITTED,
    workload.EVICTED,
    workload.PODS_READY,
    workload.FINISHED,
    workload.REQUEUED,
}
KUEUE_REASONS = {
    "Pending",
    "Preempted",
    "PodsReadyTimeout",
    "ClusterQueueStopped",
    "FailedToStart",
    "Deactivated",
    "AdmissionCheck",
    *workload.REQUEUE_REASONS,
}
"""Kueue's own condition types and reasons, which the operator passes on unchanged."""
SLICE_CHECK_CONDITIONS = {slice_check.FAILURE_CONDITION}
"""GKE's Kueue slice controller's Workload condition, which the operator's check sets."""
OTHER_EVENTS = {
    "TriggeredScaleUp",
    "NotTriggerScaleUp",
    "Warning",
    "Normal",
    slice_check.SLICES_CREATED,
    slice_check.FAILED_CREATE_SLICE,
    slice_check.ADMISSION_CHECK_UPDATED,
}
"""The cluster autoscaler's events, which the docs point to on pods, the event types, and
GKE's slice admission check's events (which the operator posts with GKE's reasons)."""
POD_CONDITIONS = {"PodScheduled", "Ready", "ContainersReady", "Initialized"}
"""A pod's own conditions, which the docs name where the operator reads them."""


def vocabulary_problems(text: str) -> Iterator[str]:
    conditions = (
        {str(c) for c in ConditionType} | KUEUE_CONDITIONS | POD_CONDITIONS | SLICE_CHECK_CONDITIONS
    )
    reasons = {str(r) for r in Reason} | {str(p) for p in Phase} | KUEUE_REASONS
    phases = {str(p) for p in Phase}
    for kind, words, pattern in (
        ("condition", conditions, r"\bconditions? `([A-Z]\w+)`"),
        ("condition", conditions, r"`([A-Z]\w+)` conditions?\b"),
        ("condition", conditions, r"`([A-Z]\w+)=(?:True|False)`"),
        ("reason", reasons, r"\breasons? `([A-Z]\w+)`"),
        ("phase", phases, r"\bphases? `([A-Z]\w+)`"),
        ("event", reasons | OTHER_EVENTS, r"\bevents? `([A-Z]\w+)`"),
        ("event", reasons | OTHER_EVENTS, r"`([A-Z]\w+)` events?\b"),
    ):
        for word in re.findall(pattern, text):
            if word not in words:
                yield f"{kind} {word}"


@pytest.mark.parametrize(
    "path",
    [*USER_PATH, DOCS / "contributing" / "design.md"],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_every_condition_reason_and_phase_named_exists(path: Path):
    """On the pages about the operator (localcluster's speaks of the kubelet's reasons)."""
    text = " ".join(line for _, line in page(path).prose)
    problems = sorted(set(vocabulary_problems(text)))
    assert not problems, f"{path.relative_to(REPO)} names unknown {problems}"


# Repository paths

EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".json", ".tpl", ".txt", ".toml", ".sh", ".mod")
TOP_LEVEL = ("bench/", "charts/", "crds/", "docs/", "examples/", "localcluster/", "operator/")
TOP_LEVEL += ("scripts/", "tests/", "worker-image/")
BASES = (
    REPO,
    REPO / "operator" / "tpu_operator",
    REPO / "worker-image" / "tpu_worker",
    REPO / "localcluster",
    REPO / "bench",
    REPO / "charts" / "tpu-operator",
    REPO / "charts" / "tpu-operator" / "templates",
    REPO / "tests",
    REPO / "localcluster" / "gobuild",
)
"""Where a path the docs name may start: the repository, or a package's directory."""
EXTERNAL_PATHS = (
    "jax/",
    "src/xpk/",
    "torch_xla/",
    "tensorflow/",
    "pkg/utils/",
    "main.go",
    "client.h",
    "config/default",
    "/",
    "bench/results/",
)
"""Paths in other projects' repositories (cited as sources), absolute paths, and files
the benchmarks write (not committed)."""
BARE_NAMES = (".py", ".md", ".yaml", ".tpl", ".toml", ".sh", ".mod")
"""The file names a page may name without a directory: found anywhere in the repository
(other bare names, such as a cluster's state.json, are made at run time)."""


def is_path(token: str) -> bool:
    if token.startswith(EXTERNAL_PATHS) or not re.fullmatch(r"[\w./*<>-]+", token):
        return False
    if "<" in token or "*" in token:
        return False
    return token.endswith(EXTENSIONS) or token.startswith(TOP_LEVEL) or token == "Dockerfile"


def path_exists(token: str, near: Path) -> bool:
    token = token.rstrip("/")
    if "/" not in token:
        return not token.endswith(BARE_NAMES) or any(REPO.glob(f"**/{token}"))
    return any((base / token).exists() for base in (near.parent, *BASES))


def module_problem(dotted: str) -> str | None:
    """Why ``tpu_operator.x.y`` (a module, then attributes) does not resolve."""
    parts = dotted.rstrip("()").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return f"{'.'.join(parts[:cut])} has no {attribute}"
            found = getattr(found, attribute)
        return None
    return "no such module"


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_and_module_named_exists(path: Path):
    problems = set()
    for number, token in page(path).spans():
        if is_path(token) and not path_exists(token, path):
            problems.add(f"{token} (line {number})")
        if re.fullmatch(r"tpu_(?:operator|worker)(?:\.\w+)+(?:\(\))?", token):
            problem = module_problem(token)
            if problem:
                problems.add(f"{token} (line {number}: {problem})")
    in_blocks = re.compile(r"(?<![\w/.-])((?:{})[\w./-]*)".format("|".join(TOP_LEVEL)))
    for start, _, text in page(path).blocks:
        for offset, line in enumerate(text.splitlines(), 1):
            for token in in_blocks.findall(line):
                concrete = token.endswith((*EXTENSIONS, "/")) or token.count("/") > 1
                if concrete and is_path(token) and not path_exists(token, path):
                    problems.add(f"{token} (line {start + offset})")
    assert not problems, f"{path.relative_to(REPO)} names missing paths: {sorted(problems)}"


def tracked() -> list[Path]:
    """The repository's own files (as git tracks them): not what a build or a test run
    leaves beside them (build/, bench/results/, .localcluster/)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    return [REPO / name for name in listed.split("\0") if name]


def test_every_docs_page_the_code_names_exists():
    """Comments, help texts and CRD descriptions point into docs/: those pages exist."""
    missing = set()
    for source in tracked():
        if (
            not source.is_file()
            or source.suffix not in (".py", ".yaml", ".tpl", ".txt", ".toml", ".sh", ".json")
            or any(part.startswith(".") for part in source.relative_to(REPO).parts)
        ):
            continue
        for target in re.findall(r"\bdocs/[\w/.-]+\.md", source.read_text(errors="replace")):
            if not (REPO / target).exists():
                missing.add(f"{source.relative_to(REPO)}: {target}")
    assert not missing, sorted(missing)


# Troubleshooting: every reason the operator reports


def reported_reasons() -> set[str]:
    """The reasons the operator's code sets: a member of ``Reason`` used outside
    ``api/status.py``, by name or by value."""
    sources = [
        p.read_text()
        for p in (REPO / "operator" / "tpu_operator").rglob("*.py")
        if p.name != "status.py"
    ]
    code = "\n".join(sources)
    return {
        str(member)
        for name, member in Reason.__members__.items()
        if re.search(rf"\bReason\.{name}\b", code) or f'"{member}"' in code
    }


def troubleshooting_reasons() -> set[str]:
    found = set()
    in_table = False
    for _, line in page(DOCS / "tasks" / "troubleshooting.md").prose:
        if line.startswith("| Reason |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        elif in_table:
            found.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return found


def test_troubleshooting_covers_every_reason_the_operator_reports():
    documented = troubleshooting_reasons()
    reported = reported_reasons()
    assert reported - documented == set(), "docs/tasks/troubleshooting.md lacks these reasons"
    assert documented - reported == set(), "troubleshooting names reasons never reported"


def test_reasons_defined_but_never_reported_are_known():
    """A reason in ``Reason`` that no code sets: listed here, so that one that starts
    being set (or stops) is noticed by the troubleshooting test above."""
    assert {str(r) for r in Reason} - reported_reasons() == {"InPlaceFallback"}


# The pod contract


def contract_pods() -> list[dict[str, Any]]:
    """Worker pods of every kind: single slice, multislice Ironwood, supervised, on-demand
    with a reservation, on a pool GKE creates."""
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, "train-1", "uid")
    template = {"spec": {"containers": [{"name": contract.WORKER_CONTAINER, "image": "w"}]}}
    pods = []
    for short_type, slices, placement, supervision in (
        ("v5litepod-4", 1, NodePlacement(node_pool=None, spot=True), None),
        (
            "tpu7x-16",
            2,
            NodePlacement(node_pool="pool-b", spot=False, reservation="r"),
            Supervision("train-control-" + "a" * 32, "a" * 32),
        ),
        ("v5p-16", 2, NodePlacement(slice_pool="train-1-abc", extra_selector={"a": "b"}), None),
    ):
        shape = catalog.from_short_type(short_type)
        wiring = PodWiring(
            job_name="train",
            service="train",
            slice_name=contract.slice_name("train", slices - 1),
            shape=shape,
            num_slices=slices,
            slice_index=slices - 1,
            worker_index=0,
            attempt=1,
            ports=Ports(),
        )
        pods.append(
            worker_pod(
                namespace="ml",
                wiring=wiring,
                template=template,
                owner=owner,
                placement=placement,
                supervision=supervision,
            )
        )
    return pods


def test_the_pod_contract_lists_every_name_a_worker_pod_gets():
    text = (DOCS / "reference" / "pod-contract.md").read_text()
    names = set()
    for pod in contract_pods():
        spec = pod["spec"]
        names |= set(pod["metadata"]["labels"]) | set(pod["metadata"].get("annotations") or {})
        names |= set(spec["nodeSelector"]) | {t["key"] for t in spec["tolerations"]}
        names |= {v["name"] for v in spec.get("volumes") or []}
        worker = next(c for c in spec["containers"] if c["name"] == contract.WORKER_CONTAINER)
        names |= {e["name"] for e in worker["env"]} | {p["name"] for p in worker["ports"]}
        names |= {m["mountPath"] for m in worker.get("volumeMounts") or []}
        for term in (
            (spec.get("affinity") or {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
        ):
            names |= {e["key"] for e in term["matchExpressions"]}
    missing = sorted(n for n in names if f"`{n}" not in text)
    assert not missing, f"docs/reference/pod-contract.md does not name {missing}"


# The glossary

WELL_KNOWN = {
    "API",
    "CPU",
    "DNS",
    "HTTP",
    "HTTPS",
    "ID",
    "IP",
    "JSON",
    "MB",
    "MiB",
    "GiB",
    "KiB",
    "KB",
    "OCI",
    "TCP",
    "TLS",
    "UID",
    "UTC",
    "VM",
    "VMs",
    "YAML",
    "URL",
    "PID",
    "GPU",
    "RFC",
    "README",
    "GET",
    "POST",
    "PATCH",
    "SHA256",
    "AND",
    "GC",
    "CD",
    "V2",
}
"""Abbreviations any reader of Kubernetes docs knows."""
ABBREVIATION = re.compile(r"\b([A-Z][A-Z0-9]{1,5})s?\b")


def glossary_terms() -> set[str]:
    terms = set()
    for _, line in page(DOCS / "reference" / "glossary.md").prose:
        for term in re.findall(r"\*\*([^*]+)\*\*", line):
            terms.add(term)
            terms.update(re.findall(r"\b[A-Z][A-Z0-9]+\b", term))  # FUSE of Cloud Storage FUSE
        terms.update(re.findall(r"\(([A-Z][A-Za-z ]+)\)", line))
    return terms


def test_the_glossary_explains_the_terms_the_docs_use():
    terms = glossary_terms()
    for term in ("MFU", "DCN", "ICI", "CEL", "Cube", "Fence", "Slice", "Attempt", "Goodput"):
        assert term in terms, f"the glossary does not explain {term}"


@pytest.mark.parametrize("path", USER_PATH, ids=lambda p: str(p.relative_to(REPO)))
def test_every_abbreviation_on_the_users_path_is_in_the_glossary(path: Path):
    terms = glossary_terms()
    unknown = set()
    for number, line in page(path).text_without_code():
        line = re.sub(r"\]\([^)]*\)|https?://\S+", " ", line)
        for word in ABBREVIATION.findall(line):
            if word in terms or word in WELL_KNOWN or word.startswith("SIG"):  # signals
                continue
            if not word.isdigit():
                unknown.add(f"{word} (line {number})")
    assert not unknown, f"{path.relative_to(REPO)}: define in the glossary: {sorted(unknown)}"


# Figures that follow from defaults


def test_the_leader_election_defaults_the_docs_give_are_the_codes():
    """The table of leader election settings, and the failover figure stated with them,
    give the flags' and the chart's defaults."""
    parsers = {
        a.option_strings[0]: a.default
        for sub in docgen._subcommands(cli._parser()).values()
        for a in sub._actions
        if a.option_strings
    }
    values = chart_values()
    rows = 0
    for _, line in page(DOCS / "operations" / "high-availability.md").prose:
        match = re.match(
            r"\| [a-z ]+ \| `(--leader-elect-[a-z-]+)` \| `([\w.]+)` \| (\d+) s \|", line
        )
        if not match:
            continue
        flag, value, default = match[1], match[2], float(match[3])
        assert parsers[flag] == default, f"{flag} defaults to {parsers[flag]}, not {default}"
        node: Any = values
        for part in value.split("."):
            node = node[part]
        assert node == default, f"{value} defaults to {node}, not {default}"
        rows += 1
    assert rows == 3
    defaults = f"{lease.LEASE_DURATION}/{lease.RENEW_DEADLINE:g}/{lease.RETRY_PERIOD:g} s"
    for path in (DOCS / "operations" / "sizing.md", DOCS / "operations" / "high-availability.md"):
        assert defaults in path.read_text(), f"{path.name} does not state the defaults {defaults}"
