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
  which ``kubectl describe`` shows), and in env the key's id and the pod's UID: the
  supervisor uses only a key with that id (so not one from a Secret someone else made
  under that name) and accepts only requests signed for its own pod.

The Secret's name carries the key's id (``<job>-control-<key id>``), which only the
operator can compute: nobody can create a Secret of that name before the operator does,
and one made later (after deleting the operator's) cannot hold a key with that id. The
Secret is immutable.
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
DEFAULT_STOP_GRACE_SECONDS = 30.0
"""The stop grace of a template without terminationGracePeriodSeconds (Kubernetes' own
default)."""
MAX_STOP_GRACE_SECONDS = 300.0
"""The ceiling on the stop grace of an in-place restart, whatever the template says."""


@dataclass(frozen=True)
class Supervision:
    """How a slice's worker pods are supervised."""

    secret: str
    """The Secret holding the job's control key."""
    key_id: str
    """The id of that key (``supervision.key_id``): the only key the supervisor uses."""
    port: int = contract.DEFAULT_CONTROL_PORT
    await_start: bool = False
    """The supervisor starts no training process until the operator's start command (a
    pod created while its job restarts in place)."""


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


def supervision_refused(
    template: dict[str, Any], namespace: str, policy_namespaces: frozenset[str] | None
) -> str | None:
    """Why the pods of ``template`` in ``namespace`` must not run the supervisor although
    they could, or None. Where a NetworkPolicy guards the control port
    (``policy_namespaces``, the chart's ``inPlaceRestarts.networkPolicy``), a pod it cannot
    guard gets none: a hostNetwork pod's port is on its node's address, where no
    NetworkPolicy applies, and a namespace without the policy has none. Such a job's
    restarts recreate its pods."""
    if policy_namespaces is None:
        return None
    if (template.get("spec") or {}).get("hostNetwork"):
        return (
            "in-place restarts are off for hostNetwork pods: their control port would be on "
            "the node's address, which the control-port NetworkPolicy cannot guard"
        )
    if namespace not in policy_namespaces:
        return (
            f"in-place restarts are off in namespace {namespace}: it has no control-port "
            "NetworkPolicy (inPlaceRestarts.networkPolicy.namespaces)"
        )
    return None


def stop_grace(template_spec: dict[str, Any]) -> float:
    """Seconds a training process gets between SIGTERM and SIGKILL when an in-place
    restart stops it: the pod's terminationGracePeriodSeconds (default 30), at most
    ``MAX_STOP_GRACE_SECONDS``."""
    grace = template_spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
        return DEFAULT_STOP_GRACE_SECONDS
    return min(float(grace), MAX_STOP_GRACE_SECONDS)


def key_secret_name(job_name: str, key_id: str) -> str:
    """Name of a job's control-key Secret: the job's name and its key's id (which only
    the operator can compute, so the name is unknown until the Secret exists)."""
    return f"{job_name}-control-{key_id}"


def key_secret(
    *, name: str, namespace: str, job_name: str, owner: dict[str, Any], key: bytes
) -> dict[str, Any]:
    """The Secret holding a job's control key (owned by the job, deleted with it;
    immutable)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
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
    ours = (
        contract.ENV_CONTROL_PORT,
        contract.ENV_CONTROL_KEY_ID,
        contract.ENV_POD_UID,
        contract.ENV_AWAIT_START,
    )
    env = [e for e in worker.get("env") or [] if e.get("name") not in ours]
    worker["env"] = [
        *env,
        {"name": contract.ENV_CONTROL_PORT, "value": str(how.port)},
        {"name": contract.ENV_CONTROL_KEY_ID, "value": how.key_id},
        {"name": contract.ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    if how.await_start:
        worker["env"].append({"name": contract.ENV_AWAIT_START, "value": "true"})
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
