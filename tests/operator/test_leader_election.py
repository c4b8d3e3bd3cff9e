"""Two operator replicas with leader election on the real control plane.

One replica acts, the other watches with warm caches and writes nothing. The leader is
SIGKILLed (or frozen with SIGSTOP, as when its node is cut off from the apiserver) at
the moment a worker fails: the standby takes the Lease and restarts the gang. The time
from the kill to the new leader acting is measured and printed (``-s`` shows it;
docs/operations/high-availability.md states the figure). A leader that stops cleanly
releases the Lease, and a frozen leader that wakes up after losing it exits without
acting.

The default lease settings throughout (12 s lease, 8 s renew deadline, 2 s retry).
The package's own operator runs without leader election and would act too: it is
stopped here, and ``running_operator`` starts it again for the tests after these.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.testing import wait_until
from tests.operator.support import (
    Api,
    ChartIdentity,
    OperatorProcess,
    PodAttemptRecorder,
    job_manifest,
)
from tpu_operator.runtime import lease

pytestmark = pytest.mark.integration

LEASE = "tpu-operator-test"
# The defaults of the CLI and the chart (controller-runtime's), stated for the record.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = (
    lease.LEASE_DURATION,
    lease.RENEW_DEADLINE,
    lease.RETRY_PERIOD,
)
# The first attempt runs until a worker is killed; the second finishes at once.
COMMAND = 'if [ "$TPU_OPERATOR_RESTART_ATTEMPT" = 1 ]; then sleep 300; fi; sleep 1; exit 0'


def metric(process: OperatorProcess, name: str) -> float | None:
    """The sum of a metric's series (None: not exported, or the process does not answer)."""
    try:
        text = process.metrics()
    except OSError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name} ", f"{name}{{"))
    ]
    return sum(values) if values else None


def writes(process: OperatorProcess) -> float:
    """API requests other than reads (a standby's cache audit reads, it never writes), less
    the TokenReviews and SubjectAccessReviews its metrics endpoint asks for (POSTs that
    store nothing)."""
    text = process.metrics()

    def total(prefix: str, keep=lambda line: True) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix) and keep(line)
        )

    requests = total("tpu_operator_api_requests_total{", lambda line: 'verb="GET"' not in line)
    return requests - total("tpu_operator_metrics_auth_reviews_total{")


def leads(process: OperatorProcess) -> bool:
    return metric(process, "tpu_operator_leader") == 1


def reconciles(process: OperatorProcess) -> float:
    return metric(process, "tpu_operator_reconcile_duration_seconds_count") or 0.0


class Candidates:
    """Two replicas acting as the chart's ServiceAccount, with the chart's RBAC rendered for
    a release in the test's namespace whose Lease is ``LEASE``: the Role lets them create
    Leases there and read and renew that one only."""

    def __init__(self, cluster, namespace: str, directory: Path) -> None:
        self.identity = ChartIdentity(
            cluster,
            directory,
            release=f"le-{uuid.uuid4().hex[:8]}",
            namespace=namespace,
            values={"leaderElection": {"leaseName": LEASE}},
        ).create()
        args = [
            "--leader-elect",
            f"--leader-elect-namespace={namespace}",
            f"--leader-elect-lease-name={LEASE}",
            f"--leader-elect-lease-duration={LEASE_DURATION}",
            f"--leader-elect-renew-deadline={RENEW_DEADLINE}",
            f"--leader-elect-retry-period={RETRY_PERIOD}",
        ]
        self.a = self.identity.operator(directory / "a.log", args)
        self.b = self.identity.operator(directory / "b.log", args)

    def start_leader_and_standby(self) -> None:
        self.a.start()
        wait_until(lambda: leads(self.a), timeout=30, message=f"a to lead ({self.a.log_path})")
        self.b.start()
        # b answers, lists everything, campaigns: it must stay a standby.
        wait_until(
            lambda: metric(self.b, "tpu_operator_leader") == 0,
            timeout=30,
            message="b to report itself as a standby",
        )

    def stop(self) -> None:
        for process in (self.a, self.b):
            process.thaw()
            process.stop()
        self.identity.delete()


@pytest.fixture
def candidates(cluster, crds, operator, namespace, tmp_path) -> Iterator[Candidates]:
    operator.stop()  # the package's operator has no leader election
    pair = Candidates(cluster, namespace, tmp_path)
    try:
        yield pair
    finally:
        pair.stop()


def gang(tpu: Api, namespace: str, name: str) -> None:
    tpu.apply(
        job_manifest(
            name,
            namespace,
            {"type": "v5litepod-8", "chipsPerHost": 4},
            COMMAND,
            failurePolicy={"maxRestarts": 2, "backoffSeconds": 0},
        )
    )
    tpu.wait_phase(namespace, name, "Running", timeout=60)


def watch_failover(
    tpu: Api, namespace: str, name: str, standby: OperatorProcess, since: float
) -> dict[str, float]:
    """Seconds from ``since`` until the standby leads, first reconciles, and has restarted
    the gang (attempt 2 written to the job's status)."""
    marks: dict[str, float] = {}

    def done() -> bool:
        now = time.monotonic() - since
        if "leads" not in marks and leads(standby):
            marks["leads"] = now
        if "reconciles" not in marks and reconciles(standby) > 0:
            marks["reconciles"] = now
        if "restarted" not in marks and tpu.status(namespace, name).get("attempt") == 2:
            marks["restarted"] = now
        return len(marks) == 3

    wait_until(
        done,
        timeout=LEASE_DURATION + 30,
        interval=0.1,
        message=lambda: f"the standby to take over; so far {marks} ({standby.log_path})",
    )
    return marks


def test_one_replica_acts_and_the_standby_restarts_a_failing_gang_when_the_leader_is_killed(
    tpu: Api, namespace, cluster, candidates: Candidates
):
    candidates.start_leader_and_standby()
    leader, standby = candidates.a, candidates.b
    with PodAttemptRecorder(tpu, namespace) as recorder:
        gang(tpu, namespace, "gang")
        # Only the leader acted: the standby reconciled nothing and wrote nothing.
        assert reconciles(leader) > 0 and writes(leader) > 0
        assert reconciles(standby) == 0 and writes(standby) == 0
        assert metric(standby, "tpu_operator_jobs") is None  # cluster state: leader only
        seen_by_leader = leader.health()["leader"]
        seen_by_standby = standby.health()["leader"]
        assert seen_by_leader["leading"] and seen_by_leader["acting"]
        assert not seen_by_standby["leading"] and not seen_by_standby["acting"]
        assert seen_by_standby["holder"] == seen_by_leader["identity"]

        killed = time.monotonic()
        leader.kill()
        cluster.agent.kill_pod(namespace, "gang-0-1", exit_code=1)
        marks = watch_failover(tpu, namespace, "gang", standby, killed)
        done = tpu.wait_phase(namespace, "gang", "Succeeded", timeout=60)
    print(f"\nFAILOVER sigkill: {marks}")
    assert recorder.overlaps == [], f"attempts 1 and 2 alive together: {recorder.overlaps[0]}"
    assert done["attempt"] == 2 and done["restarts"] == 1
    assert done["lastFailure"]["pod"] == "gang-0-1" and done["lastFailure"]["exitCode"] == 1
    # Bounded by the lease: a standby waits leaseDuration after the last renewal it saw,
    # and tries every retry period.
    assert marks["restarted"] <= LEASE_DURATION + RETRY_PERIOD + 3
    assert "leading: took Lease" in standby.log_path.read_text()


def test_a_partitioned_leader_is_replaced_and_exits_without_acting_when_it_wakes(
    tpu: Api, namespace, cluster, candidates: Candidates
):
    candidates.start_leader_and_standby()
    leader, standby = candidates.a, candidates.b
    with PodAttemptRecorder(tpu, namespace) as recorder:
        gang(tpu, namespace, "cut")
        frozen = time.monotonic()
        leader.freeze()
        cluster.agent.kill_pod(namespace, "cut-0-0", exit_code=1)
        marks = watch_failover(tpu, namespace, "cut", standby, frozen)
        print(f"\nFAILOVER partition: {marks}")
        running = tpu.wait_phase(namespace, "cut", ("Running", "Succeeded"), timeout=60)
        # The partition heals: the old leader finds its Lease gone, stops and exits.
        leader.thaw()
        assert leader.process is not None
        assert leader.process.wait(30) == 1
        done = tpu.wait_phase(namespace, "cut", "Succeeded", timeout=60)
    log = leader.log_path.read_text()
    assert "lost the leadership" in log and "exiting: the leadership was lost" in log
    assert recorder.overlaps == []
    assert running["attempt"] == 2
    assert done["attempt"] == 2 and done["restarts"] == 1
    assert marks["restarted"] <= LEASE_DURATION + RETRY_PERIOD + 3


def test_a_leader_stopped_cleanly_hands_over_within_seconds(
    tpu: Api, namespace, candidates: Candidates
):
    candidates.start_leader_and_standby()
    leader = candidates.a.process
    assert leader is not None
    stopped = time.monotonic()
    leader.terminate()  # SIGTERM: stop acting, then release the Lease
    wait_until(lambda: leads(candidates.b), timeout=30, interval=0.1, message="b to lead")
    handover = time.monotonic() - stopped
    print(f"\nFAILOVER clean stop: {handover:.1f} s")
    assert leader.wait(30) == 0
    assert "released Lease" in candidates.a.log_path.read_text()
    # Not the lease expiry: the released Lease is taken at the standby's next attempt.
    assert handover < LEASE_DURATION
    tpu.apply(job_manifest("after", namespace, {"type": "v5litepod-4"}, "true"))
    tpu.wait_phase(namespace, "after", "Succeeded", timeout=60)
