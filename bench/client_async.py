"""Benchmark: the operator's API client against kubernetes_asyncio and the naive way.

Issue 3 asks to use the official client without blocking the event loop and without model
deserialization on hot paths, or its async twin if that is materially faster here. This
measures it: N worker pods (the operator's own ``worker_pod`` for a 256-host v5p slice,
~7 KB each; ``schedulerName`` set to one that does not exist, so no scheduler, node
agent or kubelet work adds noise) are created and then deleted, at the same concurrency
(32, the operator's default --api-concurrency), by each client in its own process:

- ``kube``: ``tpu_operator.runtime.kube.Kube``, the operator's client: aiohttp on the
  event loop with the official client's configuration, raw JSON (the baseline, ratio 1.0),
  on asyncio's own loop (``--event-loop asyncio``);
- ``kube-uvloop``: the same on uvloop's loop, as the operator runs by default
  (``runtime/loops.py``);
- ``threads-raw``: the official client's request path (``param_serialize``, ``call_api``,
  urllib3) in a 32-thread pool, raw JSON: the operator's client until 2026-12-07;
- ``asyncio-raw``: ``kubernetes_asyncio`` (aiohttp, one event loop), raw JSON
  (``_preload_content=False``), 32 requests in flight;
- ``asyncio-models``: ``kubernetes_asyncio`` returning V1Pod models (its default);
- ``threads-models``: the official client in 32 threads returning V1Pod models (the
  naive way: what ``CoreV1Api().create_namespaced_pod(...)`` does by default).

Each process warms up first (connections, lazy imports), then times the N creates and the
N deletes: requests per second (wall) and the process's CPU seconds per 1000 requests
(``time.process_time``: all its threads). Variants are interleaved, order rotated, and
repeated; ratios are per repetition against ``kube``.

    .venv/bin/python bench/client_async.py [--quick] [--pods N] [--reps R] [--variants ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import harness
from harness import say, spread, summary

from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.runtime import loops

NAMESPACE = "bench-client"
CONCURRENCY = 32
VARIANTS = ("kube", "kube-uvloop", "threads-raw", "asyncio-raw", "asyncio-models", "threads-models")
WARMUP = 16


def pods(count: int, prefix: str) -> list[dict[str, Any]]:
    """``count`` worker pods of a 256-host slice, never scheduled."""
    shape = catalog.shape("tpu-v5p-slice", "8x8x16")
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, "unowned", "0")
    out = []
    for worker in range(count):
        wiring = PodWiring(
            job_name=prefix,
            service=prefix,
            slice_name=f"{prefix}-0",
            shape=shape,
            num_slices=1,
            slice_index=0,
            worker_index=worker,
            attempt=1,
        )
        pod = worker_pod(
            namespace=NAMESPACE,
            wiring=wiring,
            template={"spec": {"containers": [{"name": "worker", "image": "bench.local/w"}]}},
            owner=owner,
            placement=NodePlacement(),
        )
        del pod["metadata"]["ownerReferences"]  # no owner: the GC would delete them
        pod["spec"]["schedulerName"] = "bench-not-scheduled"
        out.append(pod)
    return out


# The child: one client, timed ------------------------------------------------------------

Phase = Callable[[list[dict[str, Any]]], Awaitable[None]]


async def kube_client(kubeconfig: str) -> tuple[Phase, Phase, Callable[[], None]]:
    from tpu_operator.runtime.kube import Kube, load_configuration, namespaced

    kube = Kube(load_configuration(kubeconfig), concurrency=CONCURRENCY)
    path = namespaced(NAMESPACE, "pods")

    async def create(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(kube.create(path, p) for p in items))

    async def delete(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(kube.delete(f"{path}/{p['metadata']['name']}", grace_seconds=0) for p in items)
        )

    def close() -> None:
        pass  # the session closes with the loop; the child exits right after

    return create, delete, close


async def asyncio_client(kubeconfig: str, raw: bool) -> tuple[Phase, Phase, Callable[[], None]]:
    import kubernetes_asyncio

    config = kubernetes_asyncio.client.Configuration()
    await kubernetes_asyncio.config.load_kube_config(
        config_file=kubeconfig, client_configuration=config
    )
    config.connection_pool_maxsize = CONCURRENCY
    client = kubernetes_asyncio.client.ApiClient(config)
    api = kubernetes_asyncio.client.CoreV1Api(client)
    slots = asyncio.Semaphore(CONCURRENCY)
    options = {"_preload_content": False} if raw else {}

    async def call(request: Awaitable[Any]) -> None:
        async with slots:
            response = await request
            if raw:
                json.loads(await response.read())
                response.release()

    async def create(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(call(api.create_namespaced_pod(NAMESPACE, p, **options)) for p in items)
        )

    async def delete(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(
                call(
                    api.delete_namespaced_pod(
                        p["metadata"]["name"], NAMESPACE, grace_period_seconds=0, **options
                    )
                )
                for p in items
            )
        )

    def close() -> None:
        pass  # the session closes with the loop; the child exits right after

    return create, delete, close


async def threads_raw_client(kubeconfig: str) -> tuple[Phase, Phase, Callable[[], None]]:
    """The official client's request path in 32 threads, raw JSON: the operator's client
    until 2026-12-07 (``param_serialize`` and ``call_api``, bodies read, not decoded)."""
    from concurrent.futures import ThreadPoolExecutor

    import kubernetes

    from tpu_operator.runtime.kube import load_configuration, namespaced

    config = load_configuration(kubeconfig)
    config.connection_pool_maxsize = CONCURRENCY
    client = kubernetes.client.ApiClient(config)
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY)
    loop = asyncio.get_running_loop()
    path = namespaced(NAMESPACE, "pods")

    def call(verb: str, url: str, body: Any) -> None:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        method, full, header_params, payload, _ = client.param_serialize(
            method=verb, resource_path=url, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        client.call_api(method, full, header_params=header_params, body=payload).read()

    async def create(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(loop.run_in_executor(pool, call, "POST", path, p) for p in items))

    options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}

    async def delete(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, call, "DELETE", f"{path}/{p['metadata']['name']}", options
                )
                for p in items
            )
        )

    return create, delete, lambda: pool.shutdown(wait=False)


async def threads_client(kubeconfig: str) -> tuple[Phase, Phase, Callable[[], None]]:
    from concurrent.futures import ThreadPoolExecutor

    import kubernetes

    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    config.connection_pool_maxsize = CONCURRENCY
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY)
    loop = asyncio.get_running_loop()

    async def create(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(loop.run_in_executor(pool, api.create_namespaced_pod, NAMESPACE, p) for p in items)
        )

    def delete_one(name: str) -> None:
        api.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)

    async def delete(items: list[dict[str, Any]]) -> None:
        await asyncio.gather(
            *(loop.run_in_executor(pool, delete_one, p["metadata"]["name"]) for p in items)
        )

    return create, delete, lambda: pool.shutdown(wait=False)


async def child(variant: str, kubeconfig: str, count: int) -> dict[str, float]:
    if variant in ("kube", "kube-uvloop"):
        create, delete, close = await kube_client(kubeconfig)
    elif variant == "threads-raw":
        create, delete, close = await threads_raw_client(kubeconfig)
    elif variant.startswith("asyncio"):
        create, delete, close = await asyncio_client(kubeconfig, raw=variant == "asyncio-raw")
    else:
        create, delete, close = await threads_client(kubeconfig)
    warm = pods(WARMUP, "warm")
    await create(warm)
    await delete(warm)
    items = pods(count, "bench")
    figures: dict[str, float] = {}
    for phase, run in (("create", create), ("delete", delete)):
        cpu, wall = time.process_time(), time.monotonic()
        await run(items)
        figures[f"{phase}_s"] = time.monotonic() - wall
        figures[f"{phase}_cpu_s"] = time.process_time() - cpu
    close()
    return figures


# The parent: cluster, interleaving, figures ----------------------------------------------


def run_child(kubeconfig: Path, variant: str, count: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", variant, f"--kubeconfig={kubeconfig}",
         f"--pods={count}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(
    kubeconfig: Path, count: int, reps: int, variants: tuple[str, ...] = VARIANTS
) -> list[dict[str, Any]]:
    trials = []
    for rep in range(1, reps + 1):
        shift = rep % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            figures = run_child(kubeconfig, variant, count)
            trials.append({"variant": variant, "rep": rep, **figures})
            say(f"rep {rep} {variant:<15} " + "  ".join(
                f"{phase} {count / figures[f'{phase}_s']:5.0f}/s cpu "
                f"{figures[f'{phase}_cpu_s']:5.2f} s" for phase in ("create", "delete")
            ))  # fmt: skip
    return trials


def figures(trials: list[dict[str, Any]], count: int) -> dict[str, Any]:
    base = {t["rep"]: t for t in trials if t["variant"] == "kube"}
    out: dict[str, Any] = {}
    for variant in dict.fromkeys(t["variant"] for t in trials):
        mine = {t["rep"]: t for t in trials if t["variant"] == variant}
        entry: dict[str, Any] = {}
        for phase in ("create", "delete"):
            wall, cpu = f"{phase}_s", f"{phase}_cpu_s"
            entry[f"{phase}_per_s"] = summary([count / t[wall] for t in mine.values()])
            entry[f"{phase}_cpu_per_1000"] = summary([1000 * t[cpu] / count for t in mine.values()])
            entry[f"{phase}_rate_ratio"] = summary([base[r][wall] / mine[r][wall] for r in mine])
            entry[f"{phase}_cpu_ratio"] = summary([mine[r][cpu] / base[r][cpu] for r in mine])
        out[variant] = entry
    return out


def report(results: dict[str, Any]) -> None:
    for phase in ("create", "delete"):
        rows = [
            [
                variant,
                spread(f[f"{phase}_per_s"], 0),
                spread(f[f"{phase}_rate_ratio"]),
                spread(f[f"{phase}_cpu_per_1000"]),
                spread(f[f"{phase}_cpu_ratio"]),
            ]
            for variant, f in results.items()
        ]
        print()
        print(f"{phase}: median [min-max]; ratios per repetition vs kube (the operator's client)")
        print(
            harness.table(
                ["client", "requests/s", "rate vs kube", "CPU s / 1000 req", "CPU vs kube"],
                rows,
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions")
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
        help="clients to compare (kube, the baseline, is always one)",
    )  # fmt: skip
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # kube-uvloop: uvloop's loop, chosen as the operator chooses its own.
        factory = harness.exact_loop(loops.UVLOOP if args.child == "kube-uvloop" else loops.ASYNCIO)
        with asyncio.Runner(loop_factory=factory) as runner:
            print(json.dumps(runner.run(child(args.child, args.kubeconfig, args.pods))))
        return
    reps = 2 if args.quick and args.reps == 8 else args.reps
    pools = [harness.Pool(name="cpu", vms=1)]
    with harness.bench_cluster("client", pools, namespaces=[NAMESPACE]) as cluster:
        variants = ("kube", *(v for v in args.variants if v != "kube"))
        trials = measure(cluster.kubeconfig, args.pods, reps, variants)
    results = figures(trials, args.pods)
    report(results)
    harness.write_results(
        "client_async",
        {
            "machine": harness.machine(),
            "settings": {"pods": args.pods, "reps": reps, "concurrency": CONCURRENCY},
            "figures": results,
            "trials": trials,
        },
    )


if __name__ == "__main__":
    main()
