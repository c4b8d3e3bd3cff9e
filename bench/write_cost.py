"""Benchmark: the apiserver's CPU per write the operator sends, against a worker pod's POST.

A large job's start is bounded by the apiserver, on the same cores as everything else
(``scale.py``): every write the operator sends beside its pod POSTs takes from the rate at
which those are served. This measures what each kind of write costs the apiserver and
etcd, per request, on one local cluster, alternating for ``--rounds``:

- ``pod POST`` (the baseline): a worker pod as the operator builds it (a v5litepod-256
  slice's member, ``worker_pod``), held by a scheduling gate so that no scheduler or
  node agent work is counted;
- ``slice status PATCH``: a merge patch of a TPUSlice's status (counters and message, as
  a slice reconcile writes while its pods start), each slice written by one writer at a
  time, as the operator's work queue guarantees;
- ``slice status PATCH, one slice``: the same patches from ``--concurrency`` writers at
  once to one slice. The apiserver retries each conflicting update itself, so this is
  what more than one writer per object would cost.

Per kind: ``--requests`` requests, ``--concurrency`` at a time; the apiserver's and etcd's
CPU seconds (``/proc/<pid>/stat``) per request, medians over the rounds, and the ratio to
the pod POST of the same round.

    .venv/bin/python bench/write_cost.py [--rounds 3] [--requests 640]   # ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import harness
from harness import say
from kwatch import connect
from scale import SLICE_TYPE, TEMPLATE

from localcluster import Cluster
from localcluster.agent.kube import MERGE_PATCH
from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.slices import job_slice
from tpu_operator.builders.wiring import PodWiring

NAMESPACE = "write-cost"
SLICES = 32
GATE = "bench.tpu-operator.dev/hold"
KINDS = ("pod POST", "slice status PATCH", "slice status PATCH, one slice")


def slice_body(index: int) -> dict[str, Any]:
    """A job's TPUSlice as the operator creates it (owner reference left out: no job)."""
    spec = {"slice": {"type": SLICE_TYPE}, "numSlices": SLICES, "template": TEMPLATE}
    body = job_slice(
        job_name="cost",
        namespace=NAMESPACE,
        job_spec=copy.deepcopy(spec),
        index=index,
        attempt=1,
        owner=Owner(contract.API_VERSION, contract.JOB_KIND, "cost", "0"),
        node_pool="v5e-000",
        not_before=None,
        suspend=False,
    )
    del body["metadata"]["ownerReferences"]
    return body


def pod_body(index: int, slice_name: str, slice_uid: str) -> dict[str, Any]:
    accelerator, topology = catalog.short_types()[SLICE_TYPE]
    shape = catalog.shape(accelerator, topology)
    wiring = PodWiring(
        job_name="cost",
        service="cost",
        slice_name=slice_name,
        shape=shape,
        num_slices=SLICES,
        slice_index=0,
        worker_index=index % shape.hosts,
        attempt=1 + index // shape.hosts,
    )
    pod = worker_pod(
        namespace=NAMESPACE,
        wiring=wiring,
        template=copy.deepcopy(TEMPLATE),
        owner=Owner(contract.API_VERSION, contract.SLICE_KIND, slice_name, slice_uid),
        placement=NodePlacement(node_pool="v5e-000"),
    )
    pod["metadata"]["name"] = f"cost-{index}"
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


def status_patch(index: int) -> dict[str, Any]:
    ready = index % 64
    return {
        "status": {
            "readyWorkers": ready,
            "ready": f"{ready}/64",
            "activePods": 64,
            "message": f"{ready} of 64 workers ready",
        }
    }


async def measure(cluster: Cluster, rounds: int, requests: int, concurrency: int) -> dict:
    kube = connect(cluster, limit=concurrency)
    slices_path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/tpuslices"
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    uids = []
    for index in range(SLICES):
        created = await kube.call("POST", slices_path, slice_body(index))
        uids.append(created["metadata"]["uid"])
    names = [f"cost-{i}" for i in range(SLICES)]
    slots = asyncio.Semaphore(concurrency)
    locks = [asyncio.Lock() for _ in names]

    async def post_pod(index: int) -> None:
        async with slots:
            await kube.call("POST", pods_path, pod_body(index, names[0], uids[0]))

    async def patch_own(index: int) -> None:
        async with locks[index % SLICES], slots:  # one writer per slice
            await patch(names[index % SLICES], index)

    async def patch_one(index: int) -> None:
        async with slots:
            await patch(names[0], index)

    async def patch(name: str, index: int) -> None:
        path = f"{slices_path}/{name}/status"
        await kube.call("PATCH", path, status_patch(index), content_type=MERGE_PATCH)

    sends: dict[str, Callable[[int], Awaitable[None]]] = dict(
        zip(KINDS, (post_pod, patch_own, patch_one), strict=True)
    )
    pids = {
        name: int(p["pid"])
        for name, p in cluster.status()["processes"].items()
        if name in ("kube-apiserver", "etcd")
    }
    figures: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "ratio": []} for k in KINDS}
    for round_ in range(rounds):
        order = KINDS if round_ % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            before = sum(harness.cpu_seconds(pid) for pid in pids.values())
            began = time.monotonic()
            await asyncio.gather(*(sends[kind](i) for i in range(requests)))
            seconds = time.monotonic() - began
            cpu = (sum(harness.cpu_seconds(pid) for pid in pids.values()) - before) / requests
            figures[kind]["cpu"].append(cpu * 1000)
            say(
                f"round {round_ + 1}/{rounds} {kind}: {requests} in {seconds:.1f} s, "
                f"{cpu * 1000:.2f} ms of apiserver and etcd CPU each"
            )
            if kind == "pod POST":
                await kube.call("DELETE", pods_path, params={"gracePeriodSeconds": "0"})
        baseline = figures["pod POST"]["cpu"][-1]
        for kind in KINDS:
            figures[kind]["ratio"].append(figures[kind]["cpu"][-1] / baseline)
        await asyncio.sleep(2)  # the deleted pods' work is done before the next round
    await kube.close()
    return {
        kind: {name: statistics.median(values) for name, values in row.items()}
        for kind, row in figures.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    pools = [harness.tpu_pool("v5e-000", "4x4", 4, "tpu-v5-lite-podslice")]
    with harness.bench_cluster("write-cost", pools, namespaces=[NAMESPACE]) as cluster:
        results = asyncio.run(measure(cluster, args.rounds, args.requests, args.concurrency))
    rows = [[kind, f"{r['cpu']:.2f}", f"{r['ratio']:.2f}"] for kind, r in results.items()]
    print()
    print(harness.table(["write", "apiserver + etcd CPU ms each", "vs pod POST"], rows))
    harness.write_results(
        "write_cost",
        {"machine": harness.machine(), "settings": vars(args), "figures": results},
    )


if __name__ == "__main__":
    main()
