"""A multi-host node pool changes hands only when it is really free (issue 15).

A :class:`PoolWatcher` follows every worker pod event of the test's namespace, in the
apiserver's order, and records a violation the moment a pod is created pinned
(``cloud.google.com/gke-nodepool``) to a pool on which a pod of another owner (another
TPUJob or standalone TPUSlice) still exists and has not finished: Pending, Running or
terminating. Each test asserts that no violation was seen, and that the pool really did
change hands (so the check cannot pass vacuously).

Workers are slow to stop, as on real TPU VMs: their SIGTERM handler takes a few seconds
before exiting, so that "the holder is suspended, deleted or finished" and "its pods are
gone" are seconds apart. While a pool's holder stops, the objects waiting for it are
poked (an annotation changes) every few tenths of a second, so the operator is asked again
and again, inside that window, whether the pool is free: the tests do not depend on when
the operator happens to wake a waiter.

Scenarios: (a) 6 jobs, 4 exact-fit pools, random suspend/resume toggles; (b) a job deleted
while another waits for its pool; (c) a job finishing (LeaderWorker success, the other
worker stopped) while another waits; (d) a standalone TPUSlice and a TPUJob taking turns on
one pool; (e) the operator SIGKILLed between a suspend and the pods being gone.

Scenario (a) is randomised: ``POOL_HANDOVER_SEED=<n>`` replays a run; the seed is printed
and named in its failure messages.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from localcluster.testing import wait_until
from tests.operator.support import JOBS, SLICES, Api, OperatorProcess
from tpu_operator import contract

pytestmark = pytest.mark.integration

STOP_SECONDS = 3
"""How long a worker takes to stop after SIGTERM."""
GRACE_SECONDS = 10
"""terminationGracePeriodSeconds of the workers (at least 5 s more than their stop), so
the stop is never cut short by SIGKILL."""
SHAPE = {"type": "v4-16"}
"""tpu-v4-podslice 2x2x2: 2 VMs of 4 chips. No default pool has this shape, so the tests'
jobs land only on the pools they add, and no other test's job lands there."""

# The worker: sleeps until SIGTERM, then takes STOP_SECONDS to stop (less if RELEASE_FILE
# is set and appears). With FINISH_FILE set, process 0 (the leader) exits 0 as soon as
# that file exists.
WORKER = f"""
import os, signal, sys, time
def stop(signum, frame):
    print("SIGTERM: stopping slowly", flush=True)
    deadline = time.monotonic() + float(os.environ.get("STOP_SECONDS", "{STOP_SECONDS}"))
    release = os.environ.get("RELEASE_FILE")
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.1)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
finish = os.environ.get("FINISH_FILE")
leader = os.environ.get("{contract.ENV_PROCESS_ID}") == "0"
print("started", flush=True)
while True:
    if finish and leader and os.path.exists(finish):
        print("leader: done", flush=True)
        sys.exit(0)
    time.sleep(0.2)
"""


def slow_template(env: dict[str, str] | None = None, stop: float = STOP_SECONDS) -> dict[str, Any]:
    env = {**(env or {}), "STOP_SECONDS": str(stop)}
    container = {
        "name": contract.WORKER_CONTAINER,
        "image": "unused.local/worker",
        "command": ["python", "-c", WORKER],
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    grace = max(GRACE_SECONDS, int(stop) + 5)
    return {"spec": {"terminationGracePeriodSeconds": grace, "containers": [container]}}


def slow_job(
    name: str,
    namespace: str,
    *,
    suspend: bool = False,
    env: dict[str, str] | None = None,
    stop: float = STOP_SECONDS,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"slice": SHAPE, "template": slow_template(env, stop), "suspend": suspend, **spec},
    }


def slow_slice(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.SLICE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**SHAPE, "template": slow_template()},
    }


# Watching ---------------------------------------------------------------------------------


class Watch:
    """One apiserver watch (list, then watch from its resourceVersion) in a daemon thread.

    ``on_event(type, object)`` runs in the thread, in the apiserver's order; the initial
    list is delivered as type ``EXISTING``. Any break in the stream's continuity (an
    ERROR event such as 410 Gone, an unexpected HTTP status) is recorded in ``errors``:
    events may have been missed, so the test must not trust what it saw.
    """

    def __init__(
        self,
        api: Api,
        path: str,
        on_event: Callable[[str, dict[str, Any]], None],
        label_selector: str = "",
    ) -> None:
        raw = api.raw
        self._context = ssl.create_default_context(cafile=str(raw.ca))
        self._context.load_cert_chain(str(raw.cert), str(raw.key))
        server = urlsplit(raw.server)
        self._host = server.hostname or "127.0.0.1"
        self._port = server.port or 443
        self._api = api
        self._path = path
        self._selector = label_selector
        self._on_event = on_event
        self._stop = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")
        self.errors: list[str] = []
        self.resource_version = ""

    def start(self) -> None:
        query = f"?labelSelector={quote(self._selector)}" if self._selector else ""
        listing = self._api.raw.get(self._path + query)
        self.resource_version = listing["metadata"]["resourceVersion"]
        for item in listing["items"]:
            self._on_event("EXISTING", item)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream()
            except Exception as exc:  # recorded: the test fails on it
                if self._stop.is_set():
                    return
                self.errors.append(f"watch {self._path}: {exc!r}")
                time.sleep(0.2)

    def _stream(self) -> None:
        params = [
            "watch=1",
            "allowWatchBookmarks=true",
            "timeoutSeconds=120",
            f"resourceVersion={self.resource_version}",
        ]
        if self._selector:
            params.append(f"labelSelector={quote(self._selector)}")
        conn = http.client.HTTPSConnection(self._host, self._port, context=self._context)
        self._conn = conn
        try:
            conn.request("GET", f"{self._path}?{'&'.join(params)}")
            response = conn.getresponse()
            if response.status != 200:
                body = response.read().decode(errors="replace")
                self.errors.append(f"watch {self._path}: HTTP {response.status}: {body}")
                self._stop.wait(1)
                return
            while not self._stop.is_set():
                line = response.readline()
                if not line:
                    return  # timeoutSeconds: watch again from the last resourceVersion
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    self.errors.append(f"watch {self._path}: {obj.get('message')}")
                    self._stop.wait(1)
                    return
                self.resource_version = obj["metadata"]["resourceVersion"]
                if kind != "BOOKMARK":
                    self._on_event(kind, obj)
        finally:
            conn.close()


@dataclass
class PodRecord:
    name: str
    uid: str
    pool: str
    owner: str
    attempt: str
    phase: str = ""
    deletion: str | None = None

    def describe(self) -> str:
        deleting = f", deletionTimestamp {self.deletion}" if self.deletion else ""
        return f"{self.name} ({self.owner}, attempt {self.attempt}, phase {self.phase}{deleting})"


def owner_of(pod: dict[str, Any]) -> str:
    """The pod's TPUJob, or its standalone TPUSlice (whose pods carry the slice's own name
    as job name; a job's slices are always named ``<job>-<index>``)."""
    labels = pod["metadata"].get("labels") or {}
    slice_name = labels.get(contract.LABEL_SLICE_NAME, "")
    job = labels.get(contract.LABEL_JOB_NAME) or slice_name
    if job != slice_name:
        return f"{contract.JOB_KIND} {job}"
    return f"{contract.SLICE_KIND} {slice_name}"


@dataclass
class Handover:
    pool: str
    previous: str
    owner: str
    pod: str


class PoolWatcher:
    """Every worker pod event of one namespace; fails on a pod created on a pool that
    another owner's unfinished pod still occupies.

    Pods of the same owner are not compared: a job's own earlier attempt (a gang restart,
    or the job suspended and resumed) is kept apart by the in-job barrier, which
    ``PodAttemptRecorder`` tests.
    """

    def __init__(self, api: Api, namespace: str) -> None:
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}  # by UID: pod names repeat across attempts
        self.violations: list[str] = []
        self.handovers: list[Handover] = []
        self.added = 0
        self.timeline: list[str] = []
        self._last_owner: dict[str, str] = {}
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._watch = Watch(
            api, f"/api/v1/namespaces/{namespace}/pods", self._event, contract.LABEL_SLICE_NAME
        )

    def __enter__(self) -> PoolWatcher:
        self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()
        print("pod events seen (shown when the test fails):")
        print("\n".join(f"  {line}" for line in self.timeline))

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        pool = (pod["spec"].get("nodeSelector") or {}).get(contract.NODE_LABEL_NODEPOOL)
        deleting = " deleting" if meta.get("deletionTimestamp") else ""
        self.timeline.append(
            f"t={time.monotonic() - self._started:6.2f}s {kind} {meta['name']} "
            f"({owner_of(pod)}, pool {pool}): {(pod.get('status') or {}).get('phase')}{deleting}"
        )
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                return
            if not pool:
                return
            record = self.pods.get(uid)
            if record is None:
                labels = meta.get("labels") or {}
                record = PodRecord(
                    name=meta["name"],
                    uid=uid,
                    pool=pool,
                    owner=owner_of(pod),
                    attempt=labels.get(contract.LABEL_RESTART_ATTEMPT, "?"),
                )
                if kind == "ADDED":
                    self._check(record)
                self.pods[uid] = record
            record.phase = (pod.get("status") or {}).get("phase", "")
            record.deletion = meta.get("deletionTimestamp")

    def _check(self, new: PodRecord) -> None:
        self.added += 1
        others = [
            p
            for p in self.pods.values()
            if p.pool == new.pool
            and p.owner != new.owner
            and p.phase not in ("Succeeded", "Failed")
        ]
        at = time.monotonic() - self._started
        if others:
            self.violations.append(
                f"t={at:.2f}s: pod {new.name} ({new.owner}, attempt {new.attempt}) was "
                f"created on node pool {new.pool} while {len(others)} pods of another owner "
                f"were not gone: " + "; ".join(p.describe() for p in others)
            )
        previous = self._last_owner.get(new.pool)
        if previous is not None and previous != new.owner:
            self.handovers.append(Handover(new.pool, previous, new.owner, new.name))
        self._last_owner[new.pool] = new.owner

    # Reading (from the test's thread)
    def owners_on(self, pool: str) -> set[str]:
        with self._lock:
            return {p.owner for p in self.pods.values() if p.pool == pool}

    def pods_of(self, owner: str) -> list[PodRecord]:
        with self._lock:
            return [p for p in self.pods.values() if p.owner == owner]

    def handed(self, pool: str, to: str) -> bool:
        with self._lock:
            return any(h.pool == pool and h.owner == to for h in self.handovers)

    def assert_clean(self, min_handovers: int, context: str = "") -> None:
        """No violation, no gap in the watch, and at least ``min_handovers`` pools changed
        hands while watched."""
        where = f" [{context}]" if context else ""
        assert not self._watch.errors, f"the pod watch broke{where}: {self._watch.errors}"
        assert not self.violations, (
            f"{len(self.violations)} pods were created on a node pool that was not free"
            f"{where}:\n" + "\n".join(self.violations)
        )
        assert len(self.handovers) >= min_handovers, (
            f"only {len(self.handovers)} handovers of a pool between owners were seen "
            f"({self.added} pods created){where}: the check proved nothing"
        )


@dataclass
class StatusSeen:
    kind: str
    name: str
    phase: str
    message: str
    active: int
    terminating: int
    pools: list[str]
    at: float


@dataclass
class StatusLog:
    """Every status of the namespace's TPUJobs and TPUSlices, as watched."""

    api: Api
    namespace: str
    seen: list[StatusSeen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._watches = [
            Watch(self.api, JOBS.format(ns=self.namespace), self._on(contract.JOB_KIND)),
            Watch(self.api, SLICES.format(ns=self.namespace), self._on(contract.SLICE_KIND)),
        ]

    def _on(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        def record(event: str, body: dict[str, Any]) -> None:
            status = body.get("status") or {}
            pools = status.get("nodePools") or (
                [status["nodePool"]] if status.get("nodePool") else []
            )
            with self._lock:
                self.seen.append(
                    StatusSeen(
                        kind,
                        body["metadata"]["name"],
                        status.get("phase", ""),
                        status.get("message", ""),
                        int(status.get("activePods") or 0),
                        int(status.get("terminatingPods") or 0),
                        pools,
                        time.monotonic() - self._started,
                    )
                )

        return record

    def __enter__(self) -> StatusLog:
        for watch in self._watches:
            watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for watch in self._watches:
            watch.stop()
        print("statuses seen (repeats left out; shown when the test fails):")
        last: dict[tuple[str, str], tuple[Any, ...]] = {}
        for s in self.seen:
            what = (s.phase, s.message, s.active, s.terminating, s.pools)
            if last.get((s.kind, s.name)) == what:
                continue
            last[(s.kind, s.name)] = what
            print(
                f"  t={s.at:6.2f}s {s.kind} {s.name}: {s.phase} active={s.active} "
                f"terminating={s.terminating} pools={s.pools}: {s.message}"
            )

    def now(self) -> float:
        return time.monotonic() - self._started

    def of(self, kind: str, name: str) -> list[StatusSeen]:
        with self._lock:
            return [s for s in self.seen if s.kind == kind and s.name == name]


# Fixtures and helpers ---------------------------------------------------------------------


def phase_of(tpu: Api, namespace: str, name: str) -> str:
    return tpu.status(namespace, name).get("phase", "")


def slice_status(tpu: Api, namespace: str, name: str) -> dict[str, Any]:
    return tpu.raw.get(f"{SLICES.format(ns=namespace)}/{name}").get("status") or {}


def wait_slice_phase(tpu: Api, namespace: str, name: str, phase: str, timeout: float = 60):
    return wait_until(
        lambda: (s := slice_status(tpu, namespace, name)).get("phase") == phase and s,
        timeout=timeout,
        message=lambda: (
            f"TPUSlice {name} to be {phase}; it is {slice_status(tpu, namespace, name)}"
        ),
    )


def wait_waiting(
    log: StatusLog, name: str, kind: str = contract.JOB_KIND, after: float = 0, timeout=30
) -> StatusSeen:
    """Until ``name`` says (in a status written after ``after``) that it waits for a pool."""
    return wait_until(
        lambda: next(
            (s for s in log.of(kind, name) if s.at >= after and "waiting for" in s.message),
            None,
        ),
        timeout=timeout,
        message=lambda: (
            f"{kind} {name} to wait for a node pool; seen "
            f"{[(s.phase, s.message) for s in log.of(kind, name)][-3:]}"
        ),
    )


def assert_waited_for(
    log: StatusLog, waiter: str, pool: str, holder: str, kind: str = contract.JOB_KIND
) -> None:
    """While it waited, ``waiter``'s status said so: phase Pending, and a message naming
    the pool and the holder (as ``<namespace>/<name>``).

    WORDING: written for messages like "waiting for node pool p8-b: 3 pods of
    team-a/tg14 are still stopping" (and today's "waiting for a free node pool ...: <pool>
    is held by TPUJob <ns>/<name> (...)"); adapt the substrings if the wording changes.
    """
    messages = [(s.phase, s.message) for s in log.of(kind, waiter)]
    waiting = [
        (phase, message)
        for phase, message in messages
        if "waiting for" in message and pool in message and f"/{holder}" in message
    ]
    assert waiting, f"{waiter} never said it waits for {pool} held by {holder}: {messages}"
    assert all(phase == "Pending" for phase, _ in waiting), waiting


def assert_reported_stopping(log: StatusLog, kind: str, name: str, phase: str) -> None:
    """A suspended or finished object's status counted its remaining pods while they
    stopped, and reached zero once they were gone (status.activePods/terminatingPods)."""
    seen = [s for s in log.of(kind, name) if s.phase == phase]
    counts = [(s.active, s.terminating) for s in seen]
    assert any(a + t > 0 for a, t in counts), (
        f"{kind} {name} ({phase}) never reported pods still stopping: {counts}"
    )
    assert counts and counts[-1] == (0, 0), (
        f"{kind} {name} ({phase}) never reported its pods gone: {counts}"
    )


def poke(tpu: Api, namespace: str, kind: str, name: str) -> None:
    """Change an annotation of ``name``: the operator reconciles it (and so asks again
    whether the pool it waits for is free), as after any unrelated edit of the object."""
    path = (JOBS if kind == contract.JOB_KIND else SLICES).format(ns=namespace)
    patch = {"metadata": {"annotations": {"test.tpu-operator.dev/poke": str(time.monotonic())}}}
    tpu.raw.call("PATCH", f"{path}/{name}", patch, content_type="application/merge-patch+json")


def reconciles(operator: OperatorProcess) -> float:
    """Reconciles the operator process has done (its metrics)."""
    total = 0.0
    for line in operator.metrics().splitlines():
        if line.startswith("tpu_operator_reconcile_duration_seconds_count"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_handed_over(
    tpu: Api, watcher: PoolWatcher, namespace: str, pool: str, kind: str, name: str
) -> None:
    """Until ``name`` gets ``pool`` (its first pod there is created). Meanwhile the waiter
    is poked (an annotation changes) every few tenths of a second: each poke makes the
    operator reconcile it, so it is asked again and again, while the previous holder's pods
    stop, whether the pool is free (as any unrelated change of the object would)."""

    def handed() -> bool:
        if watcher.handed(pool, f"{kind} {name}") or watcher.violations:
            return True
        poke(tpu, namespace, kind, name)
        return False

    wait_until(handed, timeout=60, interval=0.3, message=f"{kind} {name} to get node pool {pool}")
    watcher.assert_clean(min_handovers=0)  # fail at once, not at the end of the test


def wait_running_on(
    tpu: Api, namespace: str, name: str, pool: str, timeout: float = 60
) -> dict[str, Any]:
    status = tpu.wait_phase(namespace, name, "Running", timeout=timeout)
    assert status["nodePools"] == [pool], status
    return status


# (a) many jobs, exact-fit pools, random suspend/resume toggles -----------------------------

JOBS_A = 6
POOLS_A = 4


def test_random_suspend_resume_toggles_never_share_a_pool(
    tpu, namespace, running_operator, tpu_pools
):
    seed = int(os.environ.get("POOL_HANDOVER_SEED") or random.randrange(1 << 30))
    print(f"POOL_HANDOVER_SEED={seed}")
    rng = random.Random(seed)
    pools = tpu_pools(POOLS_A)
    names = [f"toggle-{i}" for i in range(JOBS_A)]
    suspended = dict.fromkeys(names, False)
    schedule: list[str] = []

    def context() -> str:
        return f"seed {seed}; toggles: {', '.join(schedule)}"

    def toggle(name: str, gap: float = 0.0) -> None:
        suspended[name] = not suspended[name]
        tpu.patch_job(namespace, name, {"spec": {"suspend": suspended[name]}})
        schedule.append(f"+{gap:.2f}s {name} suspend={suspended[name]}")

    def phases() -> dict[str, str]:
        return {n: phase_of(tpu, namespace, n) for n in names}

    def poke_waiters(now: dict[str, str] | None = None) -> None:
        """Reconcile the jobs that may be waiting for a pool now (see ``poke``)."""
        for name in names:
            if not suspended[name] and (now is None or now[name] != "Running"):
                poke(tpu, namespace, contract.JOB_KIND, name)

    def settle() -> dict[str, str]:
        """Until every job is where its final suspend says: suspended ones Suspended with
        no pod left, as many of the others Running as there are pools, the rest Pending."""
        active = [n for n in names if not suspended[n]]

        def settled() -> dict[str, str] | None:
            now = phases()
            if watcher.violations:
                return now
            poke_waiters(now)
            if any(now[n] != "Suspended" for n in names if suspended[n]):
                return None
            if any(watcher.pods_of(f"{contract.JOB_KIND} {n}") for n in names if suspended[n]):
                return None
            running = [n for n in active if now[n] == "Running"]
            if len(running) != min(len(active), POOLS_A):
                return None
            return now if all(now[n] in ("Running", "Pending") for n in active) else None

        now = wait_until(
            settled,
            timeout=90,
            interval=0.3,
            message=lambda: f"the jobs to settle ({context()}): {phases()}",
        )
        watcher.assert_clean(min_handovers=0, context=context())  # fail at once
        return now

    with PoolWatcher(tpu, namespace) as watcher:
        for name in names:
            tpu.apply(slow_job(name, namespace))
        settle()  # 4 run, 2 wait
        toggles = [n for n in names for _ in range(rng.randint(1, 3))]
        rng.shuffle(toggles)
        for name in toggles:
            gap = rng.uniform(0, 1.5)
            deadline = time.monotonic() + gap
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, 0.3))
                poke_waiters()
            toggle(name, gap)
        print(context())
        now = settle()
        if not watcher.handovers:
            # Rare: this seed never moved a pool from one job to another (the waiting jobs
            # were suspended before any running one). Move one, so the run proves something.
            for name in names:
                if suspended[name]:
                    toggle(name)
            settle()
            toggle(next(n for n, phase in phases().items() if phase == "Running"))
            now = settle()
        held = {n: tpu.status(namespace, n).get("nodePools") for n in names}
        held = {n: p for n, p in held.items() if now[n] == "Running"}
        assert all(p and len(p) == 1 and p[0] in pools for p in held.values()), held
        assert len({p[0] for p in held.values()}) == len(held), (
            f"running jobs share a pool: {held} ({context()})"
        )
    watcher.assert_clean(min_handovers=1, context=context())


# (b) deleting a job while another waits for its pool ---------------------------------------


def test_deleted_job_hands_its_pool_over_only_when_its_pods_are_gone(
    tpu, namespace, running_operator, tpu_pools
):
    (pool,) = tpu_pools(1)
    with PoolWatcher(tpu, namespace) as watcher, StatusLog(tpu, namespace) as log:
        tpu.apply(slow_job("first", namespace))
        wait_running_on(tpu, namespace, "first", pool)
        tpu.apply(slow_job("second", namespace))
        wait_waiting(log, "second")
        tpu.cluster.kubectl("delete", "tpujob", "first", "-n", namespace, "--wait=false")
        wait_handed_over(tpu, watcher, namespace, pool, contract.JOB_KIND, "second")
        wait_running_on(tpu, namespace, "second", pool)
    watcher.assert_clean(min_handovers=1)
    assert_waited_for(log, "second", pool, "first")


# (c) a job finishing while another waits ---------------------------------------------------


def test_finished_job_hands_its_pool_over_only_when_its_pods_are_gone(
    tpu, namespace, running_operator, tpu_pools, tmp_path: Path
):
    (pool,) = tpu_pools(1)
    finish = tmp_path / "finish"
    with PoolWatcher(tpu, namespace) as watcher, StatusLog(tpu, namespace) as log:
        # The leader exits 0 when told; the job then succeeds (LeaderWorker) and the
        # other worker is stopped, slowly: the pool is not free until it is gone.
        tpu.apply(
            slow_job(
                "leader",
                namespace,
                env={"FINISH_FILE": str(finish)},
                successPolicy="LeaderWorker",
            )
        )
        wait_running_on(tpu, namespace, "leader", pool)
        tpu.apply(slow_job("next", namespace))
        wait_waiting(log, "next")
        finish.touch()
        wait_handed_over(tpu, watcher, namespace, pool, contract.JOB_KIND, "next")
        assert phase_of(tpu, namespace, "leader") == "Succeeded"
        wait_running_on(tpu, namespace, "next", pool)
    watcher.assert_clean(min_handovers=1)
    assert_waited_for(log, "next", pool, "leader")
    assert_reported_stopping(log, contract.JOB_KIND, "leader", "Succeeded")


# (d) standalone TPUSlices competing with jobs for one pool ---------------------------------


def test_standalone_slice_and_job_take_turns_on_one_pool(
    tpu, namespace, running_operator, tpu_pools
):
    (pool,) = tpu_pools(1)
    job = f"{contract.JOB_KIND} train"
    with PoolWatcher(tpu, namespace) as watcher, StatusLog(tpu, namespace) as log:
        tpu.apply(slow_slice("serve", namespace))
        assert wait_slice_phase(tpu, namespace, "serve", "Running")["nodePool"] == pool
        tpu.apply(slow_job("train", namespace))
        wait_waiting(log, "train")
        # Slice -> job.
        tpu.patch_slice(namespace, "serve", {"spec": {"suspend": True}})
        wait_handed_over(tpu, watcher, namespace, pool, contract.JOB_KIND, "train")
        wait_running_on(tpu, namespace, "train", pool)
        # Job -> slice.
        resumed = log.now()
        tpu.patch_slice(namespace, "serve", {"spec": {"suspend": False}})
        wait_waiting(log, "serve", contract.SLICE_KIND, after=resumed)
        assert watcher.owners_on(pool) == {job}
        tpu.patch_job(namespace, "train", {"spec": {"suspend": True}})
        wait_handed_over(tpu, watcher, namespace, pool, contract.SLICE_KIND, "serve")
        assert wait_slice_phase(tpu, namespace, "serve", "Running")["nodePool"] == pool
    watcher.assert_clean(min_handovers=2)
    assert_waited_for(log, "train", pool, "serve")
    assert_waited_for(log, "serve", pool, "train", kind=contract.SLICE_KIND)
    assert_reported_stopping(log, contract.JOB_KIND, "train", "Suspended")


# (e) the operator SIGKILLed between the suspend and the pods being gone --------------------


def test_operator_killed_after_suspend_still_waits_for_the_pods(
    tpu, namespace, running_operator, tpu_pools, tmp_path: Path
):
    (pool,) = tpu_pools(1)
    release = tmp_path / "release"
    paused = f"{contract.JOB_KIND} paused"
    with PoolWatcher(tpu, namespace) as watcher, StatusLog(tpu, namespace) as log:
        # Its workers stop only when released (or after 30 s), so the restarted operator
        # surely finds them still stopping, however long the restart takes.
        tpu.apply(slow_job("paused", namespace, stop=30, env={"RELEASE_FILE": str(release)}))
        wait_running_on(tpu, namespace, "paused", pool)
        tpu.apply(slow_job("waiter", namespace))
        wait_waiting(log, "waiter")
        tpu.patch_job(namespace, "paused", {"spec": {"suspend": True}})
        # Kill as soon as the suspend is acted on (status written or a pod marked for
        # deletion).
        wait_until(
            lambda: (
                phase_of(tpu, namespace, "paused") == "Suspended"
                or any(p.deletion for p in watcher.pods_of(paused))
            ),
            timeout=30,
            interval=0.02,
            message="the suspend to be acted on",
        )
        running_operator.kill()
        running_operator.start()
        # The new operator reconciles the waiter (poked) while the pods still stop, and
        # must keep it waiting: poke it until the new operator has done a few reconciles
        # (its metrics say so) and at least 1.5 s have passed.
        restarted, before = time.monotonic(), reconciles(running_operator)
        wait_until(
            lambda: (
                poke(tpu, namespace, contract.JOB_KIND, "waiter")
                or watcher.violations
                or (
                    time.monotonic() - restarted > 1.5
                    and reconciles(running_operator) >= before + 3
                )
            ),
            timeout=60,
            interval=0.3,
            message="the restarted operator to reconcile the waiting job",
        )
        watcher.assert_clean(min_handovers=0, context="after the restart")
        assert phase_of(tpu, namespace, "waiter") == "Pending"
        assert watcher.owners_on(pool) == {paused}, watcher.owners_on(pool)
        release.touch()
        wait_handed_over(tpu, watcher, namespace, pool, contract.JOB_KIND, "waiter")
        wait_running_on(tpu, namespace, "waiter", pool)
    watcher.assert_clean(min_handovers=1)
    assert_waited_for(log, "waiter", pool, "paused")
    assert_reported_stopping(log, contract.JOB_KIND, "paused", "Suspended")


# (f) a batch of jobs competing for the same pools, all deleted at once ---------------------

BATCH_ROUNDS = 2
BATCH_JOBS = 6
BATCH_POOLS = 2
BATCH_STOP_SECONDS = 8
"""The holders' workers stop this slowly: the waiters are deleted well before the pools
are free, so none of them may ever get one."""


def test_batch_deleted_at_once_never_shares_a_pool_and_creates_nothing(
    tpu, namespace, running_operator, tpu_pools
):
    """Jobs that compete for the same pools (some hold one, the others wait), all deleted
    with one ``kubectl delete tpujobs --all``: the holders' pods hold their pools until
    they are gone, and the jobs that were waiting, being deleted, start nothing."""
    for round_ in range(BATCH_ROUNDS):
        delete_batch(
            tpu,
            namespace,
            tpu_pools(BATCH_POOLS),
            [f"batch{round_}-{i}" for i in range(BATCH_JOBS)],
            f"round {round_}",
        )


def delete_batch(tpu: Api, namespace: str, pools: list[str], names: list[str], round_: str) -> None:
    with PoolWatcher(tpu, namespace) as watcher, StatusLog(tpu, namespace) as log:
        for name in names:
            tpu.apply(slow_job(name, namespace, stop=BATCH_STOP_SECONDS))

        def holders() -> list[str] | None:
            running = [n for n in names if phase_of(tpu, namespace, n) == "Running"]
            return running if len(running) == len(pools) else None

        running = wait_until(
            holders,
            timeout=90,
            message=lambda: (
                f"{len(pools)} of the jobs to run: "
                f"{ {n: phase_of(tpu, namespace, n) for n in names} }"
            ),
        )
        waiters = [n for n in names if n not in running]
        for name in waiters:
            wait_waiting(log, name)
        tpu.cluster.kubectl("delete", "tpujobs", "--all", "-n", namespace, "--wait=false")
        wait_until(  # every pod of the batch is gone (the holders' stop slowly)
            lambda: not any(watcher.owners_on(p) for p in pools),
            timeout=120,
            message=lambda: (
                f"the batch's pods to be gone: { {p: watcher.owners_on(p) for p in pools} }"
            ),
        )
    for pool in pools:  # the next round competes for pools of its own
        tpu.cluster.agent.remove_pool(pool)
    context = f"{round_}; holders {running}, waiters {waiters}"
    watcher.assert_clean(min_handovers=0, context=context)
    started = [
        line
        for line in watcher.timeline
        if " ADDED " in line and any(f"({contract.JOB_KIND} {n}," in line for n in waiters)
    ]
    assert not started, (
        f"jobs deleted while they waited for a pool created pods ({context}):\n"
        + "\n".join(started)
    )


# (g) a resumed job into a pool whose nodes cannot take its pods yet ------------------------


HOLD = "example.com/hold"
"""The key of a taint the worker pods do not tolerate."""


def test_a_resumed_job_is_starting_until_its_new_pods_run(
    tpu, namespace, running_operator, tpu_pools
):
    """Each attempt has its own runningSince: resumed into a pool whose nodes the pods
    cannot be scheduled on (a taint they do not tolerate; a cordoned pool would not be
    given to the job at all), the job stays Starting and says why its pods wait, and is
    Running only once the new attempt's pods run; its goodput books the suspension as
    ``suspended``."""
    (pool,) = tpu_pools(1)
    cluster = tpu.cluster
    with StatusLog(tpu, namespace) as log:
        tpu.apply(slow_job("resumed", namespace, stop=0.5))
        first = wait_running_on(tpu, namespace, "resumed", pool)
        tpu.patch_job(namespace, "resumed", {"spec": {"suspend": True}})
        wait_until(
            lambda: tpu.status(namespace, "resumed").get("message") == "suspended",
            timeout=60,
            message=lambda: f"its pods to be gone: {tpu.status(namespace, 'resumed')}",
        )
        nodes = cluster.kubectl(
            "get", "nodes", "-l", f"{contract.NODE_LABEL_NODEPOOL}={pool}", "-o", "name"
        ).stdout.split()
        assert len(nodes) == 2, nodes
        for node in nodes:
            cluster.kubectl("taint", "node", node.split("/")[-1], f"{HOLD}=true:NoSchedule")
        resumed_at = log.now()
        tpu.patch_job(namespace, "resumed", {"spec": {"suspend": False}})
        waiting = wait_until(
            lambda: (
                (s := tpu.status(namespace, "resumed")).get("attempt") == 2
                and "cannot be scheduled" in s.get("message", "")
                and s
            ),
            timeout=60,
            message=lambda: (
                f"the resumed job to say why its pods wait: {tpu.status(namespace, 'resumed')}"
            ),
        )
        assert waiting["phase"] == "Starting", waiting
        assert "runningSince" not in waiting, waiting
        assert "untolerated taint" in waiting["message"], waiting["message"]
        scheduled = next(c for c in waiting["conditions"] if c["type"] == "PodsScheduled")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        time.sleep(3)  # the job has had time to claim anything it wrongly would
        for node in nodes:
            cluster.kubectl("taint", "node", node.split("/")[-1], f"{HOLD}-")
        uncordoned_at = log.now()
        second = wait_running_on(tpu, namespace, "resumed", pool)
    assert second["attempt"] == 2
    assert second["runningSince"] > first["runningSince"]
    assert second["goodput"]["badputSeconds"]["suspended"] > 0
    after_resume = [s for s in log.of(contract.JOB_KIND, "resumed") if s.at >= resumed_at]
    early = [s for s in after_resume if s.phase == "Running" and s.at < uncordoned_at]
    assert not early, f"Running before any pod of the resumed attempt could run: {early}"
