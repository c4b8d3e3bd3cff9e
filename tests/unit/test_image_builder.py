"""localcluster.images, the pure parts: base images of the Dockerfiles, the local stand-in
for them, what keys a built image, and the podman arguments that run one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from localcluster import images

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", [images.OPERATOR, images.WORKER], ids=lambda s: s.name)
def test_each_dockerfile_starts_from_a_base_with_a_stand_in(spec):
    bases = images.base_images((REPO / spec.dockerfile).read_text())
    assert bases == ["python:3.11-slim-bookworm"]
    recipe = images.stand_in(bases[0])
    assert (recipe.image, recipe.suite, recipe.python) == (
        "docker.io/library/python:3.11-slim-bookworm",
        "bookworm",
        "3.11",
    )
    args = recipe.mmdebstrap_args(Path("/out.tar"))
    assert "bookworm" in args and "/out.tar" in args
    assert any(a.startswith("--include=") and "python3-venv" in a for a in args)
    assert "deb http://deb.debian.org/debian-security bookworm-security main" in args


def test_base_images_skip_earlier_stages_and_flags():
    text = (
        "FROM --platform=$BUILDPLATFORM python:3.11-slim-bookworm AS build\n"
        "RUN true\n"
        "FROM build AS test\n"
        "from gcr.io/distroless/python3@sha256:abc\n"
    )
    assert images.base_images(text) == [
        "python:3.11-slim-bookworm",
        "gcr.io/distroless/python3@sha256:abc",
    ]


def test_from_takes_global_args_and_the_build_s_values_for_them():
    text = (
        "ARG PYTHON_IMAGE=python:3.11-slim-bookworm\n"
        "FROM ${PYTHON_IMAGE} AS build\n"
        "ARG PYTHON_IMAGE\n"  # inside a stage: not a global argument
        "FROM $PYTHON_IMAGE\n"
    )
    assert images.base_images(text) == ["python:3.11-slim-bookworm"]
    pinned = "python:3.11-slim-bookworm@sha256:" + "0" * 64
    assert images.base_images(text, {"PYTHON_IMAGE": pinned}) == [pinned]
    with pytest.raises(images.ImageError, match=r"\$OTHER is not a global ARG"):
        images.base_images("FROM $OTHER\n")


def test_no_stand_in_without_debian_s_python_of_that_minor():
    with pytest.raises(images.ImageError, match=r"Debian bookworm does not ship Python 3\.12"):
        images.stand_in("python:3.12-slim-bookworm")
    with pytest.raises(
        images.ImageError, match=re.escape("only python:<major.minor>-slim-<debian release>")
    ):
        images.stand_in("gcr.io/distroless/python3")
    assert images.stand_in("python:3.13-slim-trixie").suite == "trixie"


@pytest.mark.parametrize(
    ("short", "full"),
    [
        ("python:3.11-slim-bookworm", "docker.io/library/python:3.11-slim-bookworm"),
        ("bitnami/python:3", "docker.io/bitnami/python:3"),
        ("ghcr.io/org/img:1", "ghcr.io/org/img:1"),
        ("localhost/tpu-operator:abc", "localhost/tpu-operator:abc"),
        ("python:3.11@sha256:00", "docker.io/library/python:3.11"),
    ],
)
def test_qualified_names(short, full):
    assert images.qualified(short) == full


def _copy_sources(target: Path) -> Path:
    for name in (*images.SOURCES, "Dockerfile", ".dockerignore"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_an_image_is_rebuilt_when_an_input_changes_and_only_then(tmp_path):
    repo = _copy_sources(tmp_path)
    first = images.image_digest(images.OPERATOR, "sha256:base", repo)
    # Byte-compiled files and build metadata are not inputs (.dockerignore leaves them out).
    (repo / "operator" / "tpu_operator" / "__pycache__").mkdir(exist_ok=True)
    (repo / "operator" / "tpu_operator" / "__pycache__" / "x.pyc").write_bytes(b"x")
    (repo / "operator" / "tpu_operator.egg-info").mkdir()
    (repo / "operator" / "tpu_operator.egg-info" / "PKG-INFO").write_text("x")
    assert images.image_digest(images.OPERATOR, "sha256:base", repo) == first
    # Another base, other build arguments, a changed lock file or source: another image.
    assert images.image_digest(images.OPERATOR, "sha256:other", repo) != first
    assert images.image_digest(images.WORKER, "sha256:base", repo) != images.image_digest(
        images.WORKER_CPU, "sha256:base", repo
    )
    lock = repo / "requirements" / "operator.txt"
    lock.write_text(lock.read_text() + "\n")
    second = images.image_digest(images.OPERATOR, "sha256:base", repo)
    assert second != first
    (repo / "operator" / "tpu_operator" / "cli.py").write_text("# changed\n")
    assert images.image_digest(images.OPERATOR, "sha256:base", repo) != second


def test_a_derived_image_is_keyed_by_its_own_directory_and_its_base(tmp_path):
    spec = images.OWN_CODE
    context = tmp_path / spec.context
    shutil.copytree(REPO / spec.context, context, ignore=shutil.ignore_patterns("__pycache__"))
    first = images.derived_digest(spec, "sha256:worker", tmp_path)
    (context / "my_trainer" / "__pycache__").mkdir()
    (context / "my_trainer" / "__pycache__" / "train.pyc").write_bytes(b"x")
    assert images.derived_digest(spec, "sha256:worker", tmp_path) == first
    assert images.derived_digest(spec, "sha256:rebuilt-worker", tmp_path) != first
    (context / "my_trainer" / "train.py").write_text("# changed\n")
    assert images.derived_digest(spec, "sha256:worker", tmp_path) != first
    # Its Dockerfile starts from the image its build argument names.
    dockerfile = (context / "Dockerfile").read_text()
    assert re.search(rf"(?m)^ARG {spec.base_arg}=ghcr.io/tpu-operator/tpu-worker:", dockerfile)
    built_from = images.base_images(dockerfile, {spec.base_arg: "localhost/tpu-worker:abc"})
    assert built_from == ["localhost/tpu-worker:abc"]


INSPECT = {
    "Id": "sha256:1234",
    "Size": 369_000_000,
    "RootFS": {"Layers": ["sha256:a", "sha256:b"]},
    "Config": {
        "User": "65532:65532",
        "Env": ["PATH=/opt/venv/bin:/usr/bin", "PYTHONUNBUFFERED=1"],
        "Entrypoint": ["tpu-operator"],
        "Cmd": ["run"],
        "WorkingDir": "",
        "Labels": {"org.opencontainers.image.title": "tpu-operator"},
    },
}


def test_image_config_from_inspect():
    config = images.ImageConfig.from_inspect("localhost/x:1", INSPECT, Path("/layer"))
    assert config.entrypoint == ("tpu-operator",) and config.cmd == ("run",)
    assert config.workdir == "/" and config.layers == 2 and not config.runs_as_root
    root = images.ImageConfig.from_inspect(
        "localhost/y:1", {**INSPECT, "Config": {**INSPECT["Config"], "User": ""}}, Path("/l")
    )
    assert root.runs_as_root
    assert "369 MB\t2 layers\tuser 65532:65532" in images.report(config)


def test_run_arguments_start_the_image_as_a_runtime_would():
    config = images.ImageConfig.from_inspect("localhost/x:1", INSPECT, Path("/layer"))
    argv = images.run_arguments(
        config,
        ["version"],
        binds=[images.Bind("/tmp", "/tmp"), images.Bind("/etc/key", "/etc/key", read_only=True)],
        env={"A": "1"},
        env_from_host=["POD_IP"],
        name="op-$(POD_NAME)",
        labels={"k": "v"},
    )
    assert argv[:5] == ["run", "--rm", "--read-only", "--network=host", "--uts=host"]
    assert "--user=65532:65532" in argv and "--workdir=/" in argv
    assert "--env=PATH=/opt/venv/bin:/usr/bin" in argv and "--env=A=1" in argv
    assert "--env=POD_IP" in argv and "--label=k=v" in argv
    assert "--name=op-$(POD_NAME)" in argv and "--replace" in argv
    assert "--volume=/tmp:/tmp:rw" in argv and "--volume=/etc/key:/etc/key:ro" in argv
    assert any(a.startswith("--ulimit=nofile=") for a in argv)
    # The image's root, its entry point, then the arguments in place of its command.
    assert argv[-4:] == ["--rootfs", "/layer", "tpu-operator", "version"]
    assert images.run_arguments(config)[-2:] == ["tpu-operator", "run"]


def test_pod_run_arguments_pass_the_pod_s_mounts_token_and_env_into_the_container():
    config = images.ImageConfig.from_inspect("localhost/x:1", INSPECT, Path("/layer"))
    container = {
        "name": "operator",
        "env": [{"name": "POD_NAME"}, {"name": "POD_IP"}],
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "key", "mountPath": "/etc/tpu-operator/control", "readOnly": True},
        ],
    }
    argv = images.pod_run_arguments(config, container, Path("/c/cluster"))
    assert "--volume=/tmp:/tmp:rw" in argv
    assert "--volume=/etc/tpu-operator/control:/etc/tpu-operator/control:ro" in argv
    token = images.SERVICE_ACCOUNT_DIR
    assert f"--volume={token}:{token}:ro" in argv
    for name in ("POD_NAME", "POD_IP", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        assert f"--env={name}" in argv
    assert "--name=operator-$(POD_NAME)" in argv
    assert f"--label={images.LABEL_CLUSTER}=/c/cluster" in argv
    # The entry point without the image's command: the pod template's args follow.
    assert argv[-3:] == ["--rootfs", "/layer", "tpu-operator"]
    unnamed = images.pod_run_arguments(config, {"name": "w"}, Path("/c"))
    assert not [a for a in unnamed if a.startswith("--name")]
