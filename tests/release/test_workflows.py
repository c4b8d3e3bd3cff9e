"""The GitHub Actions workflows (.github/workflows/): linted by actionlint (with
shellcheck on every `run:` script), and consistent with the repository: the pinned
actions and their inputs, the tag gate, the images and chart they publish, and the chart
packaging step run here as the release runs it.

Nothing here reaches a registry: the push, sign and release steps are linted and checked
for consistency, not run (docs/contributing/release.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import binaries
from localcluster.helm import CHART, values_file

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
ACTIONS = json.loads((Path(__file__).parent / "actions.json").read_text())["actions"]


def _load_release_module():
    spec = importlib.util.spec_from_file_location("release", REPO / "scripts" / "release.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = _load_release_module()


def _workflow(name: str) -> dict[str, Any]:
    document = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    document["on"] = document.pop(True, document.get("on"))
    return document


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def _runs(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job.get("steps", []))


# -- consistency (unit) ------------------------------------------------------------------


@pytest.mark.unit
def test_every_action_is_pinned_by_commit_with_its_release_named():
    uses = [
        (path.name, match)
        for path in sorted(WORKFLOWS.glob("*.yaml"))
        for match in re.finditer(r"uses:\s*(\S+)(?:\s*#\s*(\S+))?", path.read_text())
    ]
    assert uses
    for name, match in uses:
        ref, comment = match.group(1), match.group(2)
        if ref.startswith("./"):
            assert (REPO / ref).is_file(), f"{name}: {ref} does not exist"
            continue
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), (
            f"{name}: {ref} is not pinned by a full commit SHA"
        )
        assert ref in ACTIONS, (
            f"{name}: {ref} is not in tests/release/actions.json: record the release tag this "
            "commit is and the inputs of its action.yml"
        )
        assert comment == ACTIONS[ref]["version"], (
            f"{name}: {ref} is {ACTIONS[ref]['version']}, the comment says {comment}"
        )


@pytest.mark.unit
def test_every_action_input_is_one_the_action_declares():
    for path in sorted(WORKFLOWS.glob("*.yaml")):
        for step in _steps(_workflow(path.name)):
            ref = step.get("uses", "")
            if not ref or ref.startswith("./"):
                continue
            given = set(step.get("with", {}))
            declared = ACTIONS[ref]
            unknown = given - set(declared["inputs"])
            assert not unknown, f"{path.name}: {ref} has no inputs {sorted(unknown)}"
            missing = set(declared["required"]) - given
            assert not missing, f"{path.name}: {ref} needs {sorted(missing)}"


@pytest.mark.unit
def test_ci_runs_the_test_command_and_can_be_called_by_the_release():
    ci = _workflow("ci.yaml")
    assert {"pull_request", "push", "workflow_call"} <= set(ci["on"])
    assert ci["permissions"] == {"contents": "read"}
    assert "bash .ci/run" in _runs(ci["jobs"]["test"])
    assert "make test" in (REPO / ".ci" / "run").read_text()
    # Go for the newest `go` directive of the wrapper modules the suite builds.
    wanted = max(
        (
            tuple(int(p) for p in re.search(r"^go (\S+)$", mod.read_text(), re.M)[1].split("."))
            for mod in (REPO / "localcluster" / "gobuild").glob("*/go.mod")
        ),
    )
    setup_go = next(s for s in _steps(ci) if s.get("uses", "").startswith("actions/setup-go@"))
    pinned = re.search(
        r"^go (\S+)$", (REPO / setup_go["with"]["go-version-file"]).read_text(), re.M
    )
    assert pinned and tuple(int(p) for p in pinned[1].split(".")) == wanted


@pytest.mark.unit
def test_the_release_runs_on_version_tags_after_the_gate_and_the_tests():
    workflow = _workflow("release.yaml")
    assert workflow["on"] == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}
    assert workflow["permissions"] == {"contents": "read"}
    jobs = workflow["jobs"]
    gate = _runs(jobs["version"])
    assert 'scripts/release.py check-tag "$GITHUB_REF_NAME"' in gate
    assert "scripts/release.py check-bump" in gate and "--crds-changed" in gate
    assert "merge-base --is-ancestor" in gate
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yaml"
    assert set(jobs["images"]["needs"]) == {"version", "test"}
    assert "images" in jobs["chart"]["needs"]
    assert {"images", "chart"} <= set(jobs["release"]["needs"])
    for name, job in jobs.items():
        signs = "cosign sign" in _runs(job)
        assert (job.get("permissions", {}).get("id-token") == "write") == signs, name
        writes = job.get("permissions", {}).get("contents") == "write"
        assert writes == (name == "release"), name


@pytest.mark.unit
def test_the_images_are_the_repository_s_dockerfiles_under_the_names_the_chart_uses():
    workflow = _workflow("release.yaml")
    job = workflow["jobs"]["images"]
    built = {entry["image"]: entry for entry in job["strategy"]["matrix"]["include"]}
    assert set(built) == set(release.IMAGES)
    assert built["tpu-operator"]["dockerfile"] == "Dockerfile"
    assert built["tpu-worker"]["dockerfile"] == "worker-image/Dockerfile"
    for entry in built.values():
        assert (REPO / entry["dockerfile"]).is_file()
    assert set(built["tpu-operator"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    # libtpu, which jax[tpu] installs, is published for x86_64 only.
    assert built["tpu-worker"]["platforms"] == "linux/amd64"
    assert "libtpu==" in (REPO / "requirements" / "worker.txt").read_text()
    assert job["env"]["IMAGE"] == f"{release.REGISTRY}/${{{{ matrix.image }}}}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{release.REGISTRY}/tpu-operator"
    build = _runs(job)
    for flag in ('--file "$DOCKERFILE"', '--platform "$PLATFORMS"', '--tag "$IMAGE:$VERSION"'):
        assert flag in build
    assert "--sbom=true" in build and "--push" in build
    assert 'cosign sign --yes "$IMAGE@$DIGEST"' in build


@pytest.mark.unit
def test_the_images_are_built_from_their_base_resolved_to_a_digest(tmp_path: Path):
    job = _workflow("release.yaml")["jobs"]["images"]
    names = [step.get("name", "") for step in job["steps"]]
    resolve = job["steps"][names.index("Resolve the base image to its digest")]
    build = job["steps"][names.index("Build and push, with SBOM and provenance attestations")]
    assert names.index(resolve["name"]) < names.index(build["name"])
    assert 'release.py base-image "$DOCKERFILE"' in resolve["run"]
    assert "docker buildx imagetools inspect" in resolve["run"]
    assert 'release.py pin-base "$DOCKERFILE" "$digest"' in resolve["run"]
    assert build["env"]["BASE_PINNED"] == "${{ steps.base.outputs.pinned }}"
    assert '--build-arg "PYTHON_IMAGE=$BASE_PINNED"' in build["run"]
    assert '--label "org.opencontainers.image.base.digest=$BASE_DIGEST"' in build["run"]
    # Both Dockerfiles start every stage FROM the argument the release sets.
    for entry in job["strategy"]["matrix"]["include"]:
        dockerfile = REPO / entry["dockerfile"]
        assert release.base_image(dockerfile) == "python:3.11-slim-bookworm"
        stages = re.findall(r"(?m)^FROM\s+(\S+)", dockerfile.read_text())
        assert stages and set(stages) == {"${PYTHON_IMAGE}"}, dockerfile
    digest = "sha256:" + "ab" * 32
    pinned = release.pin_base(REPO / "Dockerfile", digest)
    assert pinned == f"python:3.11-slim-bookworm@{digest}"
    for bad in ("", "sha256:abc", "md5:" + "0" * 64, digest.upper()):
        with pytest.raises(release.ReleaseError, match="expected sha256:<64 hex digits>"):
            release.pin_base(REPO / "Dockerfile", bad)
    by_tag = tmp_path / "Dockerfile"
    by_tag.write_text("FROM python:3.11-slim-bookworm\n")
    with pytest.raises(release.ReleaseError, match=r"expected one `ARG PYTHON_IMAGE="):
        release.base_image(by_tag)


@pytest.mark.unit
def test_the_chart_goes_to_the_registry_the_readme_installs_from():
    workflow = _workflow("release.yaml")
    assert workflow["env"]["REGISTRY"] == release.REGISTRY
    chart = _runs(workflow["jobs"]["chart"])
    # The helm the tests use, built with the same flags (its default Kubernetes version
    # decides whether `helm lint` accepts the chart's kubeVersion).
    assert "$(python3 scripts/release.py helm)" in chart
    assert "helm lint --strict charts/tpu-operator" in chart
    assert "helm package charts/tpu-operator --destination dist" in chart
    assert 'helm push "dist/tpu-operator-$VERSION.tgz" "oci://$REGISTRY/charts"' in chart
    assert 'cosign sign --yes "$REGISTRY/charts/tpu-operator@$DIGEST"' in chart
    readme = (REPO / "README.md").read_text()
    assert re.search(
        rf"helm install tpu-operator {re.escape(release.CHART_OCI)} --version "
        rf"{re.escape(release.version())}\b",
        readme,
    )
    notes = _runs(workflow["jobs"]["release"])
    assert 'scripts/release.py notes "$VERSION"' in notes
    assert "gh release create" in notes


# -- linted and run offline (integration) ---------------------------------------------


def _shellcheck() -> str:
    """shellcheck from Debian's package (actionlint runs it on every `run:` script)."""
    found = shutil.which("shellcheck")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck, then run again")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq",
         "--no-install-recommends", "shellcheck"],
    ):  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, env=environment)
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"
    found = shutil.which("shellcheck")
    assert found
    return found


def _actionlint(cwd: Path, *files: str) -> subprocess.CompletedProcess[str]:
    binary = binaries.ensure(binaries.ACTIONLINT)["actionlint"]
    return subprocess.run(
        [str(binary), f"-shellcheck={_shellcheck()}", "-pyflakes=", "-no-color", *files],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_the_workflows_pass_actionlint_and_shellcheck(tmp_path: Path):
    result = _actionlint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    # The same linter, on a copy with two faults, reports both: the check can fail.
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    broken = (WORKFLOWS / "release.yaml").read_text()
    broken = broken.replace("needs: [version, images, chart]", "needs: [version, image, chart]")
    broken = broken.replace('test -n "$digest"', "test -n $digest")
    (tmp_path / ".github" / "workflows" / "release.yaml").write_text(broken)
    shutil.copy2(WORKFLOWS / "ci.yaml", tmp_path / ".github" / "workflows" / "ci.yaml")
    result = _actionlint(tmp_path, ".github/workflows/release.yaml", ".github/workflows/ci.yaml")
    assert result.returncode == 1
    assert 'job "release" needs job "image" which does not exist' in result.stdout
    assert "SC2086" in result.stdout


@pytest.mark.integration
def test_the_chart_packages_as_the_release_pushes_it(tmp_path: Path):
    helm = str(binaries.ensure(binaries.HELM)["helm"])
    # The release workflow's way to the same binary.
    assert str(release.helm()) == helm
    version = release.version()

    def run(*args: str) -> str:
        result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout

    run("lint", "--strict", str(CHART))
    run("package", str(CHART), "--destination", str(tmp_path))
    archive = tmp_path / f"tpu-operator-{version}.tgz"
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]
    with tarfile.open(archive) as tar:
        member = tar.extractfile("tpu-operator/Chart.yaml")
        assert member
        chart = yaml.safe_load(member.read())
        names = tar.getnames()
    assert chart["version"] == chart["appVersion"] == version
    assert "tpu-operator/values.schema.json" in names
    assert {f"tpu-operator/crds/{p.name}" for p in (CHART / "crds").iterdir()} <= set(names)

    def operator_image(*values: str) -> str:
        out = run("template", "tpu-operator", str(archive), "--namespace", "tpu-system", *values)
        deployment = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    assert operator_image() == f"{release.REGISTRY}/tpu-operator:{version}"
    custom = values_file({"image": {"repository": "registry.example/op", "tag": "sha-1"}})
    assert operator_image("--values", custom) == "registry.example/op:sha-1"
