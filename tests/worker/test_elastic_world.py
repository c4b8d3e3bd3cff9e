"""A job that loses a slice and gets it back, as real JAX processes under supervisors.

Four supervised pods (2 slices x 2 hosts, wired and isolated like pods, ``launch``) run
the demo; the test is the operator (signed control commands, ``test_supervisor.call``).
Attempt 1 trains on both slices and checkpoints when stopped; attempt 2 starts on slice
1's pods alone, with the env of a one-slice world (``world_env``: new process ids and
count, slice 1 as slice 0, its worker 0 the coordinator, no Megascale variables), and
resumes from that checkpoint; attempt 3 starts on all four with the two-slice env again
and resumes from attempt 2's checkpoint. Each resume must restore exactly the saved state
(the same step; a digest of every parameter and optimizer value, logged by the trainer
and recomputed here from the checkpoint with Orbax) into the new world's mesh.
"""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.worker import launch
from tests.worker.test_supervisor import KEY, call, status, until
from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator.builders.wiring import PodWiring, world_env
from tpu_worker.demo import checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not launch.can_isolate(), reason="needs root and unshare (pod isolation)"),
]

STARTUP_S = 400.0  # rendezvous + compile of 4 processes on 2 busy cores
STOP_GRACE_S = 120.0
DEMO = (
    "demo",
    "--steps",
    "100000",
    "--log-every",
    "1",
    "--init-timeout",
    "240",
    "--step-sleep",
    "0.2",
    "--checkpoint-every",
    "1000",
    "--keep-checkpoints",
    "10",
    "--log-state-digest",
)


def supervised(tmp_path: Path) -> dict[str, str]:
    key_file = tmp_path / "control-key"
    key_file.write_bytes(KEY)
    return {
        contract.ENV_CONTROL_PORT: str(contract.DEFAULT_CONTROL_PORT),
        contract.ENV_CONTROL_KEY_FILE: str(key_file),
        contract.ENV_CONTROL_KEY_ID: sv.key_id(KEY),
        # Slice 0's supervisors wait out attempt 2 for the start of attempt 3.
        contract.ENV_SUPERVISOR_WAIT: "3600",
        contract.ENV_WORKER_TERMINATION_GRACE: str(STOP_GRACE_S - 10),
    }


def digest_logged(pod: launch.Pod, step: int) -> str:
    found = re.findall(rf"state digest at step {step}: ([0-9a-f]+)", pod.log())
    assert found, pod.log()
    return found[-1]


def saved_at_stop(pods: list[launch.Pod], attempt: int) -> int:
    """The step the stopped attempt saved at: one step, agreed by all its processes."""
    steps = set()
    for pod in pods:
        text = pod.log().split(f"started the training process of attempt {attempt}")[-1]
        found = re.findall(r"stopping at step (\d+) on request", text)
        assert found, pod.log()
        steps.add(int(found[-1]))
    assert len(steps) == 1, steps
    return steps.pop()


def digest_on_disk(directory: Path, step: int) -> str:
    """The digest of a checkpoint's state, read here (one process, one device) with Orbax:
    an independent reader of what the trainers wrote."""
    import jax
    import orbax.checkpoint as ocp

    from tpu_worker.demo import model
    from tpu_worker.demo.options import DemoOptions, ModelConfig

    config = DemoOptions(model=ModelConfig()).model
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def init(key: jax.Array) -> dict[str, Any]:
        params = model.init_params(config, key)
        return {"params": params, "opt": model.init_opt(params)}

    shapes = jax.eval_shape(init, jax.random.key(0))
    abstract = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes
    )
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(checkpoint.step_path(directory, step) / checkpoint.STATE, abstract)
    return checkpoint.digest(state)


def start(pods: list[launch.Pod], world: list[PodWiring], attempt: int) -> None:
    for pod, wiring in zip(pods, world, strict=True):
        env = world_env(dataclasses.replace(wiring, attempt=attempt))
        code, body, _ = call(pod, "POST", sv.START_PATH, {"attempt": attempt, "env": env})
        assert code == 200 and (body["state"], body["attempt"]) == ("running", attempt), body


def stop(pods: list[launch.Pod], attempt: int, gang: launch.Gang) -> None:
    request = {"attempt": attempt, "grace_seconds": STOP_GRACE_S}
    # All at once, as the operator sends them (bounded concurrency): one at a time, on a
    # loaded machine, process 0 could save at the agreed step and exit, taking the
    # coordination service with it, while a peer's stop was still on its way.
    with ThreadPoolExecutor(len(pods)) as pool:
        codes = list(pool.map(lambda pod: call(pod, "POST", sv.STOP_PATH, request)[0], pods))
    assert codes == [200] * len(pods), codes
    until(
        f"attempt {attempt} stopped",
        lambda: all(status(p)["state"] == "exited" for p in pods),
        STOP_GRACE_S + 30,
        gang,
    )
    for pod in pods:
        assert status(pod)["exit_code"] == contract.EXIT_RETRYABLE, gang.logs()


def resumed(pod: launch.Pod, attempt: int) -> tuple[int, str, str]:
    """(step, digest, mesh line) of the given attempt's resume in a pod's log."""
    text = pod.log().split(f"started the training process of attempt {attempt}")[-1]
    step = re.search(r"resumed from checkpoint at step (\d+)", text)
    mesh = re.search(r"mesh data=\d+ x model=\d+ over \d+ processes in \d+ slice\(s\)", text)
    assert step and mesh, pod.log()
    found = re.search(rf"state digest at step {step.group(1)}: ([0-9a-f]+)", text)
    assert found, pod.log()
    return int(step.group(1)), found.group(1), mesh.group(0)


def test_a_job_shrinks_to_one_slice_and_grows_back_resuming_each_time(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    two_slices = launch.wirings(topology="2x4", num_slices=2, attempt=1)  # 4 processes
    slice_1 = two_slices[2:]
    one_slice = [  # slice 1's two pods, now the only slice: slice 0 of 1
        dataclasses.replace(w, num_slices=1, slice_index=0, slice_names=(w.slice_name,))
        for w in slice_1
    ]
    argv = launch.worker_command(*DEMO, "--checkpoint-dir", str(directory))
    with launch.gang(two_slices, tmp_path / "pods", supervised(tmp_path)) as gang:
        gang.start(argv)
        pods = gang.pods
        kept = pods[2:]

        # Attempt 1 on 2 slices x 2 processes; stopped, it saves at one agreed step.
        for pod in pods:
            gang.wait_for_log(pod, "step 3 loss", STARTUP_S)
        assert "mesh data=2 x model=2 over 4 processes in 2 slice(s)" in pods[0].log()
        stop(pods, 1, gang)
        first = saved_at_stop(pods, 1)
        assert checkpoint.saved_steps(directory) == [first]
        saved = digest_logged(pods[0], first)
        assert {digest_logged(p, first) for p in pods} == {saved}
        assert digest_on_disk(directory, first) == saved

        # Attempt 2 on slice 1 alone: 1 slice x 2 processes, slice 1's worker 0 the
        # coordinator; the same step and state, in the new mesh.
        start(kept, one_slice, 2)
        for pod in kept:
            gang.wait_for_log(pod, f"step {first + 2} loss", STARTUP_S)
        for pod in kept:
            assert resumed(pod, 2) == (
                first,
                saved,
                "mesh data=1 x model=2 over 2 processes in 1 slice(s)",
            )
            assert "rendezvous complete: process" in pod.log()
        assert [status(p)["state"] for p in pods[:2]] == ["exited", "exited"]
        stop(kept, 2, gang)
        second = saved_at_stop(kept, 2)
        assert second > first and checkpoint.saved_steps(directory) == [first, second]
        saved = digest_logged(kept[0], second)
        assert digest_on_disk(directory, second) == saved

        # Attempt 3 on both slices again: 2 slices x 2 processes.
        start(pods, two_slices, 3)
        for pod in pods:
            gang.wait_for_log(pod, f"step {second + 2} loss", STARTUP_S)
        for pod in pods:
            assert resumed(pod, 3) == (
                second,
                saved,
                "mesh data=2 x model=2 over 4 processes in 2 slice(s)",
            )
