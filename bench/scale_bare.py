"""The bare client of ``scale.py``: one multislice job's pods, created, gang-restarted and
deleted the plainest way the official client allows.

A separate process (its CPU is its own), driven over stdin/stdout by ``scale.py``. It is
``bare_client.py``'s client (official ``kubernetes`` client, ``--concurrency`` threads with
a connection pool of the same size, dict bodies in, raw JSON out) with two changes for
jobs of thousands of pods:

- it builds the pods itself, before the timed part, from a small job description (the
  operator's ``worker_pod`` and ``headless_service`` builders, one owner TPUSlice per
  slice, as the operator's pods have), instead of reading hundreds of MB of ready-made
  pods;
- its watch keeps a count of live pods per attempt, so waiting for "every old pod gone"
  costs O(1) per event (``bare_client.GangWatch.wait_gone`` intersects sets of every pod
  name on each event: quadratic at 12,736 pods).

Protocol (one JSON line per event on stdout, with the monotonic time ``t`` and this
process's CPU seconds ``cpu``; commands are lines on stdin, in this order):

``ready`` (pods of attempt 1 built, connections warm, watch running)
  <- ``go``: ``go``, POST the headless Service and every pod, ``created``
  <- ``mark``: ``mark`` (the end of a phase, for its CPU)
  <- ``arm``: build the pods of attempt 2, ``armed``; when the watch sees a pod Failed:
  ``failure-seen``, DELETE every pod of attempt 1 (concurrently), ``deleted``, wait until
  all are gone, ``gone``, POST attempt 2, ``recreated``
  <- ``mark``: ``mark``
  <- ``delete``: ``delete-go``, DELETE every pod of attempt 2, ``deleted``, wait until all
  are gone, ``gone``
  <- ``mark``: ``mark``; exit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from bare_client import Bare, GangWatch, emit

from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.service import headless_service
from tpu_operator.builders.wiring import PodWiring, Ports

ATTEMPT = contract.LABEL_RESTART_ATTEMPT


class CountingWatch(GangWatch):
    """``GangWatch`` plus the number of live pods per attempt label."""

    def __init__(self, bare: Bare, attempt_label: str) -> None:
        self.count: Counter[str] = Counter()
        super().__init__(bare, attempt_label)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self.changed:
            if kind == "DELETED":
                label = self.alive.pop(name, None)
                if label is not None:
                    self.count[label] -= 1
            else:
                label = (pod["metadata"].get("labels") or {}).get(self.attempt_label, "")
                previous = self.alive.get(name)
                if previous != label:
                    if previous is not None:
                        self.count[previous] -= 1
                    self.count[label] += 1
                    self.alive[name] = label
                if (pod.get("status") or {}).get("phase") == "Failed":
                    self.failed.set()
            self.changed.notify_all()

    def wait_none(self, attempt: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count[attempt] <= 0, timeout=timeout)


def build_pods(job: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    """Every worker pod of attempt ``attempt``, as the operator builds them."""
    shape = catalog.shape(job["accelerator"], job["topology"])
    slices = job["slices"]
    pods = []
    for index, owned in enumerate(slices):
        owner = Owner(contract.API_VERSION, contract.SLICE_KIND, owned["name"], owned["uid"])
        placement = NodePlacement(node_pool=owned["pool"])
        for worker in range(shape.hosts):
            wiring = PodWiring(
                job_name=job["name"],
                service=job["name"],
                slice_name=owned["name"],
                shape=shape,
                num_slices=len(slices),
                slice_index=index,
                worker_index=worker,
                attempt=attempt,
            )
            pod = worker_pod(
                namespace=job["namespace"],
                wiring=wiring,
                template=job["template"],
                owner=owner,
                placement=placement,
            )
            pods.append(pod)
    return pods


def service(job: dict[str, Any]) -> dict[str, Any]:
    first = job["slices"][0]
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, first["name"], first["uid"])
    return headless_service(
        name=job["name"],
        namespace=job["namespace"],
        selector={contract.LABEL_JOB_NAME: job["name"]},
        owner=owner,
        ports=Ports(),
    )


def command(expected: str) -> None:
    line = sys.stdin.readline().strip()
    if line != expected:
        raise SystemExit(f"expected {expected!r} on stdin, got {line!r}")


def delete_all(
    bare: Bare, watch: CountingWatch, pods: list[dict[str, Any]], timeout: float
) -> None:
    bare.run_all(bare.delete, [p["metadata"]["name"] for p in pods])
    emit("deleted")
    attempt = pods[0]["metadata"]["labels"][ATTEMPT]
    if not watch.wait_none(attempt, timeout):
        raise SystemExit(f"pods of attempt {attempt} still there after {timeout:.0f} s")
    emit("gone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--job", required=True, help="JSON: name, namespace, accelerator, "
                        "topology, template, slices: [{name, uid, pool}]")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    with open(args.job) as handle:
        job = json.load(handle)
    bare = Bare(args.kubeconfig, job["namespace"], args.concurrency)
    first = build_pods(job, 1)
    bare.warm()
    watch = CountingWatch(bare, ATTEMPT)
    emit("ready", pods=len(first))
    command("go")
    emit("go")
    body: Any = service(job)
    bare.api.create_namespaced_service(job["namespace"], body, _preload_content=False)
    bare.run_all(bare.create, first)
    emit("created")
    command("mark")
    emit("mark")
    command("arm")
    second = build_pods(job, 2)
    emit("armed")
    watch.failed.wait()
    emit("failure-seen")
    delete_all(bare, watch, first, args.timeout)
    bare.run_all(bare.create, second)
    emit("recreated")
    command("mark")
    emit("mark")
    command("delete")
    emit("delete-go")
    delete_all(bare, watch, second, args.timeout)
    command("mark")
    emit("mark")


if __name__ == "__main__":
    main()
