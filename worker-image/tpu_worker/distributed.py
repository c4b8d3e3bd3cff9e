"""Join the job's JAX distributed system from the pod contract.

On a Cloud TPU VM JAX's own GKE TPU detection forms the cluster (it reads the TPU_WORKER_*
and MEGASCALE_* names the operator sets); the result is checked against the contract.
Anywhere else (CPU processes in tests, local runs) the worker passes the coordinator
address, process count and id explicitly, turns cluster detection off, binds the
coordinator to the pod's own IP (several pods may share one machine) and uses gloo for
cross-process CPU collectives.

Any failure before the cluster is formed raises ``RendezvousError``; the launcher exits
with ``contract.EXIT_RENDEZVOUS_FAILED``.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from dataclasses import dataclass

from tpu_operator import contract
from tpu_worker import exits
from tpu_worker.config import PodContract
from tpu_worker.dns import ResolveTimeout, wait_for_name

log = logging.getLogger(__name__)

# JAX's own connect deadline is set this much later than the worker's, which fires first.
JAX_TIMEOUT_MARGIN_S = 30


class RendezvousError(RuntimeError):
    """The distributed system did not form; the message names coordinator and process count."""

    exit_code = contract.EXIT_RENDEZVOUS_FAILED


@dataclass(frozen=True)
class Rendezvous:
    """What the rendezvous produced, for logs, metrics and the benchmark."""

    mode: str  # "tpu" (JAX's GKE detection) or "explicit"
    process_index: int
    process_count: int
    local_devices: int
    global_devices: int
    device_kind: str
    platform: str
    dns_s: float
    initialize_s: float


def running_on_tpu_vm(mode: str) -> bool:
    """Whether JAX's Cloud TPU detection applies (libtpu installed and TPU chips present)."""
    if mode != "auto":
        return mode == "tpu"
    import jax  # noqa: F401  (importing jax runs its Cloud TPU probe)
    from jax._src import cloud_tpu_init

    return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def _failure(pc: PodContract, elapsed: float, cause: str) -> RendezvousError:
    return RendezvousError(
        f"rendezvous failed after {elapsed:.1f}s: JAX coordinator {pc.coordinator_address} "
        f"expected {pc.num_processes} processes (this is process {pc.process_id}, "
        f"slice {pc.slice_index} worker {pc.worker_id}); {cause}"
    )


def _initialize(jax: object, pc: PodContract, on_tpu: bool, timeout: int, heartbeat: int) -> None:
    distributed = jax.distributed  # type: ignore[attr-defined]
    if on_tpu:
        distributed.initialize(
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=heartbeat,
            shutdown_timeout_seconds=heartbeat,
        )
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[attr-defined]
    if pc.num_processes > 1:
        _check_own_hostname(pc)
    distributed.initialize(
        coordinator_address=pc.coordinator_address,
        num_processes=pc.num_processes,
        process_id=pc.process_id,
        cluster_detection_method="deactivate",
        coordinator_bind_address=pc.coordinator_bind_address,
        initialization_timeout=timeout,
        heartbeat_timeout_seconds=heartbeat,
        shutdown_timeout_seconds=heartbeat,
    )


def _check_own_hostname(pc: PodContract) -> None:
    # gloo binds to the address of gethostname(); a pod whose own name does not resolve
    # fails later in a collective with an opaque "device.cc:99 rv == 0" error.
    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
    except OSError:
        raise RendezvousError(
            f"this pod's hostname {name!r} does not resolve; CPU collectives (gloo) need it "
            f"to (pod IP {pc.pod_ip}); in Kubernetes the kubelet writes it to /etc/hosts"
        ) from None


def initialize(pc: PodContract) -> Rendezvous:
    """Form the distributed system or raise RendezvousError within the init timeout."""
    start = time.monotonic()
    timeout = pc.settings.init_timeout_s
    try:
        wait_for_name(
            pc.coordinator_host,
            timeout,
            what=f"JAX coordinator (global process 0 of {pc.num_processes})",
        )
    except ResolveTimeout as error:
        raise _failure(pc, time.monotonic() - start, str(error)) from None
    dns_s = time.monotonic() - start

    import jax

    on_tpu = running_on_tpu_vm(pc.settings.cluster_mode)
    remaining = max(1, math.ceil(timeout - dns_s))
    heartbeat = max(1, math.ceil(pc.settings.heartbeat_timeout_s))
    log.info(
        "joining JAX distributed system: coordinator %s, process %d of %d (slice %d worker %d)"
        ", %s, init timeout %ds, heartbeat timeout %ds",
        pc.coordinator_address,
        pc.process_id,
        pc.num_processes,
        pc.slice_index,
        pc.worker_id,
        "JAX GKE TPU detection" if on_tpu else f"explicit, coordinator bound to {pc.pod_ip}",
        remaining,
        heartbeat,
    )
    init_start = time.monotonic()

    def deadline_passed() -> None:
        error = _failure(
            pc,
            time.monotonic() - start,
            f"not every process joined within the {timeout:g}s init timeout; check that "
            f"all {pc.num_processes} worker pods are running and can reach the coordinator",
        )
        log.error("%s", error)
        exits.hard_exit(error.exit_code, "rendezvous failed")

    # The JAX client aborts the process (SIGABRT) when its own connect deadline passes,
    # so the worker keeps its own, shorter one and exits with the documented code.
    deadline = threading.Timer(max(0.0, timeout - (time.monotonic() - start)), deadline_passed)
    deadline.daemon = True
    deadline.start()
    try:
        _initialize(jax, pc, on_tpu, remaining + JAX_TIMEOUT_MARGIN_S, heartbeat)
        # Creating the backend exchanges device topology between processes: part of
        # the rendezvous, and the place a peer that connected then died shows up.
        devices = jax.devices()
    except RendezvousError:
        raise
    except Exception as error:  # XlaRuntimeError and friends: deadline, unavailable, ...
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise _failure(
            pc,
            time.monotonic() - start,
            f"not every process joined within the {timeout:g}s init timeout; "
            f"check that all {pc.num_processes} worker pods are running "
            f"({type(error).__name__}: {first_line[:300]})",
        ) from error
    finally:
        deadline.cancel()
    initialize_s = time.monotonic() - init_start

    if (jax.process_index(), jax.process_count()) != (pc.process_id, pc.num_processes):
        raise _failure(
            pc,
            time.monotonic() - start,
            f"JAX formed a different system: process {jax.process_index()} of "
            f"{jax.process_count()}, the pod contract says {pc.process_id} of "
            f"{pc.num_processes}",
        )
    local = jax.local_devices()
    result = Rendezvous(
        mode="tpu" if on_tpu else "explicit",
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        local_devices=len(local),
        global_devices=len(devices),
        device_kind=local[0].device_kind,
        platform=local[0].platform,
        dns_s=dns_s,
        initialize_s=initialize_s,
    )
    log.info(
        "rendezvous complete: process %d of %d, %d local / %d global %s devices (%s); "
        "dns %.2fs, initialize %.2fs",
        result.process_index,
        result.process_count,
        result.local_devices,
        result.global_devices,
        result.platform,
        result.device_kind,
        dns_s,
        initialize_s,
    )
    return result
