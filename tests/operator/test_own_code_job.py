"""examples/own-code/tpujob.yaml on the local cluster, checkpointing to the claim of
examples/checkpoints-pvc.yaml: the example's TPUJob and claim as written, the operator
running them, the claim bound by the controller-manager to a volume on this machine.

The local cluster runs commands, not images, so the pods get the example's package on
PYTHONPATH instead of from its image (tests/images/test_images.py runs the image), and
the claim binds to a hostPath PersistentVolume instead of a Filestore share. Suspending the
job deletes its pods (SIGTERM: the module saves); the pods of the resumed job are new,
and training continues from the checkpoint on the claim.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.testing import wait_until
from tests.operator.support import Api
from tpu_operator import contract

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(path: Path, kind: str) -> dict[str, Any]:
    [found] = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return found


def host_volume(name: str, claim: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A PersistentVolume on this machine that the controller-manager binds to ``claim``
    (pre-bound by claimRef, so no other claim takes it)."""
    spec = claim["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": spec["resources"]["requests"],
            "accessModes": spec["accessModes"],
            "storageClassName": spec["storageClassName"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {
                "namespace": claim["metadata"]["namespace"],
                "name": claim["metadata"]["name"],
            },
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
        },
    }


def test_the_own_code_job_checkpoints_to_its_claim_and_resumes_after_a_suspension(
    cluster, tpu: Api, namespace, running_operator, tmp_path
):
    claim = example(EXAMPLES / "checkpoints-pvc.yaml", "PersistentVolumeClaim")
    claim["metadata"]["namespace"] = namespace
    job = example(EXAMPLES / "own-code" / "tpujob.yaml", contract.JOB_KIND)
    job["metadata"]["namespace"] = namespace
    name = job["metadata"]["name"]
    worker = job["spec"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["tpu-worker", "run", "-m", "my_trainer.train"]
    worker.setdefault("env", []).append(
        {"name": "PYTHONPATH", "value": str(EXAMPLES / "own-code")}  # what its image adds
    )
    # Training runs until the test ends it; everything else is the example's.
    worker["args"] = [
        "--steps=100000000" if a.startswith("--steps=") else a for a in worker["args"]
    ]
    [mount] = worker["volumeMounts"]
    directory = tmp_path / "claim"
    volume = f"{namespace}-checkpoints"
    tpu.raw.call("POST", "/api/v1/persistentvolumes", host_volume(volume, claim, directory))
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(claim))
        tpu.apply(job)
        wait_until(
            lambda: (tpu.status(namespace, name).get("progress") or {}).get("step"),
            timeout=240,
            message="the own-code job's first steps in status",
        )
        claimed = tpu.raw.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/checkpoints")
        assert claimed["spec"]["volumeName"] == volume

        tpu.patch_job(namespace, name, {"spec": {"suspend": True}})
        tpu.wait_phase(namespace, name, "Suspended", timeout=120)
        wait_until(lambda: not tpu.pods(namespace), timeout=120, message="the pods to go")
        log = cluster.pod_log(namespace, f"{name}-0-0", "worker").read_text()
        [stopped] = re.findall(r"stopping at step (\d+)", log)
        saved = sorted((directory / name).glob("step_*.npz"))
        assert saved and saved[-1].name == f"step_{int(stopped):08d}.npz", (saved, log)
        assert mount["mountPath"] == "/checkpoints"  # --checkpoint-dir=/checkpoints/<job>

        tpu.patch_job(namespace, name, {"spec": {"suspend": False}})
        resumed = wait_until(
            lambda: re.search(
                rf"starting at step {stopped} of",
                cluster.pod_log(namespace, f"{name}-0-0", "worker").read_text(),
            ),
            timeout=240,
            message=f"the resumed job to start from the checkpoint at step {stopped}",
        )
        assert resumed
        status = wait_until(
            lambda: (
                (s := tpu.status(namespace, name)).get("attempt", 0) >= 2
                and (s.get("progress") or {}).get("step", 0) > int(stopped)
                and s
            ),
            timeout=120,
            message="the resumed job to train on from its checkpoint",
        )
        assert status["phase"] == "Running"
    finally:
        cluster.kubectl("delete", "tpujobs", "--all", "-n", namespace, "--wait=true", timeout=180)
        tpu.raw.request("DELETE", f"/api/v1/persistentvolumes/{volume}")
