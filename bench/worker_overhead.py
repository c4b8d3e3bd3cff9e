"""Benchmark: cost of the worker's metrics reporting on the demo's step time.

One process runs the demo's compiled training step in rounds of M steps, alternating
(ABBA order, to cancel drift) between a loop that reports everything the demo reports
(data-wait phase, record_step with loss/examples/tokens/FLOPs, the stop check) and the
same loop without the reporter calls. The full worker machinery is live: metrics served
over HTTP and scraped once a second (more often than Prometheus would), the watchdog
thread, the compile listener. A micro-benchmark then times the reporting calls alone,
which resolves far below the noise of step times on a shared machine.

    .venv/bin/python bench/worker_overhead.py [--rounds 20] [--steps-per-round 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tpu_worker import compile_time
from tpu_worker.demo import data, model, options, train
from tpu_worker.metrics import WorkerMetrics
from tpu_worker.reporting import Reporter, set_reporter
from tpu_worker.server import MetricsServer
from tpu_worker.watchdog import Watchdog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps-per-round", type=int, default=20)
    parser.add_argument("--micro-calls", type=int, default=20000)
    args = parser.parse_args()

    demo = options.from_namespace(options.parser().parse_args([]))
    config = demo.model
    reporter = Reporter(WorkerMetrics())
    set_reporter(reporter)
    compile_time.install(reporter)
    server = MetricsServer(reporter.metrics.registry, "127.0.0.1", 0)
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(1.0):
            with urllib.request.urlopen(server.url, timeout=10) as response:
                response.read()

    threading.Thread(target=scraper, daemon=True).start()
    watchdog = Watchdog(reporter, k=10, floor_s=300)
    watchdog.start()

    mesh = train.make_mesh(demo)
    shardings = train.state_shardings(mesh, config)
    batch_sharding = NamedSharding(mesh, P(model.DATA, None))

    def init(key: jax.Array) -> dict:
        params = model.init_params(config, key)
        return {"params": params, "opt": model.init_opt(params)}

    state = jax.jit(init, out_shardings=shardings)(jax.random.key(0))
    step_fn = jax.jit(
        lambda s, b: model.train_step(s, b, config, demo.learning_rate),
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, NamedSharding(mesh, P())),
        donate_argnums=0,
    )
    first = data.batch(0, 1, demo.batch_size, config, batch_sharding)
    compiled = step_fn.lower(state, first).compile()
    flops = train.flops_per_process(compiled, demo)
    tokens = demo.batch_size * config.seq_len
    step = 0
    reporter.start_loop()

    def run(steps: int, report: bool) -> list[float]:
        nonlocal state, step
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            step += 1
            if report:
                with reporter.data_wait():
                    batch = data.batch(0, step, demo.batch_size, config, batch_sharding)
            else:
                batch = data.batch(0, step, demo.batch_size, config, batch_sharding)
            state, loss = compiled(state, batch)
            value = float(np.asarray(loss.addressable_data(0)))
            if report:
                reporter.record_step(
                    step, loss=value, examples=demo.batch_size, tokens=tokens, flops=flops
                )
                reporter.should_stop(step)
            times.append(time.perf_counter() - began)
        return times

    run(10, True)  # warm up
    with_reporting: list[float] = []
    without: list[float] = []
    for index in range(args.rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        for report in order:
            (with_reporting if report else without).extend(run(args.steps_per_round, report))

    # The reporting calls alone, many times, on the same reporter.
    calls = args.micro_calls
    began = time.perf_counter()
    for index in range(calls):
        with reporter.data_wait():
            pass
        reporter.record_step(step + index, loss=1.0, examples=16, tokens=tokens, flops=flops)
        reporter.should_stop(step + index)
    per_call = (time.perf_counter() - began) / calls
    stop.set()
    watchdog.stop()
    server.close()

    med_with, med_without = statistics.median(with_reporting), statistics.median(without)
    mean_with, mean_without = statistics.fmean(with_reporting), statistics.fmean(without)
    print(f"demo step, {len(with_reporting)} steps per variant, interleaved ABBA rounds")
    print(f"{'variant':<22}{'median ms':>12}{'mean ms':>12}{'p90 ms':>12}")
    for name, times in (("with reporting", with_reporting), ("without reporting", without)):
        p90 = float(np.percentile(times, 90))
        print(
            f"{name:<22}{statistics.median(times) * 1e3:>12.3f}"
            f"{statistics.fmean(times) * 1e3:>12.3f}{p90 * 1e3:>12.3f}"
        )
    print(f"ratio with/without (median): {med_with / med_without:.4f}")
    print(f"ratio with/without (mean):   {mean_with / mean_without:.4f}")
    print(
        f"reporting calls alone: {per_call * 1e6:.1f} us per step = "
        f"{per_call / med_without * 100:.3f}% of the median step ({med_without * 1e3:.1f} ms); "
        f"target < 0.5%"
    )


if __name__ == "__main__":
    main()
