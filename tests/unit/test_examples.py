"""The examples and the docs name one set of Kueue queues: every ``kueue.x-k8s.io/queue-name``
they write is a LocalQueue of examples/kueue/queues.yaml, and its ClusterQueue has a flavor
for the job's slice shape, so an example applied with the example queues can be admitted.

Every example that checkpoints does so to a volume its worker can write (the worker image
runs as the UID and GID of worker-image/Dockerfile) and that outlives the pods: a
ReadWriteMany claim with the worker's fsGroup, or Cloud Storage through GKE's FUSE CSI
driver with the worker's uid and gid, a ServiceAccount the examples create and the
driver's pod annotation. The local demo's hostPath is the stated exception.

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
from tpu_operator.placement import dynamic

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUEUES = EXAMPLES / "kueue" / "queues.yaml"
QUEUE_LABEL = re.compile(re.escape(contract.LABEL_KUEUE_QUEUE) + r":\s*([A-Za-z0-9.-]+)")
WORKER_USER = re.compile(r"(?m)^USER\s+(\d+):(\d+)\s*$")
CHECKPOINT_DIR = re.compile(r"--checkpoint-dir[= ](\S+)")
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
# Checkpoint volumes that do not outlive the pods, on purpose (their comments say why).
SCRATCH = {
    "local-demo.yaml": "hostPath",  # the local cluster: every node is this machine's disk
}


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
            labels = {contract.NODE_LABEL_ACCELERATOR: shape.accelerator}
            if shape.dynamic is None:
                labels[contract.NODE_LABEL_TOPOLOGY] = shape.topology
            offered = [
                f["name"]
                for group in cluster_queue["spec"]["resourceGroups"]
                for f in group["flavors"]
                if labels.items() <= flavors[f["name"]]["spec"]["nodeLabels"].items()
            ]
            assert offered, f"{path.name}: no flavor of ClusterQueue for {labels}"
            if shape.dynamic is not None:
                # Kueue places a dynamic slice by partition (a Topology with its level),
                # and the queue has the slice admission check that forms its Slice.
                level = contract.partition_id_label(dynamic.level(shape))
                topologies = objects["Topology"]
                assert any(
                    level
                    in [
                        lv["nodeLabel"]
                        for lv in topologies[flavors[f]["spec"]["topologyName"]]["spec"]["levels"]
                    ]
                    for f in offered
                ), f"{path.name}: no flavor with a Topology level {level}"
                checks = [
                    c["name"]
                    for c in cluster_queue["spec"]["admissionChecksStrategy"]["admissionChecks"]
                ]
                assert any(
                    objects["AdmissionCheck"][c]["spec"]["controllerName"]
                    == "accelerator.gke.io/slice"
                    for c in checks
                ), f"{path.name}: its ClusterQueue has no slice admission check"
    assert sorted(queued) == [
        "kueue-tpu7x-super-slice.yaml",
        "kueue-v5p-multislice.yaml",
        "v5p-multislice.yaml",
    ]


def all_documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(path.relative_to(EXAMPLES)), doc)
        for path in sorted(EXAMPLES.rglob("*.yaml"))
        for doc in documents(path)
    ]


def worker_ids() -> tuple[int, int]:
    """The UID and GID the worker image runs as (its Dockerfile's last USER)."""
    *_, (uid, gid) = WORKER_USER.findall((REPO / "worker-image" / "Dockerfile").read_text())
    return int(uid), int(gid)


def checkpointing_workloads() -> list[tuple[str, dict[str, Any], str]]:
    """(file, TPUJob or TPUSlice, checkpoint directory) of every example that checkpoints."""
    found = []
    for name, doc in all_documents():
        if doc["kind"] not in (contract.JOB_KIND, contract.SLICE_KIND):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            words = " ".join([*container.get("command", []), *container.get("args", [])])
            for directory in CHECKPOINT_DIR.findall(words):
                found.append((name, doc, directory))
    return found


def checkpoint_volume(doc: dict[str, Any], directory: str) -> dict[str, Any] | None:
    """The pod volume the worker's checkpoint directory lies on, if any."""
    pod = doc["spec"]["template"]["spec"]
    worker = next(c for c in pod["containers"] if c["name"] == contract.WORKER_CONTAINER)
    mounts = [
        m
        for m in worker.get("volumeMounts", [])
        if directory == m["mountPath"] or directory.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return next(v for v in pod.get("volumes", []) if v["name"] == mount["name"])


CHECKPOINTING = checkpointing_workloads()


def test_the_durable_examples_are_there():
    kinds = {
        name: sorted(k for k in checkpoint_volume(doc, d) or {} if k != "name")
        for name, doc, d in CHECKPOINTING
    }
    assert kinds["checkpoints-pvc.yaml"] == ["persistentVolumeClaim"]
    assert kinds["checkpoints-gcsfuse.yaml"] == ["csi"]
    assert kinds["own-code/tpujob.yaml"] == ["persistentVolumeClaim"]


@pytest.mark.parametrize(
    ("name", "doc", "directory"),
    CHECKPOINTING,
    ids=[f"{name}:{doc['metadata']['name']}" for name, doc, _ in CHECKPOINTING],
)
def test_every_checkpoint_directory_is_on_a_volume_the_worker_can_write_and_keep(
    name, doc, directory
):
    uid, gid = worker_ids()
    volume = checkpoint_volume(doc, directory)
    assert volume is not None, f"{name}: {directory} is on no volume (the image's own disk)"
    pod = doc["spec"]["template"]["spec"]
    objects = {(d["kind"], d["metadata"]["name"]) for _, d in all_documents()}
    if name in SCRATCH:
        assert SCRATCH[name] in volume, f"{name}: {volume}"
    elif "persistentVolumeClaim" in volume:
        claim_name = volume["persistentVolumeClaim"]["claimName"]
        claims = [
            d
            for _, d in all_documents()
            if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim_name
        ]
        assert claims, f"{name}: no example creates the claim {claim_name}"
        assert all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in claims), (
            f"{name}: every worker pod mounts {claim_name}, so it must be ReadWriteMany"
        )
        assert (pod.get("securityContext") or {}).get("fsGroup") == gid, (
            f"{name}: fsGroup {gid} makes the claim writable by the worker's group"
        )
    elif "csi" in volume:
        csi = volume["csi"]
        assert csi["driver"] == GCSFUSE_DRIVER, f"{name}: {csi}"
        options = dict(
            o.split("=", 1) if "=" in o else (o, "")
            for o in csi["volumeAttributes"]["mountOptions"].split(",")
        )
        assert options.get("uid") == str(uid) and options.get("gid") == str(gid), (
            f"{name}: mount the bucket as the worker's uid {uid} and gid {gid}: {options}"
        )
        assert "implicit-dirs" in options
        annotations = doc["spec"]["template"].get("metadata", {}).get("annotations", {})
        assert annotations.get(GCSFUSE_ANNOTATION) == "true", name
        account = pod.get("serviceAccountName")
        assert account and ("ServiceAccount", account) in objects, (
            f"{name}: the bucket is reached as a ServiceAccount an example creates, not {account}"
        )
    else:
        raise AssertionError(f"{name}: checkpoints on {volume}, which does not outlive the pods")
