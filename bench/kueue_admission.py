"""Kueue admission -> all pods Running for a 64-host TPUJob, against the same job without
Kueue in the same run (interleaved), and the operator's extra writes with Kueue.

One local control plane with a simulate-mode v5p node pool of 64 VMs (pods go Running at
once, no processes), Kueue (``localcluster/kueue.py``: built once, cached) with one
topology-aware ResourceFlavor and a ClusterQueue with quota for the whole pool, and the
operator run with ``--kueue``. Per repetition, order alternating:

- ``plain``: a TPUJob without the queue label; timed from its POST to every pod Running;
- ``kueue``: the same TPUJob labelled ``kueue.x-k8s.io/queue-name``; timed from its POST to
  the Workload's admission (seen by polling at 20 Hz) and from admission to every pod
  Running.

The operator's API writes (POST, PATCH, DELETE: ``tpu_operator_api_requests_total``) are
counted per trial; the difference between the two variants is what Kueue costs (the
Workload's creation and status writes, plus the job's queue conditions).

    .venv/bin/python bench/kueue_admission.py --reps 3
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import harness

from localcluster.kueue import Kueue, tpu_queues
from tpu_operator import contract

HOSTS = 64
TOPOLOGY = "4x8x8"  # v5p: 256 chips on 64 VMs
NAMESPACE = "bench-kueue"
TIMEOUT = 240.0
WRITES = ("POST", "PATCH", "DELETE")
TEMPLATE = harness.WORKER_TEMPLATE
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.JOB_PLURAL}"
WORKLOADS = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={contract.LABEL_SLICE_NAME}"


def job(name: str, queued: bool) -> dict[str, Any]:
    labels = {contract.LABEL_KUEUE_QUEUE: "tpu"} if queued else {}
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "slice": {"accelerator": "tpu-v5p-slice", "topology": TOPOLOGY},
            "template": copy.deepcopy(TEMPLATE),
        },
    }


def running(api: Any) -> int:
    items = api.get(PODS)["items"]
    return sum(
        1
        for p in items
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    )


def admitted(api: Any) -> bool:
    for wl in api.get(WORKLOADS)["items"]:
        for cond in (wl.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Admitted" and cond["status"] == "True":
                return True
    return False


def wait(probe: Any, what: str, interval: float = 0.05) -> float:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if probe():
            return time.monotonic()
        time.sleep(interval)
    raise TimeoutError(what)


def writes(operator: harness.Operator) -> float:
    counts = operator.requests()
    return sum(counts[v] for v in WRITES)


def trial(api: Any, operator: harness.Operator, variant: str, rep: int) -> dict[str, Any]:
    name = f"{variant}-{rep}"
    before = writes(operator)
    started = time.monotonic()
    api.call("POST", JOBS, job(name, variant == "kueue"))
    result: dict[str, Any] = {"variant": variant, "rep": rep}
    if variant == "kueue":
        at = wait(lambda: admitted(api), f"{name} admitted", interval=0.05)
        result["admitted"] = at - started
    else:
        at = started
    done = wait(lambda: running(api) >= HOSTS, f"{name} Running", interval=0.1)
    result["running"] = done - started
    result["admission_to_running"] = done - at
    time.sleep(1.5)  # paced status writes of the running job go out
    result["writes"] = writes(operator) - before
    api.call("DELETE", f"{JOBS}/{name}")
    wait(lambda: not api.get(PODS)["items"], f"{name} pods gone", interval=0.2)
    wait(lambda: not api.get(WORKLOADS)["items"], f"{name} workload gone", interval=0.2)
    harness.say(
        f"{name}: running {result['running']:.2f} s"
        + (f" (admitted {result['admitted']:.2f} s)" if "admitted" in result else "")
        + f", {result['writes']:.0f} operator writes"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    pool = harness.tpu_pool("v5p-64", TOPOLOGY, HOSTS)
    trials: list[dict[str, Any]] = []
    with harness.bench_cluster("kueue", [pool], namespaces=[NAMESPACE]) as cluster:
        kueue = Kueue.start(cluster)
        try:
            kueue.apply(tpu_queues([pool], namespaces=[NAMESPACE], topology=True))
            operator = harness.Operator(cluster, "kueue", ["--kueue"])
            operator.start()
            api = cluster.api()
            try:
                for rep in range(args.reps):
                    order = ("plain", "kueue") if rep % 2 == 0 else ("kueue", "plain")
                    for variant in order:
                        trials.append(trial(api, operator, variant, rep))
            finally:
                operator.stop()
            startup = {"kueue_seconds": kueue.started_seconds, **kueue.timings}
        finally:
            kueue.stop()
    rows = []
    for variant in ("plain", "kueue"):
        mine = [t for t in trials if t["variant"] == variant]
        run = harness.summary([t["running"] for t in mine])
        to_run = harness.summary([t["admission_to_running"] for t in mine])
        adm = harness.summary([t["admitted"] for t in mine]) if variant == "kueue" else None
        wr = harness.summary([t["writes"] for t in mine])
        rows.append(
            [
                variant,
                harness.spread(adm) if adm else "-",
                harness.spread(to_run),
                harness.spread(run),
                harness.spread(wr, 0),
            ]
        )
    print(
        harness.table(
            [
                "variant",
                "POST -> admitted (s)",
                "admitted -> all Running (s)",
                "POST -> all Running (s)",
                "operator writes",
            ],
            rows,
        )
    )
    path = harness.write_results(
        "kueue_admission",
        {"machine": harness.machine(), "startup": startup, "hosts": HOSTS, "trials": trials},
    )
    harness.say(f"results: {path}")


if __name__ == "__main__":
    main()
