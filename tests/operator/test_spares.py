"""Spare node pools with real JAX processes: a 2-slice job keeps a spare pool (selected by
label) that its first placement does not take; when a node of slice 1's pool goes
NotReady, slice 1 is recreated on the spare at once, slice 0 restarts in place in the pods
it has, and training resumes from the checkpoint. The broken pool is reported (event,
status.brokenNodePools, condition NodePoolsHealthy, metric) until it heals, then held as
the job's spare in the spare's place (status.spareNodePools). A pool deleted
whole under the middle one of three slices is moved off the same way, through a SIGKILL of
the operator as the move commits, the slices on both sides carried in place.

Workers run ``tpu-worker demo`` (real multi-process JAX on CPU, under the supervisor) in
run-mode pods of the local cluster (six JAX processes for the three slices of v4-16).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from localcluster.pools import Pool
from localcluster.testing import wait_until
from tests.chaos.scenario import Recorder
from tests.operator.test_inplace import demo_job, identities, running_attempt, steps_saved
from tpu_operator import contract

pytestmark = pytest.mark.integration

SPARE_LABEL = "example.com/pool-role"


@pytest.fixture
def spare_pool(cluster, tpu_pools) -> Iterator[Callable[[], str]]:
    """``spare_pool()``: a v4 2x2x2 pool (or ``topology`` of ``vms`` VMs) labelled as a
    spare, named to sort before the test's other pools (a placement that did not keep it
    in reserve would take it first); removed after the test (after ``tpu_pools`` deleted
    the namespace's jobs)."""
    added: list[str] = []

    def add(topology: str = "2x2x2", vms: int = 2) -> str:
        name = f"a{uuid.uuid4().hex[:4]}-spare"
        cluster.agent.add_pool(
            Pool(
                name=name,
                vms=vms,
                accelerator="tpu-v4-podslice",
                topology=topology,
                chips_per_vm=4,
                labels={SPARE_LABEL: "spare"},
            )
        )
        added.append(name)
        return name

    yield add
    for name in added:
        cluster.agent.remove_pool(name)


def moves_to_spare(operator) -> float:
    """``tpu_operator_slice_moves_total{to="spare"}`` as the operator serves it now."""
    found = re.search(
        r'^tpu_operator_slice_moves_total\{to="spare"\} (\S+)$', operator.metrics(), re.M
    )
    return float(found.group(1)) if found else 0.0


def test_a_slice_on_a_broken_pool_moves_to_the_spare_and_the_others_keep_their_pods(
    tpu, namespace, cluster, running_operator, tpu_pools, spare_pool
):
    spare = spare_pool()
    main = tpu_pools(2)
    moves_before = moves_to_spare(running_operator)
    manifest, directory = demo_job(
        namespace,
        "spares",
        "--steps=100000",
        numSlices=2,
        slice={"type": "v4-16"},
        placement={"spares": {"selector": {"matchLabels": {SPARE_LABEL: "spare"}}}},
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "spares", 1, timeout=300)
    # The first placement kept the spare in reserve (it sorts first by name).
    assert sorted(first["nodePools"]) == sorted(main), first
    wait_until(lambda: steps_saved(directory), timeout=300, message="a first checkpoint")
    before = identities(tpu, namespace)
    node = next(p for p in tpu.pods(namespace) if p["metadata"]["name"] == "spares-1-0")["spec"][
        "nodeName"
    ]
    kept, broken = first["nodePools"]
    cluster.agent.make_node_not_ready(node)
    healed = False
    try:
        status = running_attempt(tpu, namespace, "spares", 2, timeout=300)
        assert (status["restartKind"], status["recreatedSlices"]) == ("Mixed", [1]), status
        assert status["lastFailure"]["reason"] == "NodeLost"
        assert status["nodePools"] == [kept, spare], status
        # Slice 0's pods are the ones it had; slice 1's are new, on the spare.
        after = identities(tpu, namespace)
        assert {n: after[n][0] for n in after if n.startswith("spares-0-")} == {
            n: v[0] for n, v in before.items() if n.startswith("spares-0-")
        }
        moved = [p for p in tpu.pods(namespace) if p["metadata"]["name"].startswith("spares-1-")]
        assert len(moved) == 2 and all(
            before[p["metadata"]["name"]][0] != p["metadata"]["uid"] for p in moved
        )
        assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in moved} == {spare}
        # The broken pool is reported: event, status, condition, metric.
        tpu.wait_events(namespace, "spares", "NodePoolUnhealthy")
        (event,) = [
            e["message"]
            for e in tpu.events(namespace, "spares")
            if e["reason"] == "NodePoolUnhealthy"
        ]
        assert f"slice 1: node pool {broken} has 1 of its 2 VMs not ready" in event, event
        assert f"moved to spare node pool {spare}" in event, event
        (report,) = status["brokenNodePools"]
        assert (report["nodePool"], report["slice"], report["movedTo"], report["spare"]) == (
            broken,
            1,
            spare,
            True,
        ), report
        (condition,) = [c for c in status["conditions"] if c["type"] == "NodePoolsHealthy"]
        assert (condition["status"], condition["reason"]) == ("False", "NodePoolUnhealthy")
        assert moves_to_spare(running_operator) == moves_before + 1
        # Attempt 2 rendezvoused across the kept and the new pods and trains on.
        saved_before = max(steps_saved(directory))
        wait_until(
            lambda: max(steps_saved(directory)) > saved_before,
            timeout=300,
            message="attempt 2 to save a checkpoint after the one it resumed from",
        )
        # The broken pool heals: it leaves the report and takes the spare's place.
        cluster.agent.heal_node(node)
        healed = True
        wait_until(
            lambda: not tpu.status(namespace, "spares").get("brokenNodePools"),
            timeout=120,
            message="the healed pool to leave status.brokenNodePools",
        )
        assert tpu.status(namespace, "spares")["spareNodePools"] == [broken]
    finally:
        if not healed:
            cluster.agent.heal_node(node)
    status = tpu.status(namespace, "spares")
    (condition,) = [c for c in status["conditions"] if c["type"] == "NodePoolsHealthy"]
    assert (condition["status"], condition["reason"]) == ("True", "NodePoolsHealthy")
    assert status["attempt"] == 2 and status["phase"] == "Running", status
    assert "Traceback" not in running_operator.tail(400)


def test_a_slice_whose_pool_is_deleted_moves_to_the_spare_through_an_operator_kill(
    tpu, namespace, cluster, running_operator, tpu_pools, spare_pool
):
    """A pool deleted whole under the middle slice of three (its nodes and pods gone with
    it) does not come back: the slice must not wait for it (the job does not ask GKE for
    pools here). Slice 1 is recreated on the spare, slices 0 and 2 restart in place in
    the pods they have, and training resumes from the checkpoint; the operator SIGKILLed
    the moment the move is committed, its successor converges with no worker created
    twice."""
    spare = spare_pool()
    main = tpu_pools(3)
    manifest, directory = demo_job(
        namespace,
        "deleted",
        "--steps=100000",
        "--batch-size=24",  # data-parallel over 3 slices
        numSlices=3,
        slice={"type": "v4-16"},
        placement={"spares": {"nodePools": [spare]}},
    )
    tpu.apply(manifest)
    first = running_attempt(tpu, namespace, "deleted", 1, timeout=300)
    assert sorted(first["nodePools"]) == sorted(main), first
    wait_until(lambda: steps_saved(directory), timeout=300, message="a first checkpoint")
    before = identities(tpu, namespace)
    kept, gone, third = first["nodePools"]
    with Recorder(tpu, namespace) as recorder:
        # Every node of the pool is gone before the operator looks again (frozen
        # meanwhile): the restart finds a pool with no nodes, not one with a VM missing.
        running_operator.freeze()
        try:
            cluster.agent.remove_pool(gone)
        finally:
            running_operator.thaw()
        moved_to = wait_until(
            lambda: (s := tpu.status(namespace, "deleted")).get("attempt") == 2 and s["nodePools"],
            timeout=120,
            interval=0.05,
            message="the move to be committed",
        )
        running_operator.kill()
        running_operator.start()
        status = running_attempt(tpu, namespace, "deleted", 2, timeout=300)
    # Pods carried in place keep the attempt label they were created with, so attempts
    # 1 and 2 live together by design; no worker may have two pods, or be created twice.
    broken = [v for v in recorder.violations if "alive together" not in v]
    assert recorder.snapshots and not broken, broken
    assert moved_to == [kept, spare, third], moved_to
    assert status["lastFailure"]["reason"] == "NodeLost", status["lastFailure"]
    assert (status["restartKind"], status["recreatedSlices"]) == ("Mixed", [1]), status
    assert (status["restarts"], status["nodePools"]) == (1, [kept, spare, third]), status
    after = identities(tpu, namespace)
    for carried in ("deleted-0-", "deleted-2-"):  # the slices on both sides keep their pods
        assert {n: after[n][0] for n in after if n.startswith(carried)} == {
            n: v[0] for n, v in before.items() if n.startswith(carried)
        }, carried
    moved = [p for p in tpu.pods(namespace) if p["metadata"]["name"].startswith("deleted-1-")]
    assert len(moved) == 2, [p["metadata"]["name"] for p in moved]
    assert all(before[p["metadata"]["name"]][0] != p["metadata"]["uid"] for p in moved)
    assert {p["spec"]["nodeSelector"][contract.NODE_LABEL_NODEPOOL] for p in moved} == {spare}
    # (The NodePoolGone event, posted after the status write, may have died with the
    # operator: tests/unit/policies/test_failure.py checks its text.)
    # A deleted pool is not reported as broken: it is not there to be given out again.
    assert not status.get("brokenNodePools"), status
    saved_before = max(steps_saved(directory))
    wait_until(
        lambda: max(steps_saved(directory)) > saved_before,
        timeout=300,
        message="attempt 2 to save a checkpoint after the one it resumed from",
    )
    assert "Traceback" not in running_operator.tail(400)
