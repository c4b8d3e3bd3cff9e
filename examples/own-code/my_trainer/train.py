"""Train a linear model with data parallelism over every process of the job.

Run by the worker launcher, which forms the JAX system from the pod's env, serves the
metrics and handles SIGTERM before this module starts (``tpu-worker run -m
my_trainer.train [args]``, like ``python -m``)::

    tpu-worker run -m my_trainer.train --steps 2000 --checkpoint-dir /checkpoints/run-1

The loop shows what training code does under the worker: it reports each step
(``record_step``), marks its input and checkpoint phases, saves when the job is being
stopped (``should_stop``) or the operator asks for a checkpoint ahead of maintenance
(``checkpoint_requested``), and resumes from the newest checkpoint on start.

The batch is sharded over every device of every process (each process makes its own
share of it); the parameters are replicated, so process 0 alone writes a checkpoint and
the others receive it from process 0 on restore. A model too large for that saves per
process shards instead (for example with Orbax), and then every worker needs the storage.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tpu_worker

log = logging.getLogger("my_trainer")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="my_trainer.train")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.batch_size % jax.device_count():
        parser.error(
            f"--batch-size {args.batch_size} is not a multiple of {jax.device_count()} devices"
        )
    return args


def local_batch(args: argparse.Namespace, step: int) -> tuple[np.ndarray, np.ndarray]:
    """This process's share of the global batch of ``step``: y = x @ w_true + noise."""
    per_process = args.batch_size // jax.process_count()
    truth = np.random.default_rng(args.seed).normal(size=args.features).astype(np.float32)
    rng = np.random.default_rng((args.seed, step, jax.process_index()))
    x = rng.normal(size=(per_process, args.features)).astype(np.float32)
    noise = 0.01 * rng.normal(size=per_process).astype(np.float32)
    return x, x @ truth + noise


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def save(directory: Path, step: int, params: dict[str, jax.Array]) -> None:
    """Process 0 writes step_<N>.npz under a temporary name, then renames it: a save cut
    short leaves the previous checkpoint intact."""
    if jax.process_index() != 0:
        return
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:08d}.npz"
    partial = directory / f".{final.name}.tmp"
    arrays: dict[str, Any] = {n: np.asarray(v.addressable_data(0)) for n, v in params.items()}
    arrays["step"] = np.int64(step)
    with open(partial, "wb") as out:
        np.savez(out, **arrays)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(final)


def restore(directory: Path | None, params: dict[str, jax.Array]) -> tuple[int, dict[str, Any]]:
    """(step, params) of the newest checkpoint, read by process 0 and sent to every process."""
    step, arrays = (
        0,
        {name: np.asarray(value.addressable_data(0)) for name, value in params.items()},
    )
    if jax.process_index() == 0 and directory is not None and directory.is_dir():
        saved = sorted(directory.glob("step_*.npz"))
        if saved:
            with np.load(saved[-1]) as data:
                step = int(data["step"])
                arrays = {name: data[name] for name in params}
    step, arrays = multihost_utils.broadcast_one_to_all((np.int64(step), arrays))
    return int(step), arrays


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    report = tpu_worker.reporter()
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    params = {
        "w": jnp.zeros(args.features, jnp.float32, device=replicated),
        "b": jnp.zeros((), jnp.float32, device=replicated),
    }
    with report.checkpoint_restore():
        start, arrays = restore(args.checkpoint_dir, params)
    params = {name: jax.device_put(value, replicated) for name, value in arrays.items()}
    log.info("starting at step %d of %d on %d devices", start, args.steps, jax.device_count())

    @jax.jit
    def train_step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updated = jax.tree.map(lambda p, g: p - args.learning_rate * g, params, grads)
        return updated, loss

    processes = jax.process_count()
    flops = 6.0 * args.batch_size * args.features / processes  # forward and backward
    for step in range(start + 1, args.steps + 1):
        with report.data_wait():
            x, y = local_batch(args, step)
            x = jax.make_array_from_process_local_data(batch_sharding, x)
            y = jax.make_array_from_process_local_data(batch_sharding, y)
        params, loss = train_step(params, x, y)
        loss_value = float(loss)
        report.record_step(
            step, loss=loss_value, examples=args.batch_size // processes, flops=flops
        )
        if step % args.log_every == 0 or step == args.steps:
            log.info("step %d loss %.6f", step, loss_value)
        # Both every step: every process gets the same answer at the same step.
        stop = report.should_stop(step)  # SIGTERM somewhere in the job
        requested = report.checkpoint_requested(step)  # the operator asks, ahead of maintenance
        due = step % args.checkpoint_every == 0 or step == args.steps or stop or requested
        if args.checkpoint_dir is not None and due:
            with report.checkpoint_save():
                save(args.checkpoint_dir, step, params)
            log.info("checkpoint saved at step %d", step)
        if stop:
            log.warning("stopping at step %d: the job is being stopped", step)
            return


if __name__ == "__main__":
    main()
