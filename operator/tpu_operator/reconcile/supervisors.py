"""In-place gang restarts: what the supervisors report, and the restart itself (I/O).

Two halves, both driven by the TPUJob reconciler:

- **Reports.** A supervised pod whose readiness turned False after its container started
  has a training process that stopped (``PodView.process_stopped``). Before deciding, the
  job asks each such pod's supervisor what happened (exit code, reason), once per
  readiness transition; the answers are the gang assessment's ``reports``. A supervisor
  that does not answer three times in a row is reported unreachable (the next attempt
  then recreates the pods).
- **The restart.** For a job whose committed status says "attempt N+1, in place", the
  job writes once per slice that its pods are carried into N+1 (``TPUSlice.spec``
  ``attempt`` and ``inPlaceFrom``; a pod's label keeps the attempt it was created for, and
  every reader takes its attempt from the slice's record: ``state.views.carried_attempt``).
  Every carried pod's process of N is stopped (``stop`` for N: the supervisor sends
  SIGTERM, and SIGKILL after the pod's termination grace; it answers ``stopping`` until
  the process ended, and is asked again on the next pass). In a mixed restart the
  recreated slices create their new pods meanwhile, whose supervisors wait for a start.
  Only when every carried process has stopped, every pod of N+1 runs (the barrier) and
  the restart backoff has passed, each supervisor is told to ``start`` N+1. Each step is
  idempotent, so a reconcile cut short (or a new operator) just does it again. A stop
  that fails ends the in-place restart: the job records a failure of attempt N+1 and
  recreates the pods for N+2.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tpu_operator import contract
from tpu_operator.runtime.control import ControlChannel, ControlError, ProcessState, fan_out
from tpu_operator.runtime.kube import Kube
from tpu_operator.state.gang import ProcessReport
from tpu_operator.state.views import PodView

log = logging.getLogger(__name__)

UNREACHABLE_AFTER = 3
"""Failed asks in a row before a supervisor counts as unreachable."""
RETRY_SECONDS = 1.0
"""Before asking a supervisor again (after a failure, or while its answer is stale)."""
START_PATIENCE_SECONDS = 30.0
"""How long starts to a supervisor that cannot be reached are sent again before it counts
as unreachable: a pod created for the restart may still be starting its supervisor."""
RUNNING_RECHECK_SECONDS = 3.0
"""A supervisor that said "running" for a NotReady pod is asked again after this long."""


def _stamp(unix: float | None) -> str | None:
    if unix is None:
        return None
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_of(state: ProcessState) -> ProcessReport:
    return ProcessReport(
        attempt=state.attempt,
        exit_code=state.exit_code,
        reason=state.exit_reason,
        time=_stamp(state.exited_at),
        running=state.running,
    )


def _current(table: dict[tuple[str, int], set[str]], job: str, attempt: int) -> set[str]:
    """The set kept for ``attempt`` of ``job``; those of its earlier attempts are dropped."""
    for key in [k for k in table if k[0] == job and k[1] < attempt]:
        del table[key]
    return table.setdefault((job, attempt), set())


def runs(pod: PodView) -> bool:
    """The pod's container runs and its supervisor can be reached."""
    return pod.phase == "Running" and pod.pod_ip is not None and not pod.deleting


def gang_runs(pods: Iterable[PodView], attempt: int, members: int) -> bool:
    """Every one of the ``members`` pods of ``attempt`` runs, and no pod of an older
    attempt is left (a pod carried in place counts as ``attempt``'s once its slice's
    record is seen)."""
    running: set[str] = set()
    for pod in pods:
        if pod.attempt < attempt:
            return False
        if pod.attempt == attempt and runs(pod):
            running.add(pod.name)
    return len(running) >= members


def recreated_ready(
    pods: Iterable[PodView], recreated: frozenset[int], attempt: int, hosts: int
) -> bool:
    """The slices a mixed restart recreates are ready for ``attempt``: none of their pods
    of an older attempt is left, and each has its ``hosts`` pods of ``attempt`` running."""
    if not recreated:
        return True
    running: dict[int, int] = {}
    for pod in pods:
        if pod.slice_index not in recreated:
            continue
        if pod.attempt < attempt:
            return False
        if pod.attempt == attempt and runs(pod):
            running[pod.slice_index] = running.get(pod.slice_index, 0) + 1
    return all(running.get(i, 0) >= hosts for i in recreated)


@dataclass
class _Asked:
    transition: str | None
    report: ProcessReport | None = None
    failures: int = 0
    at: float = 0.0
    failing_since: float | None = None
    """When starts to it began to fail (``START_PATIENCE_SECONDS``)."""


@dataclass
class Supervisors:
    """The operator's memory of supervisors' answers and of the starts it sent."""

    channel: ControlChannel
    kube: Kube
    clock: object = time.monotonic
    _asked: dict[str, _Asked] = field(default_factory=dict)
    _started: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    _stopped: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    """Pods (UIDs) whose supervisor confirmed no process older than the restart's attempt
    runs, per restart."""
    _fallbacks: dict[tuple[str, int], str] = field(default_factory=dict)
    _done: dict[str, int] = field(default_factory=dict)
    """The last attempt each job's in-place restart started in every pod that stays."""
    _checkpointed: dict[str, tuple[str, set[str]]] = field(default_factory=dict)
    """Each job's last checkpoint request (its id) and the pods (UIDs) that acknowledged
    it."""

    def _now(self) -> float:
        return float(self.clock())  # type: ignore[operator]

    def forget(self, pod_uids: Iterable[str]) -> None:
        for uid in pod_uids:
            self._asked.pop(uid, None)

    # reports
    async def observe(
        self, job_uid: str, pods: Iterable[PodView]
    ) -> tuple[dict[str, ProcessReport], float | None]:
        """Reports on the stopped training processes among ``pods``, by pod name, and
        when to look again if some supervisor still has to answer."""
        now = self._now()
        reports: dict[str, ProcessReport] = {}
        ask: list[PodView] = []
        retry: float | None = None
        for pod in pods:
            if not pod.process_stopped or self._awaits_start(job_uid, pod):
                self._asked.pop(pod.uid, None)
                continue
            asked = self._asked.get(pod.uid)
            if asked is None or asked.transition != pod.not_ready_since:
                asked = self._asked[pod.uid] = _Asked(pod.not_ready_since)
            if self._fresh(asked, pod, now):
                if asked.report is not None:
                    reports[pod.name] = asked.report
                continue
            ask.append(pod)
        if ask:
            results = await fan_out(ask, lambda p: self.channel.status(job_uid, p.uid, p.pod_ip))
            for pod, result in zip(ask, results, strict=True):
                asked = self._asked[pod.uid]
                asked.at = now
                if isinstance(result, ProcessState):
                    asked.failures = 0
                    asked.report = report_of(result)
                elif isinstance(result, ControlError):
                    asked.failures += 1
                    log.info("asking the supervisor of pod %s: %s", pod.name, result)
                    if asked.failures >= UNREACHABLE_AFTER:
                        asked.report = ProcessReport(attempt=pod.attempt, unreachable=str(result))
                    else:
                        retry = RETRY_SECONDS
                else:
                    raise result
                if asked.report is not None:
                    reports[pod.name] = asked.report
                if asked.report is not None and asked.report.attempt != pod.attempt:
                    retry = RETRY_SECONDS
        return reports, retry

    def _awaits_start(self, job_uid: str, pod: PodView) -> bool:
        """A pod created for the in-place restart this operator drives, whose supervisor
        waits for its start: it has no process to report on (and may still be binding
        its port). Starts that cannot reach it are retried (``START_PATIENCE_SECONDS``)."""
        key = (job_uid, pod.attempt)
        return (
            key in self._stopped
            and self._done.get(job_uid, 0) < pod.attempt
            and not pod.carried
            and pod.uid not in self._started.get(key, ())
        )

    def _fresh(self, asked: _Asked, pod: PodView, now: float) -> bool:
        if asked.at == 0.0:
            return False
        age = now - asked.at
        report = asked.report
        if report is None:
            return age < RETRY_SECONDS
        if report.unreachable is not None:
            return True
        if report.attempt != pod.attempt:
            return age < RETRY_SECONDS  # the pod was moved to a new attempt since
        if report.running:
            return age < RUNNING_RECHECK_SECONDS
        return True

    # the restart
    def forget_job(self, job_uid: str) -> None:
        """Drop what is kept of a job that restarts no more (finished or deleted)."""
        self._done.pop(job_uid, None)
        self._checkpointed.pop(job_uid, None)
        for table in (self._started, self._stopped, self._fallbacks):
            for key in [k for k in table if k[0] == job_uid]:
                del table[key]

    def fallback(self, job_uid: str, attempt: int) -> str | None:
        """Why the in-place restart into ``attempt`` cannot go on, if it cannot."""
        return self._fallbacks.get((job_uid, attempt))

    async def restart_in_place(
        self,
        *,
        job_uid: str,
        pods: list[PodView],
        attempt: int,
        grace_seconds: float,
        may_start: bool,
        members: int,
        recreated: frozenset[int] = frozenset(),
        hosts: int = 0,
    ) -> bool:
        """One pass of the in-place restart into ``attempt``; True once every one of the
        attempt's ``members`` pods runs and its supervisor was told to start it.

        The pods that stay are those of the slices not in ``recreated`` (by index): their
        slices' records carry them into ``attempt`` (``TPUSlice.spec.inPlaceFrom``; no pod
        is written to). The slices in ``recreated`` delete their pods and create new ones
        at once, whose supervisors wait for a start (``spec.awaitStart``).

        The barrier: no start before every staying pod's supervisor confirmed that no
        process of an older attempt runs there (a stop's answer says whether the process
        ended; one that says ``stopping`` is sent again on the next pass), no pod of an
        older attempt is left (the recreated slices' old pods are gone, and every staying
        pod is seen carried), and every pod of ``attempt`` runs. Then every supervisor,
        kept and new alike, is told to start ``attempt``: the starts are what the workers
        wait for. Each step is idempotent; a new operator sends the stops again (a
        supervisor that runs ``attempt`` already answers that it does).
        """
        stopped = _current(self._stopped, job_uid, attempt)
        staying = [
            p for p in pods if p.slice_index not in recreated and (p.carried or p.attempt < attempt)
        ]
        older = [p for p in staying if p.uid not in stopped]
        if any(p.deleting for p in older):
            return False  # recreated by its slice once gone, with the new attempt's env
        if older:
            await self._stop(job_uid, older, attempt, grace_seconds)
            if self.fallback(job_uid, attempt) is not None:
                return False
        if any(p.uid not in stopped for p in staying):
            return False
        started = _current(self._started, job_uid, attempt)
        current = [p for p in pods if p.attempt == attempt]
        # Readiness cannot tell: a stopped process's pod may still show Ready for up to a
        # probe period. A start for a process that runs is answered without effect.
        ready = (
            may_start
            and gang_runs(pods, attempt, members)
            and recreated_ready(pods, recreated, attempt, hosts)
        )
        todo = [p for p in current if p.uid not in started and runs(p)] if ready else []
        await self._start(job_uid, todo, attempt, started)
        done = ready and all(p.uid in started for p in current)
        if done:
            self._done[job_uid] = attempt
        return done

    def restarted(self, job_uid: str, attempt: int) -> bool:
        """The in-place restart into ``attempt`` told every pod that stays to start it
        (an operator that restarted has not: its next pass sends the starts again)."""
        return self._done.get(job_uid, 0) >= attempt

    async def _stop(self, job_uid: str, pods: list[PodView], attempt: int, grace: float) -> None:
        """Stop every process older than ``attempt`` in ``pods``; record the confirmed
        (a process still ``stopping`` is asked about again on the next pass)."""
        stopped = _current(self._stopped, job_uid, attempt)
        results = await fan_out(
            pods, lambda p: self.channel.stop(job_uid, p.uid, p.pod_ip, attempt - 1, grace)
        )
        for pod, result in zip(pods, results, strict=True):
            if isinstance(result, ProcessState):
                if not (result.running and result.attempt < attempt):
                    stopped.add(pod.uid)
                continue
            if not isinstance(result, ControlError):
                raise result
            newer = result.state
            if result.conflict and newer is not None and newer.attempt >= attempt:
                # This restart already started it there (an earlier pass or operator).
                stopped.add(pod.uid)
                continue
            message = f"pod {pod.name}: its supervisor did not stop the training process: {result}"
            log.warning("in-place restart into attempt %d: %s", attempt, message)
            self._fallbacks.setdefault((job_uid, attempt), message)

    async def _start(
        self, job_uid: str, pods: list[PodView], attempt: int, started: set[str]
    ) -> None:
        env = {contract.ENV_RESTART_ATTEMPT: str(attempt)}
        results = await fan_out(
            pods, lambda p: self.channel.start(job_uid, p.uid, p.pod_ip, attempt, env)
        )
        now = self._now()
        for pod, result in zip(pods, results, strict=True):
            if isinstance(result, ProcessState):
                started.add(pod.uid)
                # The answer is the latest word on the process: no need to ask again.
                self._asked[pod.uid] = _Asked(pod.not_ready_since, report_of(result), 0, now)
            elif isinstance(result, ControlError):
                asked = self._asked.setdefault(pod.uid, _Asked(pod.not_ready_since))
                if asked.failing_since is None:
                    asked.failing_since = now
                if now - asked.failing_since < START_PATIENCE_SECONDS:
                    # Sent again on the next pass (the job looks again within a second).
                    log.info("starting attempt %d in pod %s: %s", attempt, pod.name, result)
                    continue
                log.warning("starting attempt %d in pod %s: %s", attempt, pod.name, result)
                asked.failures = max(asked.failures + 1, UNREACHABLE_AFTER)
                asked.report = ProcessReport(attempt=attempt, unreachable=str(result))
                asked.at = now
            else:
                raise result

    async def checkpoint(
        self, *, job_uid: str, pods: list[PodView], attempt: int, request_id: str
    ) -> int:
        """Ask every running training process of ``attempt`` to checkpoint now (the
        supervisors acknowledge a repeated ``request_id`` without asking again); how many
        were asked. A request repeated goes only to the pods that have not acknowledged it
        (this operator's memory: its successor asks them all again)."""
        last, acknowledged = self._checkpointed.get(job_uid, ("", set()))
        if last != request_id:
            acknowledged = set()
            self._checkpointed[job_uid] = (request_id, acknowledged)
        targets = [
            p
            for p in pods
            if p.attempt == attempt and p.ready and not p.deleting and p.uid not in acknowledged
        ]
        if not targets:
            return 0
        results = await fan_out(
            targets,
            lambda p: self.channel.checkpoint(job_uid, p.uid, p.pod_ip, attempt, request_id),
        )
        asked = 0
        for pod, result in zip(targets, results, strict=True):
            if isinstance(result, ControlError):
                log.warning("asking pod %s to checkpoint: %s", pod.name, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                acknowledged.add(pod.uid)
                asked += 1
        return asked
