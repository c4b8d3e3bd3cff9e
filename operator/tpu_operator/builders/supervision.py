"""What a supervised worker pod gets, and the Secret with its job's control key (pure).

A worker container that runs ``tpu-worker`` with ``TPU_OPERATOR_CONTROL_PORT`` set runs
as a supervisor: it keeps the container alive, runs the training as a child process and
takes commands (stop, start an attempt, checkpoint) on its control port, signed with the
job's key (``tpu_operator.supervision``). The operator gives such a container:

- the control port (named ``control``) and its env;
- a readiness probe on the supervisor's ``/readyz`` every second: ready while the
  training process runs, so a process that exits turns the pod NotReady within about a
  second and the pod watch tells the operator, which then asks the supervisor why;
- the job's key, mounted read-only from a Secret the operator creates (never in env,
  which ``kubectl describe`` shows).
"""

from __future__ import annotations

import base64
import copy
import posixpath
from dataclasses import dataclass
from typing import Any

from tpu_operator import contract, supervision

READINESS_PERIOD_SECONDS = 1
"""The probe's period: how soon the kubelet reports a training process that stopped."""


@dataclass(frozen=True)
class Supervision:
    """How a slice's worker pods are supervised."""

    secret: str
    """The Secret holding the job's control key."""
    port: int = contract.DEFAULT_CONTROL_PORT


def runs_supervisor(template: dict[str, Any], mode: str) -> bool:
    """Whether the worker container of ``template`` runs the supervisor under ``mode``
    (failurePolicy.restartMode): Auto when its command is ``tpu-worker`` (or ``python -m
    tpu_worker``), InPlace always (the image's entrypoint runs tpu-worker), Recreate
    never."""
    if mode == "Recreate":
        return False
    if mode == "InPlace":
        return True
    containers = ((template.get("spec") or {}).get("containers")) or []
    worker = next((c for c in containers if c.get("name") == contract.WORKER_CONTAINER), None)
    command = list((worker or {}).get("command") or [])
    if not command or not isinstance(command[0], str):
        return False
    if posixpath.basename(command[0]) == "tpu-worker":
        return True
    return "-m" in command[:-1] and command[command.index("-m") + 1] == "tpu_worker"


def key_secret_name(job_name: str, job_uid: str) -> str:
    """Name of a job's control-key Secret (the UID keeps a recreated job's key apart)."""
    return f"{job_name}-control-{job_uid[:8]}"


def key_secret(
    *, name: str, namespace: str, job_name: str, owner: dict[str, Any], key: bytes
) -> dict[str, Any]:
    """The Secret holding a job's control key (owned by the job, deleted with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
                contract.LABEL_JOB_NAME: job_name,
                contract.LABEL_CONTROL_KEY: "true",
            },
            "ownerReferences": [owner],
        },
        "data": {contract.CONTROL_KEY_FILE: base64.b64encode(key).decode()},
    }


def supervise_container(container: dict[str, Any], how: Supervision) -> dict[str, Any]:
    """The worker container with the control port, its env, readiness probe and key."""
    worker = copy.deepcopy(container)
    env = [e for e in worker.get("env") or [] if e.get("name") != contract.ENV_CONTROL_PORT]
    worker["env"] = [*env, {"name": contract.ENV_CONTROL_PORT, "value": str(how.port)}]
    ports = [p for p in worker.get("ports") or [] if p.get("name") != contract.PORT_NAME_CONTROL]
    ports.append({"name": contract.PORT_NAME_CONTROL, "containerPort": how.port, "protocol": "TCP"})
    worker["ports"] = ports
    worker["readinessProbe"] = {
        "httpGet": {"path": supervision.READY_PATH, "port": contract.PORT_NAME_CONTROL},
        "periodSeconds": READINESS_PERIOD_SECONDS,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 1,
    }
    mounts = [
        m for m in worker.get("volumeMounts") or [] if m.get("name") != contract.CONTROL_VOLUME
    ]
    mounts.append(
        {"name": contract.CONTROL_VOLUME, "mountPath": contract.CONTROL_KEY_DIR, "readOnly": True}
    )
    worker["volumeMounts"] = mounts
    return worker


def key_volume(how: Supervision) -> dict[str, Any]:
    """The pod volume with the job's key."""
    return {"name": contract.CONTROL_VOLUME, "secret": {"secretName": how.secret}}
