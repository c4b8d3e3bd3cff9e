"""The demo training loop: mesh, sharded state, compiled step, reporting, checkpoints.

The 2-D mesh (data x model) spans every device of every process. FLOPs per step come
from the compiled executable's cost analysis (per device, times the device count),
cross-checked against the analytic matmul count; both are logged, and the analytic
count is used if they disagree by more than 2x (or cost analysis is unavailable).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import tpu_worker
from tpu_operator import contract
from tpu_worker.demo import checkpoint, data, hooks, model
from tpu_worker.demo.options import DemoOptions, ModelConfig

log = logging.getLogger("tpu_worker.demo")

FLOPS_AGREEMENT = 2.0  # compiled/analytic ratio accepted as a cross-check


def model_parallelism(options: DemoOptions, devices_per_slice: int) -> int:
    if options.model_parallel is not None:
        return options.model_parallel
    config = options.model
    splittable = config.heads % 2 == 0 and config.d_ff % 2 == 0 and config.vocab % 2 == 0
    return 2 if devices_per_slice % 2 == 0 and splittable else 1


def slices_from_env(env: Mapping[str, str]) -> int:
    """The number of slices this attempt runs on, read from the pod env at every start:
    ``MEGASCALE_NUM_SLICES`` (set for a multislice job), else the contract's
    ``TPU_OPERATOR_NUM_SLICES``, else 1."""
    for name in (contract.ENV_MEGASCALE_NUM_SLICES, contract.ENV_NUM_SLICES):
        text = env.get(name, "").strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            raise SystemExit(f"{name}={text!r} is not a number of slices (an integer >= 1)")
        return int(text)
    return 1


def mesh_shape(options: DemoOptions, devices: int, slices: int) -> tuple[int, int]:
    """(data, model): the model axis within one slice, the data axis across slices (and
    across the model groups of a slice)."""
    if devices % slices:
        raise SystemExit(f"{devices} devices do not split into {slices} equal slices")
    per_slice = devices // slices
    model_axis = model_parallelism(options, per_slice)
    if model_axis < 1 or per_slice % model_axis:
        raise SystemExit(
            f"--model-parallel {model_axis} does not divide the {per_slice} devices of a slice"
        )
    data_axis = devices // model_axis
    if options.batch_size % data_axis:
        raise SystemExit(f"--batch-size {options.batch_size} is not a multiple of {data_axis}")
    config = options.model
    for name, size in (("heads", config.heads), ("d-ff", config.d_ff), ("vocab", config.vocab)):
        if size % model_axis:
            raise SystemExit(f"--{name} {size} is not a multiple of the model axis {model_axis}")
    return data_axis, model_axis


def make_mesh(options: DemoOptions, slices: int) -> jax.sharding.Mesh:
    devices = jax.devices()
    data_axis, model_axis = mesh_shape(options, len(devices), slices)
    if devices[0].platform == "tpu":
        found = {getattr(d, "slice_index", 0) for d in devices}
        if len(found) != slices:
            raise SystemExit(f"the devices span {len(found)} slices, the pod env says {slices}")
        if slices > 1:  # ICI within a slice, DCN across slices
            grid = mesh_utils.create_hybrid_device_mesh(
                (data_axis // slices, model_axis), (slices, 1), devices
            )
        else:
            grid = mesh_utils.create_device_mesh((data_axis, model_axis), devices)
    else:  # processes in order of their ids, slice by slice: each row within one slice
        ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
        grid = np.array(ordered).reshape(data_axis, model_axis)
    return jax.sharding.Mesh(grid, (model.DATA, model.MODEL), (AxisType.Auto, AxisType.Auto))


def state_shardings(mesh: jax.sharding.Mesh, config: ModelConfig) -> dict[str, Any]:
    def named(spec: P) -> NamedSharding:
        return NamedSharding(mesh, spec)

    params = jax.tree_util.tree_map(
        named, model.param_specs(config), is_leaf=lambda x: isinstance(x, P)
    )
    return {"params": params, "opt": {"mu": params, "nu": params, "count": named(P())}}


def compiled_flops(compiled: Any) -> float | None:
    """FLOPs of one device's program, from XLA's cost analysis (None if unavailable)."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if not analysis:
        return None
    flops = analysis.get("flops")
    return float(flops) if flops and flops > 0 else None


def flops_per_process(compiled: Any, options: DemoOptions) -> float:
    analytic = model.analytic_flops_per_step(options.model, options.batch_size)
    per_device = compiled_flops(compiled)
    share = jax.local_device_count() / jax.device_count()
    if per_device is None:
        log.warning("cost analysis unavailable; FLOPs/step analytic %.4g", analytic)
        return analytic * share
    executed = per_device * jax.device_count()
    ratio = executed / analytic
    log.info(
        "FLOPs/step: compiled %.4g (cost analysis: %.4g per device x %d devices), "
        "analytic %.4g, ratio %.3f",
        executed,
        per_device,
        jax.device_count(),
        analytic,
        ratio,
    )
    if not 1 / FLOPS_AGREEMENT <= ratio <= FLOPS_AGREEMENT:
        log.warning("compiled and analytic FLOPs disagree by more than %gx; using analytic", 2)
        return analytic * share
    return per_device * jax.local_device_count()


def _state_bytes(state: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))


def train(options: DemoOptions) -> None:
    report = tpu_worker.reporter()
    config = options.model
    slices = slices_from_env(os.environ)
    mesh = make_mesh(options, slices)
    shardings = state_shardings(mesh, config)

    def init(key: jax.Array) -> dict[str, Any]:
        params = model.init_params(config, key)
        return {"params": params, "opt": model.init_opt(params)}

    state = jax.jit(init, out_shardings=shardings)(jax.random.key(options.seed))
    log.info(
        "demo model: %d layers, d_model %d, %d heads, d_ff %d, vocab %d, seq %d, batch %d; "
        "%.2f M parameters; mesh data=%d x model=%d over %d processes in %d slice(s)",
        config.layers,
        config.d_model,
        config.heads,
        config.d_ff,
        config.vocab,
        config.seq_len,
        options.batch_size,
        sum(x.size for x in jax.tree_util.tree_leaves(state["params"])) / 1e6,
        mesh.shape[model.DATA],
        mesh.shape[model.MODEL],
        jax.process_count(),
        slices,
    )
    start = 0
    store = None
    if options.checkpoint_dir:
        fingerprint = checkpoint.fingerprint(config, options.batch_size)
        store = checkpoint.Checkpoints(
            Path(options.checkpoint_dir), fingerprint, options.keep_checkpoints
        )
        with report.checkpoint_restore():
            start, state = store.restore(state, shardings)
        if start:
            log.info("resumed from checkpoint at step %d (%s)", start, options.checkpoint_dir)
            if options.log_state_digest:
                log.info("state digest at step %d: %s", start, checkpoint.digest(state))
        else:
            log.info("no checkpoint in %s; starting at step 0", options.checkpoint_dir)
    try:
        _train(options, report, mesh, shardings, state, start, store)
    finally:
        if store is not None:
            store.close()


def _train(
    options: DemoOptions,
    report: Any,
    mesh: jax.sharding.Mesh,
    shardings: Any,
    state: Any,
    start: int,
    store: checkpoint.Checkpoints | None,
) -> None:
    config = options.model
    process = jax.process_index()
    batch_sharding = NamedSharding(mesh, P(model.DATA, None))
    replicated = NamedSharding(mesh, P())
    if start >= options.steps:
        log.info("checkpoint step %d reached --steps %d; nothing to do", start, options.steps)
        return

    step_fn = jax.jit(
        functools.partial(model.train_step, config=config, learning_rate=options.learning_rate),
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )
    first = data.batch(options.seed, start + 1, options.batch_size, config, batch_sharding)
    compiled = step_fn.lower(state, first).compile()
    flops = flops_per_process(compiled, options)
    peak = report.peak_flops_per_second
    processes = jax.process_count()
    examples = options.batch_size / processes
    tokens = options.batch_size * config.seq_len / processes
    log.info(
        "training steps %d..%d; %.2f MB of state per copy",
        start + 1,
        options.steps,
        _state_bytes(state) / 1e6,
    )

    for step in range(start + 1, options.steps + 1):
        began = time.perf_counter()
        hooks.before_step(options.hooks, step, process)
        with report.data_wait():
            hooks.slow_input(options.hooks, step, process)
            batch = data.batch(options.seed, step, options.batch_size, config, batch_sharding)
        state, loss = compiled(state, batch)
        loss_value = float(np.asarray(loss.addressable_data(0)))  # waits for the step
        hooks.after_step(options.hooks)
        report.record_step(step, loss=loss_value, examples=examples, tokens=tokens, flops=flops)
        elapsed = time.perf_counter() - began
        if step % options.log_every == 0 or step == start + 1 or step == options.steps:
            mfu = f"{flops / elapsed / peak:.4f}" if peak else "n/a"
            log.info(
                "step %d loss %.6f [%s] step_time %.3fs tokens/s %.0f MFU %s",
                step,
                loss_value,
                float(loss_value).hex(),
                elapsed,
                tokens * processes / elapsed,
                mfu,
            )
        stop = report.should_stop(step)
        requested = report.checkpoint_requested(step)
        due = step % options.checkpoint_every == 0 or step == options.steps or stop or requested
        if store is not None and due:
            with report.checkpoint_save():
                path = store.save(step, state)
            log.info(
                "checkpoint saved at step %d to %s%s",
                step,
                path,
                " (requested)" if requested else "",
            )
            if options.log_state_digest:
                log.info("state digest at step %d: %s", step, checkpoint.digest(state))
        if stop:
            log.warning("stopping at step %d on request (SIGTERM in the job)", step)
            return
    log.info("demo finished: step %d, loss %.6f", options.steps, loss_value)
