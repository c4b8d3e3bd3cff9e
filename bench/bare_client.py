"""The bare client: the practical limit the operator's pod creation is measured against.

A separate process (so it never shares a GIL with the benchmark's observer), driven over
stdin/stdout by ``pod_creation.py``. It uses the official ``kubernetes`` client the way
the operator does: blocking calls in a pool of ``--concurrency`` threads with a urllib3
connection pool of the same size, dict bodies in, raw JSON out (``_preload_content=False``,
no model deserialization). Pods come ready-made in a JSON file (built with the operator's
own ``worker_pod`` builder), so the bare client creates exactly what the operator would.

Protocol: it warms its connections, prints ``ready`` and waits for a line on stdin; then
it creates the first attempt's pods and prints ``created``. With ``--restart`` it then
watches the pods and, when one of them fails, plays a minimal gang restart: deletes every
pod of the first attempt (concurrent DELETEs), waits until the watch saw them all gone,
creates the second attempt's pods and prints ``recreated``. ``--delete collection`` deletes with
one DELETE of the collection instead (what the operator does). Each line is JSON with the
monotonic time of the event.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes
from kubernetes.client import ApiException, CoreV1Api
from kubernetes.watch.watch import iter_resp_lines


def emit(event: str, **fields: Any) -> None:
    """One protocol line: the event, its monotonic time and this process's CPU seconds."""
    line = {"event": event, "t": time.monotonic(), "cpu": time.process_time(), **fields}
    print(json.dumps(line), flush=True)


class Bare:
    def __init__(self, kubeconfig: str, namespace: str, concurrency: int) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        config.connection_pool_maxsize = concurrency
        self.api = CoreV1Api(kubernetes.client.ApiClient(config))
        self.namespace = namespace
        self.pool = ThreadPoolExecutor(max_workers=concurrency)
        self.concurrency = concurrency

    def run_all(self, call: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        return list(self.pool.map(call, items))

    def warm(self) -> None:
        """Open every connection of the pool (the operator's are warm too)."""
        self.run_all(lambda _: self.api.read_namespace(self.namespace, _preload_content=False).data,
                     range(self.concurrency))  # fmt: skip

    def create(self, pod: dict[str, Any]) -> None:
        try:
            response = self.api.create_namespaced_pod(self.namespace, pod, _preload_content=False)
            json.loads(response.data)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete(self, name: str) -> None:
        try:
            response = self.api.delete_namespaced_pod(name, self.namespace, _preload_content=False)
            json.loads(response.data)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_collection(self, selector: str) -> None:
        response = self.api.delete_collection_namespaced_pod(
            self.namespace, label_selector=selector, _preload_content=False
        )
        json.loads(response.data)


class GangWatch:
    """Pods of the namespace by name: attempt label, phase, alive or not."""

    def __init__(self, bare: Bare, attempt_label: str) -> None:
        self.bare = bare
        self.attempt_label = attempt_label
        self.alive: dict[str, str] = {}
        self.failed = threading.Event()
        self.changed = threading.Condition()
        listing = bare.api.list_namespaced_pod(bare.namespace, _preload_content=False)
        body = json.loads(listing.data)
        for pod in body["items"]:
            self._apply("ADDED", pod)
        self.version = body["metadata"]["resourceVersion"]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        """Follow the stream; when the apiserver ends it (it drops watchers that fall behind
        a burst of events), go on from the last version seen, as client-go does."""
        while True:
            response = self.bare.api.list_namespaced_pod(
                self.bare.namespace,
                watch=True,
                resource_version=self.version,
                timeout_seconds=3600,
                _preload_content=False,
            )
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"pod watch: {event['object']}")
                self._apply(event["type"], event["object"])
                self.version = event["object"]["metadata"]["resourceVersion"]

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self.changed:
            if kind == "DELETED":
                self.alive.pop(name, None)
            else:
                self.alive[name] = (pod["metadata"].get("labels") or {}).get(self.attempt_label, "")
                if (pod.get("status") or {}).get("phase") == "Failed":
                    self.failed.set()
            self.changed.notify_all()

    def wait_gone(self, names: set[str]) -> None:
        with self.changed:
            self.changed.wait_for(lambda: not names & set(self.alive), timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--pods", required=True, help="JSON: {first: [pods], second: [pods]}")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--attempt-label", default="tpu-operator.dev/restart-attempt")
    parser.add_argument(
        "--delete",
        choices=["each", "collection"],
        default="each",
        help="gang restart: concurrent DELETE per pod, or one DELETE of the collection "
        "(by the attempt label, as the operator does)",
    )
    args = parser.parse_args()
    with open(args.pods) as handle:
        pods = json.load(handle)
    bare = Bare(args.kubeconfig, args.namespace, args.concurrency)
    bare.warm()
    gang = GangWatch(bare, args.attempt_label) if args.restart else None
    emit("ready")
    sys.stdin.readline()
    emit("go")
    bare.run_all(bare.create, pods["first"])
    emit("created")
    if gang is None:
        return
    gang.failed.wait()
    emit("failure-seen")
    names = {p["metadata"]["name"] for p in pods["first"]}
    if args.delete == "each":
        bare.run_all(bare.delete, sorted(names))
    else:
        attempt = pods["first"][0]["metadata"]["labels"][args.attempt_label]
        bare.delete_collection(f"{args.attempt_label}={attempt}")
    emit("deleted")
    gang.wait_gone(names)
    emit("gone")
    bare.run_all(bare.create, pods["second"])
    emit("recreated")


if __name__ == "__main__":
    main()
