"""A stand-in for the metrics endpoints of many simulated workers (benchmarks only).

Simulate-mode pods run no process, so nothing would answer the operator's progress
sampler. This one process answers for all of them: it listens on 0.0.0.0:<port>, and
since every simulated pod's IP is a loopback address (127.B.x.y) and the whole 127/8 is
local, a request to ``http://<pod IP>:<port>/metrics`` reaches it; the local address the
request came in on (the pod IP) selects that pod's state.

Each pod gets the real worker's metric families, from ``tpu_worker.metrics.WorkerMetrics``
itself (so names, types, labels and buckets are exactly the worker's), advanced lazily on
each read as a plausible training run: one step per ``--step-seconds`` after a short
init and compile, examples, tokens and model FLOPs per step, data-wait time, a decaying
loss. The values are synthetic; the cost of producing and parsing them is real.

    python bench/metrics_standin.py --port 19431
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass, field

import harness  # noqa: F401  (puts the repository on sys.path)
from aiohttp import web
from prometheus_client import generate_latest

from tpu_worker import metrics as worker_metrics

INIT_SECONDS = 20.0
COMPILE_SECONDS = 40.0
BATCH = 256
SEQUENCE = 2048
FLOPS_PER_TOKEN = 6 * 8e9  # an 8B-parameter model
PEAK = 4 * 197e12  # one v5e host: 4 chips


@dataclass
class Worker:
    """One simulated worker process: its metrics and how far they have been advanced."""

    step_seconds: float
    started: float
    metrics: worker_metrics.WorkerMetrics = field(default_factory=worker_metrics.WorkerMetrics)
    steps: int = 0

    def __post_init__(self) -> None:
        m = self.metrics
        m.start_time.set(self.started)
        m.peak_flops.set(PEAK)
        m.phase_counter(worker_metrics.PHASE_INIT).inc(INIT_SECONDS)
        m.phase_counter(worker_metrics.PHASE_COMPILE).inc(COMPILE_SECONDS)
        m.build_info.labels("bench", "0.10.2", "tpu", "TPU v5 lite", "4", "0", "1", "0", "0",
                            "1").set(1)  # fmt: skip

    def advance(self, now: float) -> None:
        due = int((now - self.started - INIT_SECONDS - COMPILE_SECONDS) / self.step_seconds)
        new = max(due - self.steps, 0)
        if not new:
            return
        m = self.metrics
        wait = 0.05 * self.step_seconds
        for _ in range(min(new, 100)):
            m.step_duration.observe(self.step_seconds * random.uniform(0.95, 1.05))
        self.steps += new
        m.steps.inc(new)
        m.step.set(self.steps)
        m.examples.inc(new * BATCH)
        m.tokens.inc(new * BATCH * SEQUENCE)
        m.model_flops.inc(new * BATCH * SEQUENCE * FLOPS_PER_TOKEN)
        m.phase_counter(worker_metrics.PHASE_DATA_WAIT).inc(new * wait)
        m.phase_counter(worker_metrics.PHASE_STEP).inc(new * (self.step_seconds - wait))
        m.loss.set(2.0 + 8.0 * math.exp(-self.steps / 2000))
        m.last_progress.set(now)


class Standin:
    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds
        self.workers: dict[str, Worker] = {}
        self.reads = 0

    def worker(self, address: str) -> Worker:
        worker = self.workers.get(address)
        if worker is None:
            started = time.time() - random.uniform(INIT_SECONDS + COMPILE_SECONDS, 600)
            worker = self.workers[address] = Worker(self.step_seconds, started)
        return worker

    async def metrics(self, request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        worker = self.worker(sockname[0] if sockname else "?")
        worker.advance(time.time())
        self.reads += 1
        return web.Response(
            body=generate_latest(worker.metrics.registry),
            content_type="text/plain",
            charset="utf-8",
        )

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({"reads": self.reads, "workers": len(self.workers)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    args = parser.parse_args()
    standin = Standin(args.step_seconds)
    app = web.Application()
    app.router.add_get("/metrics", standin.metrics)
    app.router.add_get("/stats", standin.stats)
    web.run_app(app, host="0.0.0.0", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
