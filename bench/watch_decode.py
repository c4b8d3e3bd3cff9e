"""Benchmark: the operator's CPU per pod watch event, against the bare client's.

Every pod event reaches the operator as one JSON line of 6-9 KB (a worker pod with its
env, the apiserver's defaults and managed fields), about five per pod while a job starts.
Side by side in one process, over the same lines:

- ``operator``: ``ListWatch._apply`` on the pod kind, as the watch calls it: decode, the
  view, the store (index keys, counts, versions) and the event callback (a no-op here);
- ``bare``: what ``bench/bare_client.py``'s watch does per line: ``json.loads`` and a
  dict of live pods by name with their attempt and a check for Failed;
- ``orjson``: ``orjson.loads`` of the line alone, for scale (the operator's decoder
  before ``state/documents.py``).

The lines follow one pod through what the apiserver sends while a job starts (ADDED,
scheduled, kubelet's Pending, Running, Ready) and one DELETED, built from the operator's
own ``worker_pod`` with the fields the apiserver adds (defaults, managed fields, status).
Figures: microseconds per event (best of 5 rounds over every line) and operator / bare.
Run it with ``PYTHONPATH=<other checkout>/operator`` to time another version of the
operator beside the same baseline.

    .venv/bin/python bench/watch_decode.py [--pods 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from tpu_operator import catalog, contract
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.runtime.listwatch import PODS, ListWatch

NAMESPACE, JOB = "bench", "big"
STAMP = "2026-11-24T16:04:29Z"


def fields(value: Any) -> Any:
    """A managed-fields set (``fieldsV1``) covering every key of ``value``, as the
    apiserver records it for the manager that wrote them."""
    if isinstance(value, dict):
        return {f"f:{key}": fields(item) for key, item in value.items()}
    if isinstance(value, list):
        return {f'k:{{"name":"{item.get("name", i)}"}}': fields(item) for i, item in
                enumerate(value) if isinstance(item, dict)}  # fmt: skip
    return {}


def served(pod: dict[str, Any], index: int) -> dict[str, Any]:
    """``pod`` as the apiserver stores it: identity, defaults and managed fields."""
    meta = pod["metadata"]
    meta.update(
        uid=f"00000000-0000-0000-0000-{index:012d}",
        resourceVersion="1",
        creationTimestamp=STAMP,
    )
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Never")
    spec.update(
        dnsPolicy="ClusterFirst",
        schedulerName="default-scheduler",
        securityContext={},
        terminationGracePeriodSeconds=30,
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
    )
    for container in spec.get("containers", []):
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
    meta["managedFields"] = [
        {"manager": "tpu-operator", "operation": "Update", "apiVersion": "v1", "time": STAMP,
         "fieldsType": "FieldsV1", "fieldsV1": fields({"metadata": {k: meta[k] for k in
         ("labels", "annotations", "ownerReferences") if k in meta}, "spec": spec})},
    ]  # fmt: skip
    pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
    return pod


def progression(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events of one pod while it starts, and its deletion."""

    def step(version: int, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        body = json.loads(json.dumps(body_now))
        body["metadata"]["resourceVersion"] = str(version)
        change(body)
        body_now.clear()
        body_now.update(body)
        return body

    def condition(kind: str, status: str = "True") -> dict[str, Any]:
        return {"type": kind, "status": status, "lastProbeTime": None,
                "lastTransitionTime": STAMP}  # fmt: skip

    def scheduled(body: dict[str, Any]) -> None:
        body["spec"]["nodeName"] = "gke-tpu-node-0001"
        body["status"]["conditions"] = [condition("PodScheduled")]

    def kubelet(body: dict[str, Any]) -> None:
        body["status"].update(
            hostIP="10.0.0.5", hostIPs=[{"ip": "10.0.0.5"}], startTime=STAMP,
            conditions=[condition("PodReadyToStartContainers"), condition("Initialized"),
                        condition("Ready", "False"), condition("ContainersReady", "False"),
                        condition("PodScheduled")],
            containerStatuses=[{"name": contract.WORKER_CONTAINER, "ready": False,
                                "restartCount": 0, "image": "worker", "imageID": "",
                                "started": False, "lastState": {},
                                "state": {"waiting": {"reason": "ContainerCreating"}}}],
        )  # fmt: skip
        body["metadata"]["managedFields"].append(
            {
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "time": STAMP,
                "fieldsType": "FieldsV1",
                "subresource": "status",
                "fieldsV1": fields({"status": body["status"]}),
            }
        )

    def running(body: dict[str, Any]) -> None:
        status = body["status"]
        status.update(phase="Running", podIP="10.1.0.5", podIPs=[{"ip": "10.1.0.5"}])
        status["containerStatuses"][0].update(
            started=True, containerID="containerd://0", state={"running": {"startedAt": STAMP}}
        )

    def ready(body: dict[str, Any]) -> None:
        for item in body["status"]["conditions"]:
            item["status"] = "True"
        body["status"]["containerStatuses"][0]["ready"] = True

    def deleting(body: dict[str, Any]) -> None:
        body["metadata"].update(deletionTimestamp=STAMP, deletionGracePeriodSeconds=30)

    body_now = pod
    first = json.loads(json.dumps(pod))
    return [
        ("ADDED", first),
        ("MODIFIED", step(2, scheduled)),
        ("MODIFIED", step(3, kubelet)),
        ("MODIFIED", step(4, running)),
        ("MODIFIED", step(5, ready)),
        ("MODIFIED", step(6, deleting)),
        ("DELETED", step(7, lambda body: None)),
    ]


def lines(pods: int) -> list[bytes]:
    shape = catalog.shape("tpu-v5-lite-podslice", "16x16")
    owner = Owner(contract.API_VERSION, contract.SLICE_KIND, f"{JOB}-0", "slice-uid")
    worker = {
        "name": contract.WORKER_CONTAINER,
        "image": "worker",
        "command": ["python", "-m", "train"],
        "resources": {"limits": {"cpu": "8"}},
    }
    template = {"spec": {"containers": [worker]}}
    out: list[bytes] = []
    for index in range(pods):
        wiring = PodWiring(
            job_name=JOB,
            service=JOB,
            slice_name=contract.slice_name(JOB, index // shape.hosts),
            shape=shape,
            num_slices=max(1, pods // shape.hosts),
            slice_index=index // shape.hosts,
            worker_index=index % shape.hosts,
            attempt=1,
        )
        pod = worker_pod(
            namespace=NAMESPACE,
            wiring=wiring,
            template=template,
            owner=owner,
            placement=NodePlacement(node_pool=f"pool-{index // shape.hosts}"),
        )
        for kind, body in progression(served(pod, index)):
            out.append(json.dumps({"type": kind, "object": body}).encode())
    return out


class Bare:
    """``bare_client.GangWatch``'s work per line."""

    def __init__(self) -> None:
        self.alive: dict[str, str] = {}
        self.failed = False

    def apply(self, line: bytes) -> None:
        event = json.loads(line)
        pod = event["object"]
        name = pod["metadata"]["name"]
        if event["type"] == "DELETED":
            self.alive.pop(name, None)
        else:
            labels = pod["metadata"].get("labels") or {}
            self.alive[name] = labels.get(contract.LABEL_RESTART_ATTEMPT, "")
            if (pod.get("status") or {}).get("phase") == "Failed":
                self.failed = True


def per_event(apply: Callable[[bytes], Any], events: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for line in events:
            apply(line)
        best = min(best, time.process_time() - started)
    return best / len(events) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    events = lines(args.pods)
    sizes = sorted(len(line) for line in events)
    watch = ListWatch(PODS, None, None, PODS.store(), lambda kind, view: None)  # type: ignore[arg-type]
    bare = Bare()
    results = {
        "operator": per_event(lambda line: watch._apply(line, "0"), events, args.rounds),
        "bare": per_event(bare.apply, events, args.rounds),
        "orjson": per_event(orjson.loads, events, args.rounds),
    }
    print(
        f"{len(events)} events of {args.pods} pods, "
        f"{sizes[0]}-{sizes[-1]} bytes (median {sizes[len(sizes) // 2]})"
    )
    for name, micros in results.items():
        print(f"{name:>9}: {micros:6.1f} us per event  ({micros / results['bare']:.2f}x bare)")


if __name__ == "__main__":
    main()
