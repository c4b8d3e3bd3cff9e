"""One version for the chart, the package and the images (scripts/release.py), the release
tag check and the release notes taken from CHANGELOG.md."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import tpu_operator

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _load_release_module():
    spec = importlib.util.spec_from_file_location("release", REPO / "scripts" / "release.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = _load_release_module()
CHART = REPO / "charts" / "tpu-operator"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of every file that states the version."""
    for name in ("operator/tpu_operator/__init__.py", "CHANGELOG.md", *release.REFERENCE_ROOTS):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp_path / name)
    return tmp_path


def test_the_chart_the_package_and_the_images_state_one_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert release.version() == tpu_operator.__version__ == chart["version"] == chart["appVersion"]
    # The package's version is read from tpu_operator.__version__, not written twice.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "tpu_operator.__version__"
    }
    # The scan finds the docs' and examples' image references it is there to keep in step.
    referenced = {place.path.parts[0] for place in release.places()[3:]}
    assert {"README.md", "docs", "examples"} <= referenced


def test_the_operator_image_follows_the_chart_s_app_version():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"] == {**values["image"], "repository": "ghcr.io/tpu-operator/tpu-operator"}
    assert values["image"]["tag"] == ""
    assert release.image_tag_default((CHART / "values.yaml").read_text()) == ""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert "(default .Chart.AppVersion .Values.image.tag)" in helpers
    # The schema admits the empty default (helm validates values against it).
    tag = json.loads((CHART / "values.schema.json").read_text())["properties"]["image"][
        "properties"
    ]["tag"]
    assert tag["type"] == "string" and tag.get("minLength", 0) == 0 and "pattern" not in tag


@pytest.mark.parametrize(
    ("path", "old", "new", "named"),
    [
        ("charts/tpu-operator/Chart.yaml", 'appVersion: "0', 'appVersion: "9', "chart appVersion"),
        ("charts/tpu-operator/Chart.yaml", "\nversion: 0", "\nversion: 9", "chart version"),
        ("examples/v5e-single-slice.yaml", "tpu-worker:0", "tpu-worker:9", "tpu-worker:9"),
        ("docs/install.md", "REGISTRY/tpu-operator:0", "REGISTRY/tpu-operator:9", "line "),
    ],
)
def test_a_place_that_disagrees_is_named(repo: Path, path: str, old: str, new: str, named: str):
    text = (repo / path).read_text()
    assert old in text
    (repo / path).write_text(text.replace(old, new, 1))
    with pytest.raises(release.ReleaseError) as error:
        release.version(repo)
    assert path in str(error.value) and named in str(error.value)
    assert "scripts/release.py set" in str(error.value)


def test_an_image_tag_default_in_values_is_refused(repo: Path):
    values = repo / "charts/tpu-operator/values.yaml"
    values.write_text(values.read_text().replace('tag: ""', 'tag: "0.0.9"', 1))
    with pytest.raises(release.ReleaseError, match=r"image\.tag defaults to '0\.0\.9'.*appVersion"):
        release.version(repo)


def test_set_writes_every_place(repo: Path):
    before = release.version(repo)
    changed = release.set_version("0.42.0", repo)
    assert release.version(repo) == "0.42.0"
    chart = yaml.safe_load((repo / "charts/tpu-operator/Chart.yaml").read_text())
    assert chart["version"] == "0.42.0" and chart["appVersion"] == "0.42.0"
    assert Path("operator/tpu_operator/__init__.py") in changed
    assert Path("examples/v5p-multislice.yaml") in changed
    assert all(p.version == "0.42.0" for p in release.places(repo))
    assert f"tpu-worker:{before}" not in (repo / "README.md").read_text()
    with pytest.raises(release.ReleaseError, match="not a release version"):
        release.set_version("0.42", repo)


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("0.1.0", "release tags are v"),
        ("v0.1", "not a release version"),
        ("v01.1.0", "not a release version"),
        ("v0.1.0-rc.1", "not a release version"),
        ("v9.9.9", "does not match the version"),
    ],
)
def test_check_tag_refuses(repo: Path, tag: str, message: str):
    _add_release_section(repo, release.version(repo))
    with pytest.raises(release.ReleaseError, match=message):
        release.check_tag(tag, repo)


def test_check_tag_accepts_v_plus_the_version_with_its_changelog_section(repo: Path):
    current = release.version(repo)
    with pytest.raises(release.ReleaseError, match=f"no section for {current}"):
        release.check_tag(f"v{current}", repo)
    _add_release_section(repo, current)
    assert release.check_tag(f"v{current}", repo) == current


def test_a_crd_change_is_not_a_patch_release():
    release.check_bump("v0.1.0", "0.1.1", crds_changed=False)
    release.check_bump("v0.1.3", "0.2.0", crds_changed=True)
    release.check_bump("v0.9.1", "1.0.0", crds_changed=True)
    with pytest.raises(release.ReleaseError, match=r"CRDs changed.*e\.g\. 0\.2\.0"):
        release.check_bump("v0.1.0", "0.1.1", crds_changed=True)
    with pytest.raises(release.ReleaseError, match="not after the previous release"):
        release.check_bump("v0.2.0", "0.1.9", crds_changed=False)
    with pytest.raises(release.ReleaseError, match="not after the previous release"):
        release.check_bump("v0.2.0", "0.2.0", crds_changed=False)


CHANGELOG = """# Changelog

Intro.

## 2026-12-03

### Jobs

- Unreleased change.

## 0.2.0 (2026-12-01)

Summary of 0.2.0.

## 2026-12-01

- Change in 0.2.0.

## 0.1.0 (2026-11-27)

- First release.
"""


def test_release_notes_are_the_version_s_section_of_the_changelog():
    notes = release.notes("0.2.0", CHANGELOG)
    assert notes.startswith("Summary of 0.2.0.")
    assert "- Change in 0.2.0." in notes
    assert "Unreleased change" not in notes and "First release" not in notes
    assert release.notes("0.1.0", CHANGELOG) == "- First release.\n"
    with pytest.raises(release.ReleaseError, match=r"no section for 0\.3\.0"):
        release.notes("0.3.0", CHANGELOG)
    with pytest.raises(release.ReleaseError, match="is empty"):
        release.notes("0.4.0", "## 0.4.0\n\n## 0.3.0\n- x\n")


def test_the_command_line_exits_non_zero_with_the_reason(capsys: pytest.CaptureFixture[str]):
    assert release.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == tpu_operator.__version__
    assert release.main(["check-tag", "v0.0.0-x"]) == 1
    assert "not a release version" in capsys.readouterr().err


def _add_release_section(repo: Path, version: str) -> None:
    changelog = repo / "CHANGELOG.md"
    text = changelog.read_text()
    first_day = text.index("\n## ") + 1
    changelog.write_text(
        text[:first_day] + f"## {version} (2026-11-27)\n\nRelease.\n\n" + text[first_day:]
    )
