"""The pods of an elastic job running on fewer slices: their world is the slices that
run (``builders/wiring.py``, ``builders/slices.py``)."""

from __future__ import annotations

import pytest

from tpu_operator import contract
from tpu_operator.builders.pods import Owner
from tpu_operator.builders.slices import job_slice, slice_patch
from tpu_operator.builders.wiring import PodWiring, resolved_env
from tpu_operator.catalog import from_short_type

pytestmark = pytest.mark.unit

SHAPE = from_short_type("v5p-16")  # 2 hosts


def env_of(slice_index: int, worker: int, world: tuple[int, ...]) -> dict[str, str]:
    wiring = PodWiring(
        job_name="train",
        service="train",
        slice_name=contract.slice_name("train", slice_index),
        shape=SHAPE,
        num_slices=3,
        slice_index=slice_index,
        worker_index=worker,
        attempt=4,
        world=world,
    )
    return resolved_env(wiring, "10.0.0.1")


@pytest.mark.parametrize(
    ("world", "slice_index", "worker", "slices", "slice_id", "process", "processes", "leader"),
    [
        # All three slices: the usual wiring.
        ((), 2, 1, "3", "2", "5", "6", "train-0-0"),
        # Slice 1 dropped: slice 2 is the second of two.
        ((0, 2), 2, 1, "2", "1", "3", "4", "train-0-0"),
        ((0, 2), 0, 1, "2", "0", "1", "4", "train-0-0"),
        # Slice 0 dropped: the coordinator moves to slice 1's worker 0.
        ((1, 2), 1, 0, "2", "0", "0", "4", "train-1-0"),
        ((1, 2), 2, 1, "2", "1", "3", "4", "train-1-0"),
    ],
)
def test_the_world_of_the_slices_that_run(
    world, slice_index, worker, slices, slice_id, process, processes, leader
):
    env = env_of(slice_index, worker, world)
    assert env[contract.ENV_MEGASCALE_NUM_SLICES] == slices
    assert env[contract.ENV_MEGASCALE_SLICE_ID] == slice_id
    assert env[contract.ENV_NUM_SLICES] == slices
    assert env[contract.ENV_SLICE_INDEX] == slice_id
    assert env[contract.ENV_PROCESS_ID] == process
    assert env[contract.ENV_NUM_PROCESSES] == processes
    assert env[contract.ENV_JAX_COORDINATOR_ADDRESS].startswith(f"{leader}.train:")
    assert env[contract.ENV_MEGASCALE_COORDINATOR_ADDRESS] == f"{leader}.train"
    # Each pod keeps its own name and peers: only the world changes.
    assert env[contract.ENV_POD_NAME] == f"train-{slice_index}-{worker}"


def test_one_slice_left_is_no_multislice_world():
    env = env_of(2, 0, (2,))
    assert contract.ENV_MEGASCALE_NUM_SLICES not in env
    assert env[contract.ENV_NUM_PROCESSES] == "2" and env[contract.ENV_PROCESS_ID] == "0"


def test_a_slice_carries_its_world_and_drops_it_at_full_size():
    owner = Owner(contract.API_VERSION, contract.JOB_KIND, "train", "u")
    spec = {
        "slice": {"type": "v5p-16"},
        "numSlices": 3,
        "template": {"spec": {"containers": [{"name": "worker", "image": "w"}]}},
    }

    def build(world: list[int] | None) -> dict:
        return job_slice(
            job_name="train",
            namespace="ml",
            job_spec=spec,
            index=2,
            attempt=3,
            owner=owner,
            node_pool="p2",
            not_before=None,
            suspend=False,
            world=world,
        )

    smaller = build([0, 2])
    assert smaller["spec"]["worldSlices"] == [0, 2]
    full = build(None)
    assert "worldSlices" not in full["spec"]
    assert slice_patch(full, smaller) == {"spec": {"worldSlices": None}}
    assert slice_patch(smaller, full) == {"spec": {"worldSlices": [0, 2]}}
