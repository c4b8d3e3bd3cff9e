"""Pure parts of the demo trainer: the mesh it builds for a world, the slices it reads
from the pod env, the names of its checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_operator import contract
from tpu_worker.demo import checkpoint
from tpu_worker.demo.options import DemoOptions, ModelConfig
from tpu_worker.demo.train import mesh_shape, slices_from_env

pytestmark = pytest.mark.unit

MODEL = ModelConfig(vocab=256, d_model=128, heads=4, d_ff=512, layers=2, seq_len=64)
OPTIONS = DemoOptions(model=MODEL)


@pytest.mark.parametrize(
    ("devices", "slices", "shape"),
    [
        (4, 2, (2, 2)),  # 2 slices x 2 devices: data across slices, model within one
        (2, 1, (1, 2)),  # the same job on one slice
        (4, 1, (2, 2)),
        (2, 2, (2, 1)),  # one device per slice: the model axis never spans two slices
        (8, 2, (4, 2)),
        (1, 1, (1, 1)),
    ],
)
def test_the_model_axis_stays_within_a_slice(
    devices: int, slices: int, shape: tuple[int, int]
) -> None:
    data, model = mesh_shape(OPTIONS, devices, slices)
    assert (data, model) == shape
    assert (devices // slices) % model == 0 and data * model == devices


def test_a_mesh_that_cannot_be_built_says_why() -> None:
    with pytest.raises(SystemExit, match="4 devices do not split into 3 equal slices"):
        mesh_shape(OPTIONS, 4, 3)
    wide = DemoOptions(model=MODEL, model_parallel=4)
    with pytest.raises(SystemExit, match="--model-parallel 4 does not divide the 2 devices"):
        mesh_shape(wide, 4, 2)
    odd = DemoOptions(model=MODEL, batch_size=6)
    with pytest.raises(SystemExit, match="--batch-size 6 is not a multiple of 4"):
        mesh_shape(odd, 8, 2)


def test_slices_come_from_the_pod_env_of_each_start() -> None:
    assert slices_from_env({}) == 1
    assert slices_from_env({contract.ENV_NUM_SLICES: "3"}) == 3
    both = {contract.ENV_MEGASCALE_NUM_SLICES: "2", contract.ENV_NUM_SLICES: "2"}
    assert slices_from_env(both) == 2
    assert (
        slices_from_env({contract.ENV_MEGASCALE_NUM_SLICES: "", contract.ENV_NUM_SLICES: "1"}) == 1
    )
    with pytest.raises(SystemExit, match="MEGASCALE_NUM_SLICES='x' is not a number of slices"):
        slices_from_env({contract.ENV_MEGASCALE_NUM_SLICES: "x"})
    with pytest.raises(SystemExit, match="TPU_OPERATOR_NUM_SLICES='0'"):
        slices_from_env({contract.ENV_NUM_SLICES: "0"})


def test_only_committed_steps_count_as_saved(tmp_path: Path) -> None:
    for name in ("step_00000004", "step_00000012", "step_00000016.orbax-checkpoint-tmp-7"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_00000020").write_text("not a directory")
    assert checkpoint.saved_steps(tmp_path) == [4, 12]
    assert checkpoint.step_path(tmp_path, 12) == tmp_path / "step_00000012"
    assert checkpoint.saved_steps(tmp_path / "missing") == []
