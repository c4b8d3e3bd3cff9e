"""Leader election on a ``coordination.k8s.io`` Lease, so that two replicas never both act.

The election itself is the official Kubernetes client's (``kubernetes.leaderelection``:
client-go's algorithm: a candidate takes the Lease when it is free or when its holder has
not renewed it for ``leaseDuration`` as observed on the candidate's own clock; the holder
renews every ``retryPeriod`` and gives up when it could not renew for ``renewDeadline``).
It is synchronous, so it runs in a thread of its own with its own API client and
connection pool: a busy event loop or a full request pool never delays a renewal, and
the election never blocks the loop. This module adds what the library leaves out:

- **A timeout on every request** (the library sets none: a request to an apiserver that
  stopped answering would hang the renew loop past its deadline).
- **Errors that are not API errors count as failed attempts** (the library lets a
  refused connection or a timeout end its thread, and with it the election).
- **A fence**: the time of the last successful renewal is kept (taken when the attempt
  started, so it is never later than the apiserver saw it), and the replica stops acting
  once it is older than ``renewDeadline``, whatever the library's loop is doing. The
  others wait ``leaseDuration`` (longer) before they take over, so the two never overlap
  while the clocks' rates agree.
- **Release on shutdown** (client-go's ``ReleaseOnCancel``): a leader that stops cleanly
  clears the holder, and the standby takes over at its next attempt instead of waiting
  for the Lease to expire.

``LeaderElector`` bridges the thread and the event loop: ``wait_leading`` returns when the
Lease is this replica's, ``wait_lost`` when it may no longer act. Losing leadership is
final, as in controller-runtime: the operator stops acting at once and exits, and comes
back as a standby with fresh caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient, Configuration, CoordinationV1Api
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection.electionconfig import Config
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from tpu_operator.runtime.lease import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD

log = logging.getLogger(__name__)
# The library logs every attempt at INFO ("lease held by ... and has not expired" every
# retry period on a standby, "successfully acquired lease" on every renewal); this module
# logs the transitions instead.
logging.getLogger("leaderelection").setLevel(logging.WARNING)

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# The library requires renewDeadline > retryPeriod * this (its jitter factor).
JITTER_FACTOR = 1.2

Clock = Callable[[], float]


def default_identity() -> str:
    """The pod's name (or the host's) and a random suffix, as client-go builds it: unique
    per process, so a restarted container does not mistake its predecessor's Lease for
    its own."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """$POD_NAMESPACE, else the service account's namespace in a pod, else ``default``."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError), open(SERVICE_ACCOUNT_NAMESPACE) as handle:
        found = handle.read().strip()
        if found:
            return found
    return "default"


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is and how it is held."""

    namespace: str
    name: str = "tpu-operator"
    lease_duration: int = LEASE_DURATION
    """Seconds a standby waits, after it last saw the Lease renewed, before taking it."""
    renew_deadline: float = RENEW_DEADLINE
    """Seconds the leader keeps acting without a successful renewal."""
    retry_period: float = RETRY_PERIOD
    """Seconds between two attempts to take or renew the Lease."""
    identity: str = field(default_factory=default_identity)

    @property
    def request_timeout(self) -> float:
        """Timeout of one Lease request: two attempts fit in one renew deadline."""
        return self.renew_deadline / 2

    def problems(self) -> list[str]:
        """What is wrong with these settings (the library would exit the process)."""
        found = []
        for label, value in (("namespace", self.namespace), ("lease name", self.name)):
            if not _NAME.match(value) or len(value) > 253:
                found.append(f"the {label} {value!r} is not a valid Kubernetes name")
        if not self.identity:
            found.append("the identity is empty")
        if self.retry_period < 1:
            found.append("the retry period must be at least 1 s")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            found.append(
                f"the renew deadline ({self.renew_deadline:g} s) must be longer than "
                f"{JITTER_FACTOR} x the retry period ({self.retry_period:g} s)"
            )
        if self.lease_duration <= self.renew_deadline:
            found.append(
                f"the lease duration ({self.lease_duration} s) must be longer than the "
                f"renew deadline ({self.renew_deadline:g} s)"
            )
        return found

    def describe(self) -> str:
        return (
            f"Lease {self.namespace}/{self.name} as {self.identity} "
            f"({self.lease_duration}/{self.renew_deadline:g}/{self.retry_period:g} s)"
        )


def renewed_within(renewed_at: float | None, now: float, deadline: float) -> bool:
    """Whether a leader whose last renewal began at ``renewed_at`` may still act."""
    return renewed_at is not None and now - renewed_at < deadline


class TimedApi:
    """A ``CoordinationV1Api`` whose every request carries a timeout."""

    def __init__(self, api: Any, timeout: float) -> None:
        self._api = api
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        return functools.partial(getattr(self._api, name), _request_timeout=self._timeout)


class FencedLeaseLock(LeaseLock):
    """The library's Lease lock, made safe to run unattended.

    Any failure is a failed attempt (never an exception out of the election thread); the
    start of the last attempt that renewed or took the Lease is kept for the fence; once
    closed, nothing is written any more (so shutdown can release the Lease without the
    election thread renewing it behind its back).
    """

    def __init__(self, settings: LeaseSettings, api: Any, clock: Clock = time.monotonic) -> None:
        super().__init__(settings.name, settings.namespace, settings.identity)
        self.api_instance = api
        self.clock = clock
        self.closed = False
        self.renewed_at: float | None = None
        self.holder: str | None = None
        self._attempt_started = 0.0
        self._lock = threading.Lock()
        self._failing = False

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        self._attempt_started = self.clock()
        if self.closed:
            return False, ApiException(reason="closed")
        try:
            found, record = super().get(name, namespace)
        except Exception as exc:
            self._failed("read", exc)
            # What the library expects of a failed read: an error that is not a 404.
            return False, ApiException(reason=f"{type(exc).__name__}: {exc}")
        if found:
            self._saw_holder(record.holder_identity)
            self._failing = False
        return found, record

    def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        return self._write(super().create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        return self._write(super().update, name, namespace, updated_record)

    def _write(
        self,
        write: Callable[[str, str, LeaderElectionRecord], bool],
        name: str,
        namespace: str,
        record: LeaderElectionRecord,
    ) -> bool:
        with self._lock:
            if self.closed:
                return False
            try:
                ok = write(name, namespace, record)
            except Exception as exc:
                self._failed("write", exc)
                return False
        if ok:
            self.renewed_at = self._attempt_started
            self._saw_holder(record.holder_identity)
        return ok

    def _saw_holder(self, holder: str | None) -> None:
        if holder != self.holder:
            log.info("Lease %s/%s is held by %s", self.namespace, self.name, holder or "nobody")
            self.holder = holder

    def _failed(self, what: str, exc: Exception) -> None:
        # One line when the apiserver becomes unreachable, not one per retry period.
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "could not %s Lease %s/%s: %s", what, self.namespace, self.name, exc)
        self._failing = True

    def release(self) -> bool:
        """Clear the holder if it is still this identity (client-go's release): the
        candidates take a Lease without a holder at once. Closes the lock first."""
        with self._lock:
            self.closed = True
            try:
                lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return False
                now = datetime.datetime.now(datetime.UTC)
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.acquire_time = now
                lease.spec.renew_time = now
                # Guarded by the resourceVersion just read: never clears another holder.
                self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
            except Exception as exc:
                log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)
                return False
        return True


class LeaderElector:
    """One candidate: the library's election in a thread, its outcome on the event loop."""

    def __init__(
        self,
        settings: LeaseSettings,
        configuration: Configuration,
        *,
        clock: Clock = time.monotonic,
        api: Any = None,
    ) -> None:
        problems = settings.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.settings = settings
        self.clock = clock
        if api is None:
            api = CoordinationV1Api(ApiClient(configuration))
        self.lock = FencedLeaseLock(settings, TimedApi(api, settings.request_timeout), clock)
        self.lost_reason: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leading = asyncio.Event()
        self._stopped = asyncio.Event()
        self._started_at = 0.0

    def start(self) -> None:
        """Start campaigning (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._started_at = self.clock()
        threading.Thread(target=self._elect, name="leader-election", daemon=True).start()

    def _elect(self) -> None:
        config = Config(
            self.lock,
            lease_duration=self.settings.lease_duration,
            renew_deadline=self.settings.renew_deadline,
            retry_period=self.settings.retry_period,
            onstarted_leading=lambda: self._notify(self._leading.set),
            onstopped_leading=lambda: None,
        )
        try:
            # Returns only once leadership is lost (a standby campaigns until it leads).
            LeaderElection(config).run()
        except Exception:
            log.exception("leader election failed")
        finally:
            self._notify(self._stopped.set)

    def _notify(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
            self._loop.call_soon_threadsafe(callback)

    @property
    def leading(self) -> bool:
        """This replica holds the Lease and may act."""
        return (
            self._leading.is_set()
            and not self._stopped.is_set()
            and not self.lock.closed
            and renewed_within(self.lock.renewed_at, self.clock(), self.settings.renew_deadline)
        )

    async def wait_leading(self) -> bool:
        """Wait until this replica holds the Lease (True), or the election ended without
        it (False: its thread failed; the replica can never lead)."""
        leading = asyncio.create_task(self._leading.wait())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({leading, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leading.cancel()
            stopped.cancel()
        if not self._leading.is_set():
            return False
        log.info(
            "leading: took %s after %.1f s as a candidate",
            self.settings.describe(),
            self.clock() - self._started_at,
        )
        return True

    async def wait_lost(self) -> str:
        """Return why this replica may no longer act: the library gave up renewing, or no
        renewal succeeded for ``renewDeadline`` (a request hung, the loop was stalled)."""
        tick = min(0.5, self.settings.retry_period / 4)
        while True:
            if self._stopped.is_set():
                reason = "the Lease could not be renewed"
            elif not renewed_within(
                self.lock.renewed_at, self.clock(), self.settings.renew_deadline
            ):
                reason = f"no renewal succeeded for {self.settings.renew_deadline:g} s"
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), tick)
                continue
            self.lost_reason = reason
            return reason

    async def release(self) -> None:
        """Stop campaigning; if this replica held the Lease, hand it over at once."""
        if not self._leading.is_set():
            self.lock.closed = True
            return
        if await asyncio.to_thread(self.lock.release):
            log.info("released %s", self.settings.describe())

    def describe(self) -> dict[str, Any]:
        """For the health endpoint: who leads, as this replica sees it."""
        return {
            "lease": f"{self.settings.namespace}/{self.settings.name}",
            "identity": self.settings.identity,
            "holder": self.lock.holder,
            "leading": self.leading,
        }
