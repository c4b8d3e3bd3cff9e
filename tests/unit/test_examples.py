"""The examples and the docs name one set of Kueue queues: every ``kueue.x-k8s.io/queue-name``
they write is a LocalQueue of examples/kueue/queues.yaml, and its ClusterQueue has a flavor
for the job's slice shape, so an example applied with the example queues can be admitted.

(Every example is also applied server-side against the CRDs and Kueue's webhooks in the
kueue tier: tests/kueue/test_kueue.py.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_operator import contract
from tpu_operator.api.shape import ShapeFields

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUEUES = EXAMPLES / "kueue" / "queues.yaml"
QUEUE_LABEL = re.compile(re.escape(contract.LABEL_KUEUE_QUEUE) + r":\s*([A-Za-z0-9.-]+)")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kueue_objects() -> dict[str, dict[str, dict[str, Any]]]:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in documents(QUEUES):
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return by_kind


def test_every_queue_name_in_the_examples_and_docs_is_an_example_local_queue():
    local_queues = set(kueue_objects()["LocalQueue"])
    written = {}
    for path in [*EXAMPLES.rglob("*.yaml"), REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        for name in QUEUE_LABEL.findall(path.read_text()):
            written.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert written, "no example names a queue"
    unknown = {name: paths for name, paths in written.items() if name not in local_queues}
    assert not unknown, f"queue names that are no LocalQueue of {QUEUES.name}: {unknown}"


def test_every_queued_example_job_has_a_flavor_for_its_shape():
    objects = kueue_objects()
    local_queues, cluster_queues = objects["LocalQueue"], objects["ClusterQueue"]
    flavors = objects["ResourceFlavor"]
    queued = []
    for path in EXAMPLES.rglob("*.yaml"):
        for doc in documents(path):
            queue = (doc.get("metadata", {}).get("labels") or {}).get(contract.LABEL_KUEUE_QUEUE)
            if doc.get("kind") != contract.JOB_KIND or queue is None:
                continue
            queued.append(path.name)
            cluster_queue = cluster_queues[local_queues[queue]["spec"]["clusterQueue"]]
            shape = ShapeFields.model_validate(doc["spec"]["slice"]).resolve()
            labels = {
                contract.NODE_LABEL_ACCELERATOR: shape.accelerator,
                contract.NODE_LABEL_TOPOLOGY: shape.topology,
            }
            offered = [
                f["name"]
                for group in cluster_queue["spec"]["resourceGroups"]
                for f in group["flavors"]
                if labels.items() <= flavors[f["name"]]["spec"]["nodeLabels"].items()
            ]
            assert offered, f"{path.name}: no flavor of ClusterQueue for {labels}"
    assert sorted(queued) == ["kueue-v5p-multislice.yaml", "v5p-multislice.yaml"]
