"""Leader election: settings, the fenced Lease lock over the library's election, two
candidates on one Lease (one leads, release hands over, a hung leader fences itself),
the leader metric and the CLI flags.

The candidates run the real ``kubernetes.leaderelection`` code in threads against an
in-memory Lease store that answers like the apiserver (404, 409 on a stale
resourceVersion). The library requires a retry period of at least 1 s, so the timed
tests use the shortest valid settings: lease 2 s, renew deadline 1.5 s, retry 1 s.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes.client import Configuration, V1Lease, V1ObjectMeta
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection.electionconfig import Config
from kubernetes.leaderelection.leaderelection import LeaderElection
from prometheus_client import generate_latest

from tpu_operator import cli
from tpu_operator.runtime.leader import (
    FencedLeaseLock,
    LeaderElector,
    LeaseSettings,
    TimedApi,
    default_identity,
    default_namespace,
    renewed_within,
)
from tpu_operator.runtime.metrics import OperatorMetrics

pytestmark = pytest.mark.unit

FAST = {"lease_duration": 2, "renew_deadline": 1.5, "retry_period": 1.0}


class LeaseStore:
    """Leases by (namespace, name), with resourceVersions, shared by fake API clients."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], V1Lease] = {}
        self.version = 0
        self.lock = threading.Lock()

    def holder(self, namespace: str = "ops", name: str = "op") -> str | None:
        lease = self.leases.get((namespace, name))
        return lease.spec.holder_identity if lease is not None else None


class FakeLeaseApi:
    """The three ``CoordinationV1Api`` calls the lock makes; ``hang`` makes every request
    wait for its timeout and fail as urllib3 does (an apiserver that stopped answering)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.hang = False
        self.timeouts: list[float | None] = []

    def _enter(self, timeout: float | None) -> None:
        self.timeouts.append(timeout)
        if self.hang:
            time.sleep(timeout or 0)
            raise urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")

    def read_namespaced_lease(self, name: str, namespace: str, _request_timeout=None) -> V1Lease:
        self._enter(_request_timeout)
        with self.store.lock:
            lease = self.store.leases.get((namespace, name))
            if lease is None:
                raise ApiException(status=404, reason="Not Found", body='{"code": 404}')
            return copy.deepcopy(lease)

    def create_namespaced_lease(self, namespace: str, body: V1Lease, _request_timeout=None):
        self._enter(_request_timeout)
        meta = body.metadata
        name = meta["name"] if isinstance(meta, dict) else meta.name
        with self.store.lock:
            if (namespace, name) in self.store.leases:
                raise ApiException(status=409, reason="AlreadyExists", body='{"code": 409}')
            self.store.version += 1
            created = V1Lease(
                metadata=V1ObjectMeta(
                    name=name, namespace=namespace, resource_version=str(self.store.version)
                ),
                spec=copy.deepcopy(body.spec),
            )
            self.store.leases[(namespace, name)] = created
            return copy.deepcopy(created)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: V1Lease, _request_timeout=None
    ) -> V1Lease:
        self._enter(_request_timeout)
        with self.store.lock:
            current = self.store.leases.get((namespace, name))
            if current is None:
                raise ApiException(status=404, reason="Not Found", body='{"code": 404}')
            if body.metadata.resource_version != current.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict", body='{"code": 409}')
            self.store.version += 1
            replaced = copy.deepcopy(body)
            replaced.metadata.resource_version = str(self.store.version)
            self.store.leases[(namespace, name)] = replaced
            return copy.deepcopy(replaced)


def settings(identity: str, **overrides: Any) -> LeaseSettings:
    return LeaseSettings(**{"namespace": "ops", "name": "op", "identity": identity, **overrides})


def election(lock: FencedLeaseLock, lease: LeaseSettings) -> LeaderElection:
    return LeaderElection(
        Config(
            lock,
            lease_duration=lease.lease_duration,
            renew_deadline=lease.renew_deadline,
            retry_period=lease.retry_period,
            onstarted_leading=lambda: None,
            onstopped_leading=lambda: None,
        )
    )


# -- settings -------------------------------------------------------------------------


def test_default_settings_are_valid_and_leave_a_deposed_leader_time_to_notice():
    lease = LeaseSettings(namespace="tpu-system")
    assert (lease.lease_duration, lease.renew_deadline, lease.retry_period) == (12, 8.0, 2.0)
    assert lease.name == "tpu-operator" and lease.problems() == []
    assert lease.request_timeout == 4.0
    # A deposed leader stops acting at the renew deadline; another takes over no sooner
    # than the lease duration after it last saw a renewal: two retry periods in between.
    assert lease.lease_duration - lease.renew_deadline >= 2 * lease.retry_period


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"retry_period": 0.5}, "retry period must be at least 1 s"),
        ({"renew_deadline": 2.4}, "renew deadline (2.4 s) must be longer than 1.2 x"),
        ({"lease_duration": 8}, "lease duration (8 s) must be longer than the renew"),
        ({"namespace": "Not_A_Name"}, "namespace 'Not_A_Name' is not a valid"),
        ({"name": ""}, "lease name '' is not a valid"),
    ],
)
def test_settings_the_library_would_exit_on_are_reported(overrides, problem):
    found = settings("me", **overrides).problems()
    assert len(found) == 1 and problem in found[0]


def test_identity_is_the_pod_name_and_unique_per_process(monkeypatch):
    monkeypatch.setenv("POD_NAME", "tpu-operator-7d9f-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("tpu-operator-7d9f-abcde_") and first != second


def test_namespace_defaults_to_the_pods(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "tpu-system")
    assert default_namespace() == "tpu-system"
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setattr("tpu_operator.runtime.leader.SERVICE_ACCOUNT_NAMESPACE", "/nonexistent")
    assert default_namespace() == "default"


def test_a_leader_may_act_only_within_the_renew_deadline_of_its_last_renewal():
    assert renewed_within(100.0, 109.9, 10.0)
    assert not renewed_within(100.0, 110.0, 10.0)
    assert not renewed_within(None, 0.0, 10.0)


# -- the lock under the library's election -------------------------------------------------


def test_every_request_carries_the_timeout():
    store = LeaseStore()
    api = FakeLeaseApi(store)
    lock = FencedLeaseLock(settings("a"), TimedApi(api, 5.0))
    assert election(lock, settings("a")).try_acquire_or_renew()
    assert api.timeouts and set(api.timeouts) == {5.0}


def test_a_refused_connection_is_a_failed_attempt_not_the_end_of_the_election():
    class Refusing(FakeLeaseApi):
        def read_namespaced_lease(self, *args, **kwargs):
            raise urllib3.exceptions.MaxRetryError(None, "/", "connection refused")

    lock = FencedLeaseLock(settings("a"), Refusing(LeaseStore()))
    assert election(lock, settings("a")).try_acquire_or_renew() is False
    assert lock.renewed_at is None


def test_the_lock_records_renewals_and_writes_nothing_once_closed():
    store = LeaseStore()
    clock = [50.0]
    lock = FencedLeaseLock(settings("a"), FakeLeaseApi(store), clock=lambda: clock[0])
    run = election(lock, settings("a"))
    assert run.try_acquire_or_renew() and lock.renewed_at == 50.0
    assert store.holder() == "a" and lock.holder == "a"
    clock[0] = 52.0
    assert run.try_acquire_or_renew() and lock.renewed_at == 52.0
    version = store.version
    lock.closed = True
    clock[0] = 54.0
    assert run.try_acquire_or_renew() is False
    assert store.version == version and lock.renewed_at == 52.0


def test_release_clears_the_holder_only_if_it_is_still_this_candidate():
    store = LeaseStore()
    a = FencedLeaseLock(settings("a"), FakeLeaseApi(store))
    assert election(a, settings("a")).try_acquire_or_renew()
    assert a.release() and store.holder() is None
    assert store.leases[("ops", "op")].spec.lease_duration_seconds == 1
    # Another candidate takes a Lease without a holder at once (no expiry to wait for).
    b = FencedLeaseLock(settings("b"), FakeLeaseApi(store))
    assert election(b, settings("b")).try_acquire_or_renew() and store.holder() == "b"
    version = store.version
    assert a.release() is False and store.holder() == "b" and store.version == version


def test_a_standby_does_not_take_a_lease_that_is_renewed():
    store = LeaseStore()
    a = FencedLeaseLock(settings("a"), FakeLeaseApi(store))
    b = FencedLeaseLock(settings("b"), FakeLeaseApi(store))
    run_a, run_b = election(a, settings("a")), election(b, settings("b"))
    assert run_a.try_acquire_or_renew()
    assert run_b.try_acquire_or_renew() is False and b.holder == "a"
    assert run_a.try_acquire_or_renew() and store.holder() == "a"


# -- two candidates, real threads -----------------------------------------------------


async def wait_for(condition, within: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > within:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def candidate(store: LeaseStore, identity: str) -> tuple[LeaderElector, FakeLeaseApi]:
    api = FakeLeaseApi(store)
    return LeaderElector(settings(identity, **FAST), Configuration(), api=api), api


def test_one_candidate_leads_and_a_release_hands_over_within_a_retry_period():
    async def scenario() -> float:
        store = LeaseStore()
        a, _ = candidate(store, "a")
        b, _ = candidate(store, "b")
        a.start()
        assert await asyncio.wait_for(a.wait_leading(), 3)
        b.start()
        await asyncio.sleep(1.5)  # b campaigns: the Lease is renewed, b must not lead
        assert a.leading and not b.leading
        assert b.describe() == {"lease": "ops/op", "identity": "b", "holder": "a", "leading": False}
        await a.release()
        assert not a.leading
        handed_over = await wait_for(lambda: b.leading, 3)
        assert store.holder() == "b"
        await b.release()
        return handed_over

    assert asyncio.run(scenario()) <= FAST["retry_period"] + 0.5


def test_a_leader_that_cannot_reach_the_apiserver_stops_before_the_standby_takes_over():
    async def scenario() -> tuple[float, float, list[float]]:
        store = LeaseStore()
        a, a_api = candidate(store, "a")
        b, _ = candidate(store, "b")
        a.start()
        assert await asyncio.wait_for(a.wait_leading(), 3)
        b.start()
        await asyncio.sleep(1.2)
        a_api.hang = True  # partitioned: every request of a hangs until its timeout
        partitioned = time.monotonic()
        overlaps: list[float] = []

        async def watch() -> None:
            while True:
                if a.leading and b.leading:
                    overlaps.append(time.monotonic() - partitioned)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        reason = await asyncio.wait_for(a.wait_lost(), 5)
        fenced = time.monotonic() - partitioned
        assert "no renewal" in reason or "could not be renewed" in reason
        await wait_for(lambda: b.leading, 6)
        took_over = time.monotonic() - partitioned
        watcher.cancel()
        await a.release()
        await b.release()
        return fenced, took_over, overlaps

    fenced, took_over, overlaps = asyncio.run(scenario())
    assert overlaps == [], "both candidates led at once"
    # The fence: renewDeadline after the last renewal (which preceded the cut), noticed
    # within a tick.
    assert fenced <= FAST["renew_deadline"] + 0.75
    # The standby: the lease duration after the last renewal it saw (up to a retry period
    # after the renewal), at its next attempt.
    assert took_over <= FAST["lease_duration"] + 2 * FAST["retry_period"] + 0.5


# -- metrics and flags ------------------------------------------------------------------


def test_a_standby_reports_itself_and_no_cluster_state():
    metrics = OperatorMetrics()
    job = {"metadata": {"namespace": "ns", "name": "j"}, "status": {"phase": "Running"}}
    metrics.watch_phases(lambda: ([job], []))
    leading = [False]
    metrics.watch_leadership(lambda: leading[0])
    standby = generate_latest(metrics.registry).decode()
    assert "tpu_operator_leader 0.0" in standby
    assert "tpu_operator_jobs" not in standby and "tpu_operator_job_phase" not in standby
    leading[0] = True
    leader = generate_latest(metrics.registry).decode()
    assert "tpu_operator_leader 1.0" in leader
    assert 'tpu_operator_jobs{phase="Running"} 1.0' in leader


def test_flags_build_the_lease_settings(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    parser = cli._parser()
    assert cli.lease_settings(parser.parse_args(["run"])) is None
    lease = cli.lease_settings(parser.parse_args(["run", "--leader-elect"]))
    assert lease is not None and lease.namespace == "from-env" and lease.name == "tpu-operator"
    assert lease == LeaseSettings(namespace="from-env", identity=lease.identity)
    lease = cli.lease_settings(
        parser.parse_args(
            [
                "run",
                "--leader-elect",
                "--leader-elect-namespace=ops",
                "--leader-elect-lease-name=op",
                "--leader-elect-lease-duration=8",
                "--leader-elect-renew-deadline=5",
                "--leader-elect-retry-period=1",
            ]
        )
    )
    assert lease is not None
    assert (lease.namespace, lease.name, lease.lease_duration) == ("ops", "op", 8)
    assert (lease.renew_deadline, lease.retry_period) == (5.0, 1.0)


def test_invalid_election_flags_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--leader-elect", "--leader-elect-retry-period=0.5"])
    assert exit_.value.code == 2
    assert "retry period must be at least 1 s" in capsys.readouterr().err
