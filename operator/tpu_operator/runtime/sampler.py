"""Sample running jobs' worker metrics endpoints (no Prometheus server needed).

Only jobs in phase Running are sampled (``ACTIVE_PHASES``).

Every ``sampleInterval`` the sampler reads worker 0 of each slice; every sixth round it
reads every worker, unless no worker answered the round before. A job whose workers serve
no metrics (an image without them, workers still starting) costs one read an interval,
of each slice's worker 0 in turn, until one answers: not one per worker (12,736 failed
reads a minute for the largest jobs), nor one per slice (199 connection attempts an
interval, a tenth of the operator's CPU while such a job started). Reads
go straight to the pods' IPs and metrics ports, at most ``concurrency`` at a time with a
short timeout; a round for a job never overlaps the previous one. After a round the job
is queued for reconciliation only when something must be written: a stall or straggler
change, or progress due for publication (at most once per ``publish_interval``, so status
writes per running job stay bounded however often the workers are read).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from pydantic import ValidationError

from tpu_operator import contract, worker_metrics
from tpu_operator.api.conditions import parse as parse_time
from tpu_operator.api.monitoring import Monitoring, seconds
from tpu_operator.progress.samples import WorkerSample, parse
from tpu_operator.progress.tracker import JobTrack
from tpu_operator.runtime.caches import Caches
from tpu_operator.state.views import PodView

log = logging.getLogger(__name__)
FULL_ROUND_EVERY = 6
ACTIVE_PHASES = ("Running",)
"""A job is read while it runs. Before every worker of its attempt runs (Pending,
Starting, an in-place restart until its processes are started) nothing trains yet, and a
full round would read thousands of endpoints that cannot answer (the kept pods' processes
stopped) while the restart's own stops and starts go out; a worker's counters keep what it
did before, so nothing is lost by reading it once the job runs."""
Key = tuple[str, str]


class ProgressSampler:
    def __init__(
        self,
        caches: Caches,
        enqueue: Callable[[Key], None],
        *,
        concurrency: int = 64,
        timeout: float = 2.0,
        publish_interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.caches = caches
        self.enqueue = enqueue
        self.timeout = timeout
        self.publish_interval = publish_interval
        self.clock = clock
        self.tracks: dict[Key, JobTrack] = {}
        self.reads = 0
        self.failures = 0
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._rounds: dict[Key, int] = {}
        self._silent: set[Key] = set()
        """Jobs of which no worker answered the last round: no full round until one does."""
        self._due: dict[Key, float] = {}
        self._busy: dict[Key, asyncio.Task[None]] = {}
        self._flags: dict[Key, tuple[bool, tuple[str, ...]]] = {}
        self._settings: dict[str, tuple[int, Monitoring | None]] = {}
        """Each known job's monitoring settings by UID, with the generation they were
        parsed from: parsed once per spec change, dropped with the job."""
        self._sampled: dict[Key, str] = {}
        """The jobs a tick looks at (by key, with their UID): monitoring on and an active
        phase, as their last event said (``job_changed``). A tick costs what these jobs
        cost, not what every job of the cluster does."""
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def track(self, namespace: str, name: str) -> JobTrack | None:
        return self.tracks.get((namespace, name))

    def open(self) -> None:
        """Open the HTTP session the reads use (``start`` does, then samples by itself)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._concurrency),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )

    def start(self) -> None:
        self.open()
        self.resync()
        self._task = asyncio.create_task(self._run(), name="progress-sampler")

    def resync(self) -> None:
        """Look at every cached job once (when this replica starts to act); from then on
        each job's events keep the jobs to sample current (``job_changed``)."""
        uids: set[str] = set()
        for job in self.caches.jobs():
            uids.add(job["metadata"].get("uid", ""))
            self.job_changed(None, job)
        for uid in self._settings.keys() - uids:
            del self._settings[uid]

    def job_changed(self, type: str | None, job: dict[str, Any]) -> None:
        """A TPUJob was listed, changed or deleted (``type`` as a watch event's): it is
        sampled while its monitoring is on and its phase active."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        uid = meta.get("uid", "")
        if type == "DELETED":
            self._settings.pop(uid, None)
            if self._sampled.get(key) == uid:
                del self._sampled[key]
            return
        phase = (job.get("status") or {}).get("phase")
        if self._monitoring(uid, job) is not None and phase in ACTIVE_PHASES:
            self._sampled[key] = uid
        else:
            self._sampled.pop(key, None)

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._busy.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(0.5)

    def tick(self) -> None:
        """Start the rounds that are due (never two at once for one job), for the jobs
        their events said to sample, each read afresh from the cache."""
        now = time.monotonic()
        seen: set[Key] = set()
        for key, uid in list(self._sampled.items()):
            job = self.caches.job(*key)
            if job is None or job["metadata"].get("uid", "") != uid:
                del self._sampled[key]  # gone (its DELETED event may be on its way)
                continue
            monitoring = self._monitoring(uid, job)
            if monitoring is None or (job.get("status") or {}).get("phase") not in ACTIVE_PHASES:
                continue
            seen.add(key)
            if key in self._busy or self._due.get(key, 0.0) > now:
                continue
            self._due[key] = now + seconds(monitoring.sample_interval)
            task = asyncio.create_task(self._round(key, job, monitoring), name=f"sample-{key[1]}")
            self._busy[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
        for key in set(self.tracks) - seen:
            if key not in self._busy:
                self.tracks.pop(key, None)
                self._flags.pop(key, None)
                self._rounds.pop(key, None)
                self._due.pop(key, None)
                self._silent.discard(key)

    def _monitoring(self, uid: str, job: dict[str, Any]) -> Monitoring | None:
        """The job's monitoring settings, parsed once per generation; None when off."""
        generation = int(job["metadata"].get("generation") or 0)
        known = self._settings.get(uid)
        if known is None or known[0] != generation:
            known = self._settings[uid] = (generation, monitoring_of(job))
        return known[1]

    def _finished(self, key: Key, _: asyncio.Task[None]) -> None:
        self._busy.pop(key, None)

    async def _round(self, key: Key, job: dict[str, Any], monitoring: Monitoring) -> None:
        try:
            await self._sample(key, job, monitoring)
        except Exception:
            log.exception("sampling the workers of %s/%s failed", *key)

    async def _sample(self, key: Key, job: dict[str, Any], monitoring: Monitoring) -> None:
        status = job.get("status") or {}
        attempt = int(status.get("attempt", 0))
        track = self.tracks.get(key)
        if track is None or track.attempt != attempt:
            track = self.tracks[key] = JobTrack(attempt)
        round_number = self._rounds.get(key, 0)
        self._rounds[key] = round_number + 1
        silent = key in self._silent
        full = round_number % FULL_ROUND_EVERY == 0 and not silent
        port = ((job.get("spec") or {}).get("ports") or {}).get(
            "metrics", contract.DEFAULT_METRICS_PORT
        )
        targets = round_targets(self.caches, key, attempt, full, silent, round_number)
        results = await asyncio.gather(*(self._read(p, port) for p in targets))
        answered = 0
        for pod, sample in zip(targets, results, strict=True):
            if sample is None:
                continue
            answered += 1
            track.observe(
                track.worker(pod.name, pod.slice_index, pod.worker_index, pod.node), sample
            )
        if full:
            track.asked, track.answered = len(targets), answered
            track.last_full_round = self.clock()
        if answered or not targets:
            self._silent.discard(key)
        else:
            self._silent.add(key)
        self._notify(key, job, track, monitoring)

    async def _read(self, pod: PodView, port: int) -> WorkerSample | None:
        assert self._session is not None
        url = f"http://{pod.pod_ip}:{port}{worker_metrics.METRICS_PATH}"
        async with self._slots:
            self.reads += 1
            try:
                async with self._session.get(url) as response:
                    if response.status != 200:
                        self.failures += 1
                        return None
                    text = await response.text()
            except (aiohttp.ClientError, TimeoutError, OSError):
                self.failures += 1
                return None
        try:
            return parse(text, self.clock())
        except ValueError:
            self.failures += 1
            log.warning("unreadable metrics from %s", url)
            return None

    def _notify(
        self, key: Key, job: dict[str, Any], track: JobTrack, monitoring: Monitoring
    ) -> None:
        now = self.clock()
        stalled_for = track.stalled_for(now)
        stalled = stalled_for is not None and stalled_for > seconds(monitoring.stall_timeout)
        stragglers = tuple(s.pod for s in track.stragglers(monitoring.straggler_threshold))
        flags = (stalled, stragglers)
        changed = self._flags.get(key) != flags
        self._flags[key] = flags
        progress = (job.get("status") or {}).get("progress") or {}
        published = parse_time(progress.get("sampledTime"))
        due = published is None or now - published.timestamp() >= self.publish_interval
        if changed or (due and track.leader() is not None):
            self.enqueue(key)


def round_targets(
    caches: Caches, key: Key, attempt: int, full: bool, silent: bool, round_number: int
) -> list[PodView]:
    """The pods a round reads: every worker of ``attempt`` that may serve metrics (a full
    round), or worker 0 of each slice, or (``silent``: nobody answered the last round)
    one of those, each slice in turn.

    The leaders come from their own index: walking a 12,736-pod job's pods to find its
    199 leaders cost every round of such a job that much, every ``sampleInterval`` for as
    long as its pods started (bench/HISTORY.md, entry 36881e4)."""
    if full:
        return _readable(caches.pods_of_job(*key), attempt)
    leaders = sorted(_readable(caches.leaders_of_job(*key), attempt), key=lambda p: p.slice_index)
    if silent and leaders:
        return [leaders[round_number % len(leaders)]]
    return leaders


def _readable(pods: list[PodView], attempt: int) -> list[PodView]:
    """The pods of ``attempt`` that may serve metrics now: Running, with an IP, and not
    being deleted."""
    return [p for p in pods if p.attempt == attempt and p.addressed and not p.deleting]


def monitoring_of(job: dict[str, Any]) -> Monitoring | None:
    """A job's monitoring settings; None when monitoring is off or they do not parse."""
    try:
        monitoring = Monitoring.model_validate((job.get("spec") or {}).get("monitoring") or {})
    except ValidationError:
        return None
    return monitoring if monitoring.enabled else None
