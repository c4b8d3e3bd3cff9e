"""Demo flags: model size, run length, checkpointing, and the fault-injection hooks.

Every hook flag defaults to its ``TPU_WORKER_DEMO_*`` env var (names in
``tpu_operator.contract``), so tests of the operator can inject faults through the pod
template's env without changing the command.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_operator import contract


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    d_model: int = 128
    heads: int = 4
    d_ff: int = 512
    layers: int = 2
    seq_len: int = 64

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class Hooks:
    """Fault injection (test hooks). Process lists are global process ids; None = all."""

    hang_at_step: int | None = None
    hang_processes: frozenset[int] | None = None
    step_sleep_s: float = 0.0
    slow_processes: frozenset[int] | None = None
    slow_s: float = 0.0
    exit_at_step: int | None = None
    exit_code: int = 1
    exit_processes: frozenset[int] | None = None
    fault_attempts: frozenset[int] | None = None
    """Attempts (TPU_OPERATOR_RESTART_ATTEMPT) in which the hang and exit hooks fire."""
    attempt: int = 1

    @staticmethod
    def applies(processes: frozenset[int] | None, process: int) -> bool:
        return processes is None or process in processes

    def faults_now(self) -> bool:
        """Whether the hang and exit hooks fire in this attempt."""
        return self.fault_attempts is None or self.attempt in self.fault_attempts


@dataclass(frozen=True)
class DemoOptions:
    model: ModelConfig
    steps: int = 100
    batch_size: int = 16  # global, across all processes
    learning_rate: float = 3e-3
    model_parallel: int | None = None  # None: 2 when a slice's device count is even, else 1
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_state_digest: bool = False
    log_every: int = 10
    seed: int = 0
    hooks: Hooks = Hooks()


def _processes(text: str | None) -> frozenset[int] | None:
    if text is None or not text.strip():
        return None
    try:
        return frozenset(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ids: {text!r}") from None


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def parser(
    prog: str = "tpu-worker demo", parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, parents=list(parents), description=__doc__)
    run = p.add_argument_group("run")
    run.add_argument("--steps", type=int, default=100, help="train up to this global step")
    run.add_argument("--batch-size", type=int, default=16, help="global batch (sequences)")
    run.add_argument("--learning-rate", type=float, default=3e-3)
    run.add_argument(
        "--model-parallel",
        type=int,
        default=None,
        help="size of the model axis (within one slice; default 2 if it divides the slice)",
    )
    run.add_argument("--log-every", type=int, default=10, help="log a line every N steps")
    run.add_argument("--seed", type=int, default=0)
    model = p.add_argument_group("model")
    model.add_argument("--vocab", type=int, default=256)
    model.add_argument("--d-model", type=int, default=128)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--d-ff", type=int, default=512)
    model.add_argument("--layers", type=int, default=2)
    model.add_argument("--seq-len", type=int, default=64)
    ckpt = p.add_argument_group("checkpoints")
    ckpt.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save and resume here (Orbax; every process reads and writes it: shared storage)",
    )
    ckpt.add_argument("--checkpoint-every", type=int, default=50, help="save every N steps")
    ckpt.add_argument("--keep-checkpoints", type=int, default=2)
    ckpt.add_argument(
        "--log-state-digest",
        action="store_true",
        help="log a digest of the state's values after each restore and save (gathers the "
        "whole state to every process: small models only)",
    )
    hooks = p.add_argument_group("test hooks (defaults from env)")
    c = contract
    hooks.add_argument(
        "--step-sleep",
        type=float,
        default=float(_env(c.ENV_DEMO_STEP_SLEEP) or 0),
        help=f"seconds every process sleeps per step; env {c.ENV_DEMO_STEP_SLEEP}",
    )
    hooks.add_argument(
        "--hang-at-step",
        type=int,
        default=_env(c.ENV_DEMO_HANG_AT_STEP),
        help=f"hang forever before computing this step; env {c.ENV_DEMO_HANG_AT_STEP}",
    )
    hooks.add_argument(
        "--hang-processes",
        type=_processes,
        default=_processes(_env(c.ENV_DEMO_HANG_PROCESSES)),
        help=f"processes that hang (default all); env {c.ENV_DEMO_HANG_PROCESSES}",
    )
    hooks.add_argument(
        "--slow-processes",
        type=_processes,
        default=_processes(_env(c.ENV_DEMO_SLOW_PROCESSES)),
        help=f"stragglers (default all); env {c.ENV_DEMO_SLOW_PROCESSES}",
    )
    hooks.add_argument(
        "--slow-seconds",
        type=float,
        default=float(_env(c.ENV_DEMO_SLOW_SECONDS) or 0),
        help=f"extra seconds per step on stragglers; env {c.ENV_DEMO_SLOW_SECONDS}",
    )
    hooks.add_argument(
        "--exit-at-step",
        type=int,
        default=_env(c.ENV_DEMO_EXIT_AT_STEP),
        help=f"exit before computing this step; env {c.ENV_DEMO_EXIT_AT_STEP}",
    )
    hooks.add_argument(
        "--exit-code",
        type=int,
        default=int(_env(c.ENV_DEMO_EXIT_CODE) or 1),
        help=f"code for --exit-at-step (default 1); env {c.ENV_DEMO_EXIT_CODE}",
    )
    hooks.add_argument(
        "--fault-attempts",
        type=_processes,
        default=_processes(_env(c.ENV_DEMO_FAULT_ATTEMPTS)),
        help=f"attempts in which --hang-at-step and --exit-at-step fire (default all); env "
        f"{c.ENV_DEMO_FAULT_ATTEMPTS}",
    )
    hooks.add_argument(
        "--exit-processes",
        type=_processes,
        default=_processes(_env(c.ENV_DEMO_EXIT_PROCESSES)),
        help=f"processes that exit (default all); env {c.ENV_DEMO_EXIT_PROCESSES}",
    )
    return p


def from_namespace(ns: argparse.Namespace) -> DemoOptions:
    model = ModelConfig(
        vocab=ns.vocab,
        d_model=ns.d_model,
        heads=ns.heads,
        d_ff=ns.d_ff,
        layers=ns.layers,
        seq_len=ns.seq_len,
    )
    if model.d_model % model.heads:
        raise SystemExit(f"--d-model {model.d_model} is not a multiple of --heads {model.heads}")
    hooks = Hooks(
        hang_at_step=None if ns.hang_at_step is None else int(ns.hang_at_step),
        hang_processes=ns.hang_processes,
        step_sleep_s=ns.step_sleep,
        slow_processes=ns.slow_processes,
        slow_s=ns.slow_seconds,
        exit_at_step=None if ns.exit_at_step is None else int(ns.exit_at_step),
        exit_code=ns.exit_code,
        exit_processes=ns.exit_processes,
        fault_attempts=ns.fault_attempts,
        attempt=int(_env(contract.ENV_RESTART_ATTEMPT) or 1),
    )
    return DemoOptions(
        model=model,
        steps=ns.steps,
        batch_size=ns.batch_size,
        learning_rate=ns.learning_rate,
        model_parallel=ns.model_parallel,
        checkpoint_dir=ns.checkpoint_dir,
        checkpoint_every=max(1, ns.checkpoint_every),
        keep_checkpoints=max(1, ns.keep_checkpoints),
        log_state_digest=ns.log_state_digest,
        log_every=max(1, ns.log_every),
        seed=ns.seed,
        hooks=hooks,
    )
