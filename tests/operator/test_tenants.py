"""Pods that only look like the operator's workers grant nothing (``runtime/ownership.py``).

A tenant who can create pods gives one the operator's labels: in another namespace,
pinned to a job's node pool (it would hold the pool for every job if labels counted); in
the job's own namespace, as a copy of a worker of the previous attempt (it would be
counted in the gang, deleted as stale, and hold back the next attempt). Each is kept
Pending by a node selector no node matches, so it competes for nothing.
"""

from __future__ import annotations

import pytest

from localcluster.testing import wait_until
from tests.operator.support import Api, scratch_namespace
from tests.operator.test_pool_handover import slow_job, wait_running_on
from tpu_operator import contract

pytestmark = pytest.mark.integration

NOWHERE = {"test.tpu-operator.dev/no-such-node": "true"}


def look_alike(name: str, namespace: str, labels: dict[str, str], pool: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeSelector": {contract.NODE_LABEL_NODEPOOL: pool, **NOWHERE},
            "containers": [{"name": "worker", "image": "unused.local/worker"}],
        },
    }


@pytest.fixture
def other_namespace(tpu: Api, namespace: str):
    yield from scratch_namespace(tpu, f"{namespace}-b"[:63])


def test_a_labelled_pod_in_another_namespace_does_not_hold_a_pool(
    tpu, namespace, other_namespace, running_operator, tpu_pools
):
    (pool,) = tpu_pools(1)
    labels = {
        contract.LABEL_SLICE_NAME: "squatter-0",
        contract.LABEL_JOB_NAME: "squatter",
        contract.LABEL_SLICE_INDEX: "0",
        contract.LABEL_WORKER_INDEX: "0",
        contract.LABEL_RESTART_ATTEMPT: "1",
    }
    tpu.raw.call(
        "POST",
        f"/api/v1/namespaces/{other_namespace}/pods",
        look_alike("squatter-0-0", other_namespace, labels, pool),
    )
    tpu.apply(slow_job("victim", namespace, stop=0.5))
    wait_running_on(tpu, namespace, "victim", pool)


def test_a_forged_worker_in_the_jobs_namespace_is_not_counted_deleted_or_waited_for(
    tpu, namespace, running_operator, tpu_pools
):
    (pool,) = tpu_pools(1)
    tpu.apply(slow_job("gang", namespace, stop=0.5))
    wait_running_on(tpu, namespace, "gang", pool)
    worker = next(
        p
        for p in tpu.pods(namespace)
        if p["metadata"]["labels"][contract.LABEL_WORKER_INDEX] == "0"
    )
    # A copy of worker 0 of attempt 1 (labels, pool), with a TPUSlice owner reference that
    # names the slice but not its UID, and one with none at all.
    labels = dict(worker["metadata"]["labels"])
    for name, owner_uid in (
        ("forged-a", "00000000-0000-0000-0000-000000000000"),
        ("forged-b", None),
    ):
        pod = look_alike(name, namespace, labels, pool)
        if owner_uid:
            pod["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": contract.SLICE_KIND,
                    "name": labels[contract.LABEL_SLICE_NAME],
                    "uid": owner_uid,
                }
            ]
        tpu.raw.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    status = tpu.status(namespace, "gang")
    assert (status["phase"], status["activePods"]) == ("Running", 2), status
    # A gang restart: attempt 1's pods go, and attempt 2 starts although the look-alikes
    # of attempt 1 are still there (the operator's own stale pods would hold it back).
    tpu.raw.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{worker['metadata']['name']}")
    restarted = wait_until(
        lambda: (
            (s := tpu.status(namespace, "gang")).get("attempt") == 2
            and s.get("phase") == "Running"
            and s
        ),
        timeout=90,
        message=lambda: f"the job to run attempt 2: {tpu.status(namespace, 'gang')}",
    )
    assert restarted["activePods"] == 2, restarted
    names = {p["metadata"]["name"]: p for p in tpu.pods(namespace)}
    # forged-a's owner (a TPUSlice UID that does not exist) is garbage-collected by
    # Kubernetes itself; forged-b has no owner and stays, untouched by the operator.
    assert "forged-b" in names and not names["forged-b"]["metadata"].get("deletionTimestamp")
