"""The chaos tier: the operator under seeded API faults, SIGKILLs, an apiserver restart
and a leader failover; the invariants of :mod:`tests.chaos.scenario` after each.

- ``test_api_faults``: all of the operator's traffic (its requests and kopf's watches)
  goes through the fault proxy (:mod:`localcluster.faultproxy`), which answers a seeded
  share of requests with 429/500/503, resets connections and expires watches, during the
  whole lifecycle of two jobs.
- ``test_429_storm``: every request is answered 429 (``Retry-After: 1``) for 10 s while
  a job is created; the operator's request rate during the storm is compared with its
  rate for the same work without faults (proxy stats; ``-s`` prints the figures).
- ``test_sigkills``: the operator is SIGKILLed at a seeded moment after each step.
- ``test_apiserver_restart``: the kube-apiserver dies in the middle of a gang restart.
- ``test_leader_failover``: two replicas with leader election; the leader is SIGKILLed
  while the job's pods are being created.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import Cluster
from localcluster.faultproxy import FaultProxy, Rates, rate
from localcluster.testing import wait_until
from tests.chaos.scenario import SMALL, V5P, WIDE, Lifecycle, Recorder, seeded
from tests.operator.support import Api, OperatorProcess, job_manifest

pytestmark = pytest.mark.chaos

RATES = Rates(throttle=0.05, internal=0.03, unavailable=0.03, reset=0.03, expire=0.3)
"""About one request in seven fails; a watch expires (30 %) or is cut (3 %) 1-8 s after
it starts, so kopf watches and lists again many times per step."""
STORM_SECONDS = 10.0


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def operators() -> Iterator[list[OperatorProcess]]:
    """The operator processes a test starts; stopped after it."""
    started: list[OperatorProcess] = []
    yield started
    for process in started:
        process.thaw()
        process.stop()


def start_operator(
    operators: list[OperatorProcess], kubeconfig: Path, log: Path, *args: str
) -> OperatorProcess:
    process = OperatorProcess(kubeconfig, log, list(args))
    process.start()
    operators.append(process)
    return process


def test_api_faults(
    tpu: Api,
    chaos_cluster: Cluster,
    chaos_namespace: str,
    seed: int,
    operators: list[OperatorProcess],
    log_dir: Path,
) -> None:
    proxy_config = log_dir / "proxy.kubeconfig"
    with FaultProxy(chaos_cluster.kubeconfig, proxy_config, seed=seed, rates=RATES) as proxy:
        start_operator(operators, proxy_config, log_dir / "operator.log")
        life = Lifecycle(tpu, chaos_cluster, chaos_namespace, lambda: operators)
        with Recorder(tpu, chaos_namespace) as recorder:
            life.run([SMALL, WIDE])
        stats = proxy.stats()
    recorder.assert_clean()
    kinds: dict[str, int] = {}
    for fault in stats["injected"]:
        kinds[fault["kind"]] = kinds.get(fault["kind"], 0) + 1
    requests = sum(sum(c.values()) for c in stats["per_second"].values())
    print(f"\nAPI FAULTS seed {seed}: {requests} requests, injected {kinds}; steps {life.timings}")
    assert sum(kinds.values()) > 0, seeded(f"no fault was injected in {requests} requests")


def test_429_storm(
    tpu: Api,
    chaos_cluster: Cluster,
    chaos_namespace: str,
    seed: int,
    operators: list[OperatorProcess],
    log_dir: Path,
) -> None:
    proxy_config = log_dir / "proxy.kubeconfig"
    with FaultProxy(chaos_cluster.kubeconfig, proxy_config, seed=seed) as proxy:
        operator = start_operator(operators, proxy_config, log_dir / "operator.log")
        life = Lifecycle(tpu, chaos_cluster, chaos_namespace, lambda: operators)
        with Recorder(tpu, chaos_namespace) as recorder:
            # Baseline: the same work (a 2-host job's creation, on a pool of its own)
            # without faults, measured over the same span.
            before = proxy.now()
            tpu.apply(job_manifest(SMALL.name, chaos_namespace, SMALL.shape, "sleep 600"))
            time.sleep(STORM_SECONDS)
            calm = rate(proxy.stats(), before, before + STORM_SECONDS)
            life.wait_reached("calm", SMALL, "Running", 1)

            started = proxy.now()
            proxy.storm("throttle", STORM_SECONDS, retry_after=1)
            tpu.apply(job_manifest(V5P.name, chaos_namespace, V5P.shape, "sleep 600"))
            time.sleep(STORM_SECONDS)
            stats = proxy.stats()
            storm = rate(stats, started, started + STORM_SECONDS)
            late = rate(stats, started + STORM_SECONDS / 2, started + STORM_SECONDS)
            recovered = time.monotonic()
            life.wait_reached("after the storm", V5P, "Running", 1)
            recovery = time.monotonic() - recovered
        throttled = sum(1 for f in stats["injected"] if f["kind"] == "throttle")
    recorder.assert_clean()
    life.assert_no_traceback()
    print(
        f"\n429 STORM seed {seed}: {calm:.1f} requests/s for a job's creation without "
        f"faults; {storm:.1f} requests/s during the 10 s storm ({late:.1f} in its second "
        f"half), {throttled} answered 429; the job Running {recovery:.1f} s after it"
    )
    assert throttled > 0, seeded("the storm answered nothing")
    assert operator.process is not None and operator.process.poll() is None
    # Backing off, the retries thin out: in the storm's second half the operator sends a
    # fraction of what the same work cost without faults (a client without backoff would
    # send more than that, not less).
    assert late < calm / 2, seeded(
        f"no backoff under 429s: {late:.1f} requests/s late in the storm vs {calm:.1f} "
        "for the same work without faults"
    )


def test_sigkills(
    tpu: Api,
    chaos_cluster: Cluster,
    chaos_namespace: str,
    seed: int,
    operators: list[OperatorProcess],
    log_dir: Path,
) -> None:
    rng = random.Random(seed)
    start_operator(operators, chaos_cluster.kubeconfig, log_dir / "operator.log")
    kills: list[tuple[str, float]] = []

    def kill(step: str) -> None:
        delay = round(rng.uniform(0.0, 2.0), 2)
        time.sleep(delay)
        kills.append((step, delay))
        operators[0].kill()
        operators[0].start()

    life = Lifecycle(tpu, chaos_cluster, chaos_namespace, lambda: operators, hook=kill)
    with Recorder(tpu, chaos_namespace) as recorder:
        life.run([SMALL])
    print(f"\nSIGKILLS seed {seed}: kills (step, seconds after it) {kills}; {life.timings}")
    recorder.assert_clean()


def test_apiserver_restart(
    tpu: Api,
    chaos_cluster: Cluster,
    chaos_namespace: str,
    seed: int,
    operators: list[OperatorProcess],
    log_dir: Path,
) -> None:
    rng = random.Random(seed)
    start_operator(operators, chaos_cluster.kubeconfig, log_dir / "operator.log")
    outage: dict[str, float] = {}

    def restart_during_gang_restart(step: str) -> None:
        if step != "gang restart":
            return
        time.sleep(rng.uniform(0.0, 1.0))
        down = round(rng.uniform(2.0, 6.0), 1)
        killed = time.monotonic()
        argv = chaos_cluster.kill_apiserver()
        time.sleep(down)
        chaos_cluster.start_apiserver(argv)
        outage.update(down=down, back_after=round(time.monotonic() - killed, 1))

    # Workers that ignore SIGTERM: the old attempt takes its 2 s grace period to stop, so
    # the apiserver goes down while it is still terminating.
    life = Lifecycle(
        tpu,
        chaos_cluster,
        chaos_namespace,
        lambda: operators,
        hook=restart_during_gang_restart,
        command="trap '' TERM; sleep 600",
    )
    with Recorder(tpu, chaos_namespace) as recorder:
        life.run([SMALL])
    print(f"\nAPISERVER RESTART seed {seed}: {outage}; steps {life.timings}")
    assert outage, seeded("the apiserver was not restarted")
    recorder.assert_clean()


def test_leader_failover(
    tpu: Api,
    chaos_cluster: Cluster,
    chaos_namespace: str,
    seed: int,
    operators: list[OperatorProcess],
    log_dir: Path,
) -> None:
    rng = random.Random(seed)
    args = (
        "--leader-elect",
        f"--leader-elect-namespace={chaos_namespace}",
        "--leader-elect-lease-name=chaos",
    )
    first = start_operator(operators, chaos_cluster.kubeconfig, log_dir / "a.log", *args)
    wait_until(
        lambda: first.health()["leader"]["acting"],
        timeout=30,
        message=seeded("the first replica to lead"),
    )
    start_operator(operators, chaos_cluster.kubeconfig, log_dir / "b.log", *args)
    failover: dict[str, float] = {}

    def kill_leader_mid_creation(step: str) -> None:
        if step != "create":
            return
        # A seeded moment within the creation (the slice and 4 pods take ~1 s to create).
        time.sleep(round(rng.uniform(0.0, 0.5), 2))
        failover["slices_at_kill"] = len(tpu.slices(chaos_namespace))
        failover["pods_at_kill"] = len(tpu.pods(chaos_namespace))
        first.kill()

    life = Lifecycle(
        tpu, chaos_cluster, chaos_namespace, lambda: operators, hook=kill_leader_mid_creation
    )
    with Recorder(tpu, chaos_namespace) as recorder:
        life.run([WIDE])
    print(f"\nLEADER FAILOVER seed {seed}: {failover}; steps {life.timings}")
    recorder.assert_clean()
