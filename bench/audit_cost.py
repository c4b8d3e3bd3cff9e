"""Benchmark: what one periodic cache audit costs on a cluster of thousands of TPU nodes.

The cache audit (``runtime/audit.py``) runs every minute. It used to list the metadata of
every watched kind: worker pods, TPU nodes, TPUJobs and TPUSlices. It now lists TPUJobs
and TPUSlices only, since the operator's own pod and node watches drop what their re-lists
lack by themselves. This measures both, side by side on one cluster of ``--nodes``
simulated TPU nodes (pools of 64, as in ``scale.py``), alternating for ``--rounds``:

- ``now``: ``CacheAudit.audit()`` as the operator runs it;
- ``before``: the same plus the TPU nodes' metadata list the audit made before (the
  label selector of the node watch). The cluster holds no worker pods, so the pods' list
  of the audit before is left out: with one pod per node it cost about as much again.

Per audit: this process's CPU (the operator's side: requests, decoding) and the
kube-apiserver's CPU (serving the list), medians over the rounds.

    .venv/bin/python bench/audit_cost.py [--nodes 12736] [--rounds 5]   # ~3 min at 12,736
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import harness
from harness import say

from tpu_operator import catalog, contract
from tpu_operator.runtime.audit import CacheAudit
from tpu_operator.runtime.caches import Caches
from tpu_operator.runtime.kube import Kube, load_configuration

ACCELERATOR, TOPOLOGY = catalog.short_types()["v5litepod-256"]
HOSTS_PER_POOL = catalog.shape(ACCELERATOR, TOPOLOGY).hosts


class Idle:
    """The audit's owner: a standby, so nothing is woken."""

    acting = False
    jobs: Any = None
    slices: Any = None

    def wake_waiting(self) -> None:
        return None


async def measure(kubeconfig: str, apiserver: int, rounds: int) -> dict[str, Any]:
    kube = Kube(load_configuration(kubeconfig))
    audit = CacheAudit(kube, Caches(pods={}, slices={}, jobs={}, nodes={}), Idle())
    figures: dict[str, dict[str, list[float]]] = {
        variant: {"cpu": [], "apiserver": [], "seconds": [], "objects": []}
        for variant in ("now", "before")
    }

    async def nodes() -> int:
        listed = await kube.list_metadata(
            "/api/v1/nodes", label_selector=contract.NODE_LABEL_ACCELERATOR
        )
        return len(listed)

    try:
        for index in range(rounds):
            order = ("now", "before") if index % 2 == 0 else ("before", "now")
            for variant in order:
                cpu, served, began = (
                    time.process_time(),
                    harness.cpu_seconds(apiserver),
                    time.monotonic(),
                )
                await audit.audit("bench")
                objects = await nodes() if variant == "before" else 0
                row = figures[variant]
                row["cpu"].append(time.process_time() - cpu)
                row["apiserver"].append(harness.cpu_seconds(apiserver) - served)
                row["seconds"].append(time.monotonic() - began)
                row["objects"].append(objects)
                say(
                    f"round {index + 1}/{rounds} {variant}: {row['cpu'][-1]:.3f} CPU-s here, "
                    f"{row['apiserver'][-1]:.3f} in the apiserver, {objects} nodes listed"
                )
    finally:
        await kube.close()
    return {
        variant: {name: statistics.median(values) for name, values in row.items()}
        for variant, row in figures.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12736)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pools = [
        harness.tpu_pool(f"pool-{i}", TOPOLOGY, HOSTS_PER_POOL, ACCELERATOR)
        for i in range(-(-args.nodes // HOSTS_PER_POOL))
    ]
    nodes = sum(p.vms for p in pools)
    with harness.bench_cluster(
        "audit",
        pools,
        grace=harness.quiet_grace(nodes),
        timeout=600 + 0.2 * nodes,
        component_args=harness.SCALE_ARGS,
    ) as cluster:
        apiserver = int(cluster.status()["processes"]["kube-apiserver"]["pid"])
        time.sleep(10)  # the node agent's registrations settle
        results = asyncio.run(measure(str(cluster.kubeconfig), apiserver, args.rounds))
    now, before = results["now"], results["before"]
    rows = [
        [
            variant,
            f"{r['cpu']:.3f}",
            f"{r['apiserver']:.3f}",
            f"{r['seconds']:.2f}",
            f"{r['objects']:,.0f}",
        ]
        for variant, r in results.items()
    ]
    print(harness.table(["audit", "CPU-s here", "apiserver CPU-s", "seconds", "nodes"], rows))
    print(
        f"now / before: {now['cpu'] / before['cpu']:.3f} of this process's CPU, "
        f"{now['apiserver'] / before['apiserver']:.3f} of the apiserver's "
        f"({nodes:,} nodes, median of {args.rounds} rounds; one audit a minute)"
    )
    harness.write_results(
        "audit_cost",
        {"nodes": nodes, "rounds": args.rounds, "results": results, "pid": os.getpid()},
    )


if __name__ == "__main__":
    main()
