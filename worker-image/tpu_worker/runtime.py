"""The worker's life: contract -> metrics endpoint -> rendezvous -> training code -> exit.

Exit codes (``tpu_operator.contract``): 0 when the training code returned;
``EXIT_RETRYABLE`` after SIGTERM, a watchdog stall or a failure of the distributed
runtime (a peer died); ``EXIT_RENDEZVOUS_FAILED`` when the system did not form within the
init timeout; ``EXIT_CONFIG_ERROR`` for a pod env or setting that a restart cannot fix;
1 when the training code raised.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tpu_operator import __version__, contract
from tpu_worker import compile_time, distributed, exits, peak
from tpu_worker.config import ContractError, PodContract, read_contract
from tpu_worker.metrics import MemoryStat, WorkerMetrics
from tpu_worker.reporting import Reporter, set_reporter
from tpu_worker.server import MetricsServer
from tpu_worker.termination import TerminationHandler
from tpu_worker.watchdog import Watchdog

log = logging.getLogger("tpu_worker")

# Messages of XLA runtime errors raised when another process of the job failed.
_PEER_FAILURE_MARKERS = (
    "coordination service",
    "heartbeat",
    "barrier",
    "gloo",
    "connection reset",
    "connection closed",
    "unavailable",
    "deadline_exceeded",
)


def process_start_time() -> float:
    """Unix time this process was created (from /proc), else now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime), counted after the ") " of comm
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def configure_logging(pc: PodContract | None) -> None:
    where = f"p{pc.process_id}" if pc is not None else "-"
    logging.basicConfig(
        level=os.environ.get("TPU_WORKER_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s %(levelname)s [{where}] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def _host_memory() -> dict[str, int]:
    """This process's host memory in memory_stats() terms: a CPU device's memory is host RAM.

    In use: resident set size; limit: the cgroup's memory limit, else the machine's RAM;
    peak: the resident high-water mark.
    """
    stats: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    name = "bytes_in_use" if key == "VmRSS" else "peak_bytes_in_use"
                    stats[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return stats
    try:
        with open("/sys/fs/cgroup/memory.max") as cgroup:
            limit = cgroup.read().strip()
        if limit.isdigit():
            stats["bytes_limit"] = int(limit)
            return stats
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as meminfo:
            total = next(line for line in meminfo if line.startswith("MemTotal:"))
        stats["bytes_limit"] = int(total.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        pass
    return stats


def _memory_reader() -> Callable[[], list[MemoryStat]]:
    import jax

    devices = jax.local_devices()

    def read() -> list[MemoryStat]:
        stats = []
        for index, device in enumerate(devices):
            try:
                raw = device.memory_stats()
            except Exception:
                raw = None
            if not raw and device.platform == "cpu" and index == 0:
                raw = _host_memory()  # CPU devices share the host's memory: report it once
            if not raw:
                continue
            stats.append(
                MemoryStat(
                    device=index,
                    bytes_in_use=raw.get("bytes_in_use"),
                    bytes_limit=raw.get("bytes_limit"),
                    peak_bytes_in_use=raw.get("peak_bytes_in_use"),
                )
            )
        return stats

    return read


def _preemption_sync_point() -> Callable[[int], bool] | None:
    from jax._src import distributed as jax_distributed
    from jax.experimental import multihost_utils

    if jax_distributed.global_state.preemption_sync_manager is None:
        return None
    return multihost_utils.reached_preemption_sync_point


class KeyValueCheckpointExchange:
    """Checkpoint-request agreement through the coordination service's key-value store."""

    PREFIX = "tpu_worker/checkpoint_request"

    def __init__(self, client: object, process_index: int, processes: int) -> None:
        self._client = client
        self._process = process_index
        self.processes = processes

    def propose(self, sequence: int, step: int) -> None:
        key = f"{self.PREFIX}/{sequence}/{self._process}"
        self._client.key_value_set(key, str(step))  # type: ignore[attr-defined]

    def proposals(self, sequence: int) -> list[int]:
        entries = self._client.key_value_dir_get(f"{self.PREFIX}/{sequence}/")  # type: ignore[attr-defined]
        return [int(value) for _, value in entries]


def _checkpoint_exchange() -> KeyValueCheckpointExchange | None:
    import jax
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None or jax.process_count() <= 1:
        return None
    return KeyValueCheckpointExchange(client, jax.process_index(), jax.process_count())


def is_peer_failure(error: BaseException) -> bool:
    """Whether an exception from JAX says another process of the job failed."""
    if type(error).__name__ not in ("XlaRuntimeError", "JaxRuntimeError"):
        return False
    text = str(error).lower()
    return any(marker in text for marker in _PEER_FAILURE_MARKERS)


class Worker:
    """One worker process; ``run(target)`` returns the exit code (or exits hard)."""

    def __init__(self, pc: PodContract, started: float) -> None:
        self.contract = pc
        self.started = started
        self.metrics = WorkerMetrics()
        self.reporter = Reporter(self.metrics)
        self.termination = TerminationHandler(self.reporter, pc.settings.termination_grace_s)
        self.server: MetricsServer | None = None
        set_reporter(self.reporter)

    def _start(self) -> None:
        pc = self.contract
        self.metrics.start_time.set(self.started)
        self.termination.install()
        try:
            self.server = MetricsServer(self.metrics.registry, pc.pod_ip, pc.metrics_port)
        except OSError as error:
            exits.hard_exit(
                contract.EXIT_CONFIG_ERROR,
                f"cannot serve metrics on {pc.pod_ip}:{pc.metrics_port} "
                f"({contract.ENV_METRICS_PORT}): {error}",
            )
        try:
            rendezvous = distributed.initialize(pc)
        except distributed.RendezvousError as error:
            log.error("%s", error)
            exits.hard_exit(error.exit_code, "rendezvous failed")
        self.termination.chain_native()
        self.reporter.use_sync_point(_preemption_sync_point())
        self.reporter.use_checkpoint_exchange(_checkpoint_exchange())
        compile_time.install(self.reporter)
        self._describe(rendezvous)
        self.reporter.record_init(max(0.0, time.time() - self.started))

    def _describe(self, rdv: distributed.Rendezvous) -> None:
        import jax

        pc = self.contract
        per_device = peak.peak_flops_per_device(
            rdv.device_kind,
            rdv.platform,
            rdv.local_devices,
            pc.settings.cpu_peak_flops_per_device,
        )
        if per_device is None:
            log.warning("no peak FLOP/s known for %s devices; MFU unavailable", rdv.device_kind)
        else:
            self.metrics.peak_flops.set(per_device * rdv.local_devices)
            self.reporter.peak_flops_per_second = per_device * rdv.local_devices
        self.metrics.build_info.labels(
            version=__version__,
            jax_version=jax.__version__,
            platform=rdv.platform,
            device_kind=rdv.device_kind,
            local_devices=str(rdv.local_devices),
            process_index=str(rdv.process_index),
            process_count=str(rdv.process_count),
            slice=str(pc.slice_index),
            worker=str(pc.worker_id),
            attempt=str(pc.restart_attempt),
        ).set(1)
        self.metrics.watch_device_memory(_memory_reader())

    def run(self, target: Callable[[], object]) -> int:
        self._start()
        settings = self.contract.settings
        watchdog = Watchdog(self.reporter, settings.watchdog_k, settings.watchdog_floor_s)
        watchdog.start()
        self.termination.training_started()
        self.reporter.start_loop()
        try:
            target()
        except SystemExit as exit_request:
            code = exit_request.code
            if code not in (None, 0):
                watchdog.stop()
                if not isinstance(code, int):
                    log.error("training code exited: %s", code)
                exits.hard_exit(code if isinstance(code, int) else 1, "training code exited")
        except BaseException as error:
            watchdog.stop()
            if self.reporter.stop_requested:
                log.exception("training code raised after SIGTERM")
                exits.hard_exit(contract.EXIT_RETRYABLE, "stopping on SIGTERM")
            if is_peer_failure(error):
                log.error("distributed runtime failed (another process of the job is gone?)")
                exits.dump_stacks("distributed runtime failure")
                log.exception("training code raised")
                exits.hard_exit(contract.EXIT_RETRYABLE, "distributed runtime failure")
            log.exception("training code raised")
            exits.hard_exit(1, "training code raised")
        watchdog.stop()
        self.reporter.end_loop()
        self.metrics.end_time.set(time.time())
        self.termination.training_finished()
        if self.reporter.stop_requested:
            # Every process stopped at the same step and saved together; the slowest may
            # still be writing. Process 0 hosts the coordination service: leaving before
            # its peers would abort them mid-save. Wait for all of them, within the grace.
            self._shutdown(self.termination.time_left())
            exits.hard_exit(contract.EXIT_RETRYABLE, "stopped on SIGTERM at a checkpoint")
        log.info("training finished at step %d after %.1fs", self.reporter.last_step, self._age())
        self._linger(settings.metrics_linger_s)
        self._shutdown()
        return 0

    def _age(self) -> float:
        return time.time() - self.started

    def _linger(self, seconds: float) -> None:
        if seconds <= 0:
            return
        log.info("serving final metrics for up to %gs (SIGTERM ends this early)", seconds)
        self.termination.wait(seconds)

    def _shutdown(self, within: float | None = None) -> None:
        """``jax.distributed.shutdown()``, bounded by ``within`` seconds (if given) and by
        the heartbeat timeout: a barrier, since the coordinator (process 0) must outlive
        every other process, or their heartbeats fail while they finish."""
        import jax

        bound = self.contract.settings.heartbeat_timeout_s + 10
        if within is not None:
            bound = min(bound, max(0.0, within - 1.0))  # exit before the grace timer fires
        done = threading.Event()

        def shutdown() -> None:
            try:
                jax.distributed.shutdown()
            except Exception as error:
                log.warning("jax.distributed.shutdown failed: %s", error)
            done.set()

        threading.Thread(target=shutdown, name="tpu-worker-shutdown", daemon=True).start()
        if not done.wait(bound):
            log.warning(
                "jax.distributed.shutdown did not finish within %.0fs; exiting anyway", bound
            )
        if self.server is not None:
            self.server.close()


def start(
    target: Callable[[], object],
    settings: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Read the contract from ``env`` (default os.environ), override ``settings`` (from
    flags), run ``target``; return the exit code (hard exits skip the return)."""
    started = process_start_time()
    try:
        pc = read_contract(env)
        if settings:
            pc = pc.with_settings(**settings)
    except ContractError as error:
        configure_logging(None)
        log.error("%s", error)
        return contract.EXIT_CONFIG_ERROR
    configure_logging(pc)
    return Worker(pc, started).run(target)
