"""``tpu-worker``: join the job, serve metrics, run training code in this same process.

With ``TPU_OPERATOR_CONTROL_PORT`` set, it supervises instead: it runs the same command as
a child process and restarts it on the operator's command (``tpu_worker.supervisor``).

    tpu-worker run [worker flags] -m package.module [args ...]
    tpu-worker run [worker flags] path/to/script.py [args ...]
    tpu-worker demo [worker flags] [demo flags]
    tpu-worker check [worker flags]

Worker flags override the matching ``TPU_WORKER_*`` env settings (see ``--help``).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tpu_operator import contract

# flag -> (Settings field, env var, type, help)
_SETTINGS: dict[str, tuple[str, str, type, str]] = {
    "--init-timeout": (
        "init_timeout_s",
        contract.ENV_WORKER_INIT_TIMEOUT,
        float,
        "seconds for DNS wait + rendezvous of all processes (default 300)",
    ),
    "--heartbeat-timeout": (
        "heartbeat_timeout_s",
        contract.ENV_WORKER_HEARTBEAT_TIMEOUT,
        float,
        "seconds without heartbeats before JAX declares a process dead (default 100)",
    ),
    "--watchdog-k": (
        "watchdog_k",
        contract.ENV_WORKER_WATCHDOG_K,
        float,
        "stall threshold factor k in max(k x median step, floor) (default 10)",
    ),
    "--watchdog-floor": (
        "watchdog_floor_s",
        contract.ENV_WORKER_WATCHDOG_FLOOR,
        float,
        "stall threshold floor in seconds (default 300)",
    ),
    "--termination-grace": (
        "termination_grace_s",
        contract.ENV_WORKER_TERMINATION_GRACE,
        float,
        "seconds the training loop gets after SIGTERM to checkpoint and return (default 25)",
    ),
    "--metrics-linger": (
        "metrics_linger_s",
        contract.ENV_WORKER_METRICS_LINGER,
        float,
        "seconds to keep serving metrics after training finished (default 0)",
    ),
    "--cpu-peak-flops": (
        "cpu_peak_flops_per_device",
        contract.ENV_WORKER_CPU_PEAK_FLOPS,
        float,
        "peak FLOP/s of one CPU device, instead of the /proc/cpuinfo estimate",
    ),
    "--cluster-mode": (
        "cluster_mode",
        contract.ENV_WORKER_CLUSTER_MODE,
        str,
        "auto (JAX GKE TPU detection on TPU VMs, explicit elsewhere), tpu or explicit",
    ),
}


def worker_flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("worker flags (override the env settings)")
    for flag, (dest, env, kind, text) in _SETTINGS.items():
        group.add_argument(flag, dest=dest, type=kind, default=None, help=f"{text}; env {env}")
    return parser


def _settings(namespace: argparse.Namespace) -> dict[str, object]:
    found = {}
    for dest, _, _, _ in _SETTINGS.values():
        value = getattr(namespace, dest, None)
        if value is not None:
            found[dest] = value
    return found


def _split_run(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Worker flags before the target; ``-m MODULE ...`` or ``SCRIPT ...`` after."""
    takes_value = set(_SETTINGS)
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "-m" or not token.startswith("-"):
            break
        if token in ("-h", "--help"):
            index += 1
            continue
        name = token.split("=", 1)[0]
        index += 2 if name in takes_value and "=" not in token else 1
    return list(argv[:index]), list(argv[index:])


def _run_target(target: list[str]) -> Callable[[], object]:
    if target[0] == "-m":
        if len(target) < 2:
            raise SystemExit("tpu-worker run: -m needs a module name")
        module, args = target[1], target[2:]

        def run_module() -> object:
            sys.argv = [module, *args]
            return runpy.run_module(module, run_name="__main__", alter_sys=True)

        return run_module
    script, args = target[0], target[1:]
    if not Path(script).is_file():
        raise SystemExit(f"tpu-worker run: no such script {script!r}")

    def run_script() -> object:
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))
        return runpy.run_path(script, run_name="__main__")

    return run_script


def _check() -> None:
    """Every process contributes its index to one cross-process collective."""
    import logging

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = np.asarray(multihost_utils.process_allgather(np.int32(jax.process_index())))
    expected = np.arange(jax.process_count(), dtype=np.int32)
    if not np.array_equal(np.sort(gathered.ravel()), expected):
        raise RuntimeError(f"cross-process check failed: gathered {gathered}, want {expected}")
    logging.getLogger("tpu_worker").info(
        "check passed: %d processes, %d devices", jax.process_count(), jax.device_count()
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from tpu_worker import runtime

    commands = "run, demo, check"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    own_flags = _split_run(rest)[0] if command == "run" else rest
    if command in ("run", "demo", "check") and not {"-h", "--help"} & set(own_flags):
        import os

        from tpu_worker import supervisor

        if supervisor.supervising(os.environ):
            # Run this same command line as a supervised child (tpu_worker.supervisor).
            known, _ = worker_flags().parse_known_args(own_flags)
            return supervisor.main(argv, known.termination_grace_s)
        if os.environ.get(contract.ENV_SUPERVISED_CHILD):
            supervisor.die_with_parent()
    if command == "run":
        flags, target = _split_run(rest)
        parser = argparse.ArgumentParser(
            prog="tpu-worker run",
            parents=[worker_flags()],
            usage="tpu-worker run [worker flags] (-m module | script.py) [args ...]",
        )
        namespace = parser.parse_args(flags)
        if not target:
            parser.error("name a module (-m package.module) or a script to run")
        return runtime.start(_run_target(target), _settings(namespace))
    if command == "demo":
        from tpu_worker.demo import options, train

        parser = options.parser(prog="tpu-worker demo", parents=[worker_flags()])
        namespace = parser.parse_args(rest)
        demo_options = options.from_namespace(namespace)
        return runtime.start(lambda: train.train(demo_options), _settings(namespace))
    if command == "check":
        parser = argparse.ArgumentParser(prog="tpu-worker check", parents=[worker_flags()])
        return runtime.start(_check, _settings(parser.parse_args(rest)))
    print(f"tpu-worker: unknown command {command!r}; commands: {commands}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
