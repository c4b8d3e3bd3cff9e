"""The product's images, built from their Dockerfiles (localcluster.images: buildah, vfs,
a stand-in base made from Debian's packages) and run with podman and runc.

The operator image's entry point starts and prints its version, it writes the CRDs of
crds/ byte for byte, and it runs as its non-root user; the end-to-end tier runs it
against the local cluster (tests/e2e). The worker image trains the demo model for a few
steps on CPU and serves its metrics, as its non-root user. The image of examples/own-code,
built FROM the worker image, runs its training module through `tpu-worker run -m` and
checkpoints as the worker's user to a directory that user owns.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import images
from localcluster.prometheus import free_port
from localcluster.testing import wait_until
from tests.worker.scrape import scrape
from tpu_operator import __version__, contract, worker_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def operator_image() -> images.ImageConfig:
    return images.ensure(images.OPERATOR)


@pytest.fixture(scope="module")
def worker_image() -> images.ImageConfig:
    return images.ensure(images.TESTED_WORKER)


def run(image: images.ImageConfig, *args: str, **options) -> subprocess.CompletedProcess[str]:
    argv = [*images.podman_command(), *images.run_arguments(image, list(args), **options)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_operator_entry_point_prints_its_version(operator_image):
    # A plain `podman run IMAGE ARGS`: podman itself applies the image's user, environment
    # and entry point (a container of its own, copied from the image by vfs).
    result = subprocess.run(
        [
            *images.podman_command(),
            "run",
            "--rm",
            *images.ulimits(),
            operator_image.reference,
            "version",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __version__


def test_operator_image_writes_the_committed_crds(operator_image):
    result = run(operator_image, "crds")
    assert result.returncode == 0, result.stderr
    documents = re.split(r"(?m)^---\n", result.stdout)
    committed = [path.read_text() for path in sorted((REPO / "crds").glob("*.yaml"))]
    assert sorted(documents) == committed


@pytest.mark.parametrize(
    ("fixture", "uid"), [("operator_image", "65532"), ("worker_image", "10001")]
)
def test_images_run_as_their_non_root_user(request, fixture, uid):
    image: images.ImageConfig = request.getfixturevalue(fixture)
    assert not image.runs_as_root, image.user
    result = run(image, "-c", "id -u; id -g; touch /opt/venv/x", entrypoint=["sh"])
    lines = result.stdout.split()
    assert lines[:2] == [uid, uid], result
    # The root filesystem is the image's own, read-only.
    assert "Read-only file system" in result.stderr


def one_process_env(metrics_port: int) -> dict[str, str]:
    """The pod contract of a one-process job on this machine, JAX told to use the CPU."""
    return {
        "JAX_PLATFORMS": "cpu",
        contract.ENV_TPU_WORKER_ID: "0",
        contract.ENV_TPU_WORKER_HOSTNAMES: "localhost",
        contract.ENV_JAX_COORDINATOR_ADDRESS: f"127.0.0.1:{free_port()}",
        contract.ENV_PROCESS_ID: "0",
        contract.ENV_NUM_PROCESSES: "1",
        contract.ENV_POD_IP: "127.0.0.1",
        contract.ENV_METRICS_PORT: str(metrics_port),
    }


@pytest.fixture
def demo(worker_image) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = one_process_env(port)
    argv = [
        *images.podman_command(),
        *images.run_arguments(
            worker_image,
            ["demo", "--steps", "5", "--log-every", "1", "--metrics-linger", "120"],
            env=env,
        ),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield process, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_worker_image_trains_the_demo_and_serves_metrics(demo):
    process, port = demo
    url = f"http://127.0.0.1:{port}/metrics"

    def trained() -> float | None:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        step = scrape(url, timeout_s=5).value(worker_metrics.STEP)
        return step if step >= 5 else None

    assert wait_until(trained, timeout=240, message="5 demo steps in the worker image") == 5
    metrics = scrape(url)
    assert metrics.value(worker_metrics.STEPS_TOTAL) == 5
    process.terminate()
    output, _ = process.communicate(timeout=60)
    assert re.search(r"step 5 loss \S+", output), output


@pytest.fixture(scope="module")
def own_code_image(worker_image) -> images.ImageConfig:
    return images.ensure_derived(images.OWN_CODE)


def test_own_code_image_trains_its_module_and_checkpoints_as_the_worker(
    own_code_image, worker_image, tmp_path
):
    # FROM the worker image: one layer more, the same user and entry point.
    assert own_code_image.layers == worker_image.layers + 1
    assert own_code_image.user == worker_image.user == "10001:10001"
    assert own_code_image.entrypoint == worker_image.entrypoint == ("tpu-worker",)
    assert own_code_image.cmd == ("run", "-m", "my_trainer.train")
    # The checkpoint volume as the examples give it to the worker: owned by UID/GID 10001.
    volume = tmp_path / "checkpoints"
    volume.mkdir()
    os.chown(volume, 10001, 10001)
    port = free_port()
    env = one_process_env(port)
    args = [
        *own_code_image.cmd,  # the image's own command, then the module's flags
        "--steps=5",
        "--log-every=1",
        "--checkpoint-every=5",
        "--checkpoint-dir=/checkpoints/own-code",
    ]
    result = run(own_code_image, *args, env=env, binds=[images.Bind(str(volume), "/checkpoints")])
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "starting at step 0 of 5" in output and re.search(r"step 5 loss \S+", output), output
    [saved] = (volume / "own-code").glob("step_*.npz")
    assert saved.name == "step_00000005.npz"
    assert (saved.stat().st_uid, saved.stat().st_gid) == (10001, 10001)
