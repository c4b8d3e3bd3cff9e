"""Benchmark: one page of a metadata-only list of TPUSlices, decoded two ways.

The cache audit lists every TPUJob's and TPUSlice's metadata once a minute
(``runtime/audit.py``); the operator's Services are listed at every resync. A 12,736-host
job has 199 TPUSlices: 0.4 MB a page, most of it each slice's managed fields (about 60
nested objects a slice). Side by side in one process, over the same page:

- ``orjson + pick``: what ``Kube.list_metadata`` did before: the whole page decoded
  with orjson, then each item's ``LISTED_FIELDS`` picked out;
- ``typed``: ``kube.listed_metadata``, msgspec decoding straight into those fields.

The page's items are made like the TPUSlices of ``bench/scale.py``'s job: metadata and
managed fields as the apiserver (v1.36) served them for one of its slices.
The garbage collector is set as the operator sets it (``collector.tune``, threshold
``--gc-threshold``; 0 keeps CPython's 700). Figures: microseconds per page (best of
``--repeat`` rounds of ``--number``), the typed decode's ratio to the other, and the
containers each leaves for the garbage collector to track while the page is alive.

    .venv/bin/python bench/metadata_list.py [--sizes 4 64 199 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
from collections.abc import Callable
from typing import Any

import micro
import orjson

from tpu_operator.runtime import collector
from tpu_operator.runtime.kube import LISTED_FIELDS, listed_metadata

MANAGED_FIELDS: list[dict[str, Any]] = [
    {
        "manager": "OpenAPI-Generator",
        "operation": "Update",
        "apiVersion": "tpu-operator.dev/v1alpha1",
        "time": "2026-11-25T18:07:10Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {
                "f:labels": {
                    ".": {},
                    "f:app.kubernetes.io/managed-by": {},
                    "f:tpu-operator.dev/job-name": {},
                    "f:tpu-operator.dev/slice-index": {},
                },
                "f:ownerReferences": {
                    ".": {},
                    'k:{"uid":"9c556c76-0fb2-4d41-b2c3-0db077f4fc81"}': {},
                },
            },
            "f:spec": {
                ".": {},
                "f:attempt": {},
                "f:failurePolicy": {
                    ".": {},
                    "f:backoffSeconds": {},
                    "f:countDisruptions": {},
                    "f:inPlaceTimeoutSeconds": {},
                    "f:maxBackoffSeconds": {},
                    "f:maxRestarts": {},
                    "f:nodeNotReadyTimeoutSeconds": {},
                    "f:restartMode": {},
                },
                "f:jobName": {},
                "f:nodePool": {},
                "f:numSlices": {},
                "f:service": {},
                "f:sliceIndex": {},
                "f:suspend": {},
                "f:template": {
                    ".": {},
                    "f:spec": {".": {}, "f:containers": {}, "f:terminationGracePeriodSeconds": {}},
                },
                "f:type": {},
            },
        },
    },
    {
        "manager": "OpenAPI-Generator",
        "operation": "Update",
        "apiVersion": "tpu-operator.dev/v1alpha1",
        "time": "2026-11-25T18:08:44Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:status": {
                ".": {},
                "f:activePods": {},
                "f:attempt": {},
                "f:conditions": {},
                "f:countedRestarts": {},
                "f:createdAttempt": {},
                "f:message": {},
                "f:nodePool": {},
                "f:observedGeneration": {},
                "f:phase": {},
                "f:ready": {},
                "f:readyWorkers": {},
                "f:restarts": {},
                "f:restartsByReason": {},
                "f:shape": {
                    ".": {},
                    "f:accelerator": {},
                    "f:chips": {},
                    "f:chipsPerHost": {},
                    "f:hosts": {},
                    "f:topology": {},
                    "f:type": {},
                },
                "f:startTime": {},
                "f:terminatingPods": {},
                "f:workers": {},
            }
        },
        "subresource": "status",
    },
]
"""A TPUSlice's managed fields as served (the operator's create and its status writes)."""


def item(index: int) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {
            "name": f"big-{index}",
            "namespace": "scale-op",
            "uid": f"e53328e2-be1c-42df-a3df-{index:012d}",
            "resourceVersion": str(49457 + index),
            "generation": 1,
            "creationTimestamp": "2026-11-25T18:07:10Z",
            "labels": {
                "app.kubernetes.io/managed-by": "tpu-operator",
                "tpu-operator.dev/job-name": "big",
                "tpu-operator.dev/slice-index": str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": "tpu-operator.dev/v1alpha1",
                    "kind": "TPUJob",
                    "name": "big",
                    "uid": "9c556c76-0fb2-4d41-b2c3-0db077f4fc81",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": MANAGED_FIELDS,
        },
    }


def page(items: int) -> bytes:
    return json.dumps(
        {
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "52671"},
            "items": [item(i) for i in range(items)],
        }
    ).encode()


def pick(raw: bytes) -> tuple[list[dict[str, Any]], str | None]:
    decoded = orjson.loads(raw)
    items = []
    for entry in decoded.get("items") or []:
        meta = entry.get("metadata") or {}
        items.append({k: meta[k] for k in LISTED_FIELDS if k in meta})
    return items, (decoded.get("metadata") or {}).get("continue")


def tracked(decode: Callable[[bytes], object], raw: bytes) -> int:
    """Containers the garbage collector tracks once ``raw`` is decoded (whole, before
    anything is picked out of it)."""
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        kept = decode(raw)
        after = gc.get_count()[0]
        del kept
    finally:
        gc.enable()
    return after - before


def measure(items: int, number: int, repeat: int) -> str:
    raw = page(items)
    assert pick(raw) == listed_metadata(raw), "both keep the same fields"
    slow = micro.best_us(lambda _: pick(raw), number, repeat)
    fast = micro.best_us(lambda _: listed_metadata(raw), number, repeat)
    whole, typed = tracked(orjson.loads, raw), tracked(listed_metadata, raw)
    return (
        f"| {items:,} | {len(raw) / 1024:,.0f} | {slow:,.0f} | {fast:,.0f} | "
        f"{fast / slow:.2f} | {whole:,} | {typed:,} |"
    )


def gc_threshold(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], None]:
    parser.add_argument("--gc-threshold", type=int, default=collector.DEFAULT_THRESHOLD)
    return lambda args: collector.tune(args.gc_threshold)


def main() -> None:
    micro.table(
        __doc__,
        [
            "slices",
            "page KB",
            "orjson + pick, us",
            "typed, us",
            "typed / orjson + pick",
            "containers tracked: whole page",
            "typed",
        ],
        measure,
        sizes=[4, 64, 199, 1000],
        number=20,
        setup=gc_threshold,
    )


if __name__ == "__main__":
    main()
