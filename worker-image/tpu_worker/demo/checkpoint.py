"""Demo checkpoints with Orbax: every process writes its own shards; restore into any mesh.

A save is collective: every process of the job calls it at the same step, writes the
shards it holds (one replica of each shard is written once) with TensorStore into
``<dir>/step_<N>`` and Orbax commits the step once all of them are done (it writes to a
temporary directory and renames it, so a process killed mid-save leaves the previous
checkpoints intact and ``step_<N>`` exists only when complete). So every process needs
the storage: one directory all of them share (a ReadWriteMany volume, a Cloud Storage
FUSE mount).

A restore reads the newest step into the shardings of the mesh the process runs on now,
not the one that wrote it: each process reads only the slices of the arrays its devices
hold. A job that restarts with fewer (or more) slices, or other process ids, resumes from
the same checkpoint. A fingerprint of the model config (stored beside the state) refuses
to restore a checkpoint of another model.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STEP_PREFIX = "step"
STEP_DIGITS = 8
_NAME = re.compile(rf"^{STEP_PREFIX}_(\d{{{STEP_DIGITS}}})$")
STATE, META = "state", "meta"


def saved_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory``, oldest first (no JAX needed)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir():
            found.append(int(match.group(1)))
    return sorted(found)


def step_path(directory: Path, step: int) -> Path:
    return directory / f"{STEP_PREFIX}_{step:0{STEP_DIGITS}d}"


class Checkpoints:
    """The checkpoints of one run in ``directory``; every method is collective."""

    def __init__(self, directory: Path, fingerprint: str, keep: int) -> None:
        import orbax.checkpoint as ocp

        # Orbax logs every stage of every save at INFO (through absl): keep the log to
        # the demo's own lines unless the worker's log level asks for more.
        absl = logging.getLogger("absl")
        if absl.level == logging.NOTSET and logging.getLogger().level > logging.DEBUG:
            absl.setLevel(logging.WARNING)
        self.directory = directory
        self.fingerprint = fingerprint
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            step_prefix=STEP_PREFIX,
            step_format_fixed_length=STEP_DIGITS,
            # Saves block the loop: the worker's SIGTERM and checkpoint requests need the
            # step on storage when save() returns.
            enable_async_checkpointing=False,
            # A save cut off by a kill leaves a temporary directory: removed at start.
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(
            directory.absolute(), options=options, item_names=(STATE, META)
        )

    def latest(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any) -> Path:
        import orbax.checkpoint as ocp

        meta = {"fingerprint": self.fingerprint, "step": step}
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(meta)}
            ),
            force=True,
        )
        self._manager.wait_until_finished()
        return step_path(self.directory, step)

    def restore(self, template: Any, shardings: Any) -> tuple[int, Any]:
        """(step, state) of the newest checkpoint placed with ``shardings`` (the current
        mesh's), or (0, template) if there is none."""
        import jax
        import orbax.checkpoint as ocp

        step = self.latest()
        if step is None:
            return 0, template
        meta = self._manager.restore(
            step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()})
        )
        found = meta[META].get("fingerprint")
        if found != self.fingerprint:
            raise RuntimeError(
                f"checkpoint {step_path(self.directory, step)} is of another model ({found}); "
                f"this run is {self.fingerprint}: use another --checkpoint-dir"
            )
        abstract = jax.tree_util.tree_map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            template,
            shardings,
        )
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract)})
        )
        return step, restored[STATE]

    def close(self) -> None:
        self._manager.close()


def digest(state: Any) -> str:
    """A digest of the state's values, the same whatever mesh holds them (collective: it
    gathers every array to every process; for tests and small models)."""
    import hashlib

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    hasher = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        value = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        hasher.update(jax.tree_util.keystr(path).encode())
        hasher.update(str(value.dtype).encode())
        hasher.update(np.ascontiguousarray(value).tobytes())
    return hasher.hexdigest()[:16]


def fingerprint(config: Any, batch_size: int) -> str:
    return json.dumps({"model": config.__dict__, "batch_size": batch_size}, sort_keys=True)
