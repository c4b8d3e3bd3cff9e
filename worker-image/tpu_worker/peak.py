"""Peak FLOP/s of the local JAX devices: the denominator of MFU.

TPU devices take the catalog's per-device bf16 figure for their ``device_kind``. CPU
devices have no catalog entry; they get a documented theoretical estimate:

    cores x clock x FLOPs per cycle per core

where cores is the CPUs this process may run on (sched_getaffinity), clock the highest
"cpu MHz" in /proc/cpuinfo, and FLOPs per cycle that of the widest vector unit in the
CPU flags for fp32 (the precision XLA:CPU computes bf16 dots in): vector lanes
(512/256/128 bits over 32) x 2 for fused multiply-add x 2 FMA units per core. It is an
upper bound (real CPUs throttle the clock on wide vectors); processes that share cores
each count all of them. ``TPU_WORKER_CPU_PEAK_FLOPS_PER_DEVICE`` overrides it. The JAX
CPU devices of one process share its cores, so the estimate is split evenly between them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tpu_operator import catalog

log = logging.getLogger(__name__)

FMA_UNITS_PER_CORE = 2


@dataclass(frozen=True)
class CpuEstimate:
    cores: int
    clock_hz: float
    vector_bits: int
    fma: bool

    @property
    def flops_per_cycle(self) -> int:
        lanes = self.vector_bits // 32
        return lanes * (2 if self.fma else 1) * FMA_UNITS_PER_CORE

    @property
    def flops(self) -> float:
        return self.cores * self.clock_hz * self.flops_per_cycle


def cpu_estimate(cpuinfo: str | None = None, cores: int | None = None) -> CpuEstimate | None:
    """Estimate from /proc/cpuinfo text (None where it says nothing usable, e.g. non-x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    mhz: list[float] = []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "cpu MHz":
            with contextlib.suppress(ValueError):
                mhz.append(float(value))
        elif key == "flags" and not flags:
            flags = set(value.split())
    if not mhz or not flags:
        return None
    if "avx512f" in flags:
        bits = 512
    elif "avx2" in flags or "avx" in flags:
        bits = 256
    else:
        bits = 128
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return CpuEstimate(cores=cores, clock_hz=max(mhz) * 1e6, vector_bits=bits, fma="fma" in flags)


def peak_flops_per_device(
    device_kind: str, platform: str, local_devices: int, cpu_override: float | None = None
) -> float | None:
    """Peak FLOP/s of one local device, or None when nothing sensible is known."""
    if platform == "tpu":
        return catalog.peak_bf16_flops_per_device(device_kind)
    if platform == "cpu":
        if cpu_override is not None:
            return cpu_override
        estimate = cpu_estimate()
        if estimate is None:
            return None
        log.info(
            "CPU peak estimate: %d cores x %.2f GHz x %d FLOPs/cycle (%d-bit vectors%s, "
            "%d units) = %.1f GFLOP/s over %d local devices",
            estimate.cores,
            estimate.clock_hz / 1e9,
            estimate.flops_per_cycle,
            estimate.vector_bits,
            ", FMA" if estimate.fma else "",
            FMA_UNITS_PER_CORE,
            estimate.flops / 1e9,
            local_devices,
        )
        return estimate.flops / max(1, local_devices)
    return None
