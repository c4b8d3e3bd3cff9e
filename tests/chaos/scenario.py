"""The chaos tier's job lifecycle and invariants, shared by its scenarios.

A lifecycle runs one or more small TPUJobs through creation, a gang restart (a worker
killed with exit code 1), suspend, resume and deletion; a hook runs right after each step
is triggered (a kill point, an outage). :class:`Recorder` watches the namespace's pods the
whole time and records every moment an invariant did not hold:

- one pod per (slice, worker index) at a time, and a pod of an attempt created once;
- no two attempts of a job with pods at the same time;

and after each step the job must reach its phase, ``status.restarts`` must equal the
failures injected, and after deletion nothing the job owned may be left. Every failure
message carries the seed.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localcluster import Cluster
from localcluster.testing import wait_until
from tests.chaos.conftest import SEED
from tests.operator.support import Api, OperatorProcess, job_manifest
from tpu_operator import contract

STEP_SECONDS = 120.0
"""Upper bound for any one step to converge, faults included (a bound, not a figure)."""


@dataclass(frozen=True)
class Job:
    name: str
    shape: dict[str, Any]
    hosts: int


SMALL = Job("small", {"type": "v5litepod-8", "chipsPerHost": 4}, 2)
WIDE = Job("wide", {"type": "v5litepod-16"}, 4)
V5P = Job("v5p", {"type": "v5p-16"}, 2)


def seeded(message: str) -> str:
    return f"{message} [replay: TPU_CHAOS_SEED={SEED}]"


class Recorder:
    """Polls the namespace's worker pods (every 50 ms) and records invariant breaks."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.violations: list[str] = []
        self.uids: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        self.snapshots = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.api.pods(self.namespace)
            except Exception:  # the apiserver is down: nothing to see meanwhile
                time.sleep(0.2)
                continue
            self.check(pods)
            time.sleep(0.05)

    def check(self, pods: list[dict[str, Any]]) -> None:
        self.snapshots += 1
        attempts: dict[str, set[str]] = defaultdict(set)
        workers: dict[tuple[str, str], list[str]] = defaultdict(list)
        for pod in pods:
            labels = pod["metadata"]["labels"]
            job = labels.get(contract.LABEL_JOB_NAME, "")
            slice_name = labels[contract.LABEL_SLICE_NAME]
            worker = labels.get(contract.LABEL_WORKER_INDEX, "?")
            attempt = labels.get(contract.LABEL_RESTART_ATTEMPT, "?")
            attempts[job].add(attempt)
            workers[(slice_name, worker)].append(pod["metadata"]["name"])
            uids = self.uids[(slice_name, worker, attempt)]
            uids.add(pod["metadata"]["uid"])
            if len(uids) > 1:
                self._violation(
                    f"slice {slice_name} worker {worker} attempt {attempt} was created "
                    f"{len(uids)} times"
                )
        for job, seen in attempts.items():
            if len(seen) > 1:
                self._violation(f"job {job}: pods of attempts {sorted(seen)} alive together")
        for (slice_name, worker), names in workers.items():
            if len(names) > 1:
                self._violation(f"slice {slice_name} worker {worker}: pods {sorted(names)}")

    def _violation(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def assert_clean(self) -> None:
        assert self.snapshots > 0, seeded("the pod recorder saw nothing")
        assert not self.violations, seeded(f"invariants broken: {self.violations}")


@dataclass
class Lifecycle:
    """Drives jobs through their steps in one namespace; ``hook(step)`` disturbs each."""

    tpu: Api
    cluster: Cluster
    namespace: str
    operators: Callable[[], list[OperatorProcess]]
    hook: Callable[[str], None] = lambda step: None
    command: str = "sleep 600"
    failures: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, jobs: list[Job]) -> None:
        self._step("create", jobs, lambda job: self._create(job), "Running", attempt=1)
        for job in jobs:
            assert self.tpu.status(self.namespace, job.name).get("restarts", 0) == 0, seeded(
                f"{job.name} counted a restart that was not injected: "
                f"{self.tpu.status(self.namespace, job.name)}"
            )
        self.failures += 1
        self._step("gang restart", jobs, self._fail_worker, "Running", attempt=2)
        self._step("suspend", jobs, lambda job: self._suspend(job, True), "Suspended")
        self._step("resume", jobs, lambda job: self._suspend(job, False), "Running", attempt=3)
        for job in jobs:
            status = self.tpu.status(self.namespace, job.name)
            assert status.get("restarts") == self.failures, seeded(
                f"{job.name}: status.restarts is {status.get('restarts')}, "
                f"{self.failures} failure(s) injected; status: {status}"
            )
        started = time.monotonic()
        for job in jobs:
            self.tpu.raw.request("DELETE", f"{self._jobs()}/{job.name}")
        self.hook("delete")
        for job in jobs:
            self._wait_gone(job)
        self.timings["delete"] = round(time.monotonic() - started, 1)
        self.assert_no_traceback()

    def _jobs(self) -> str:
        return (
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{self.namespace}/"
            f"{contract.JOB_PLURAL}"
        )

    def _create(self, job: Job) -> None:
        self.tpu.apply(
            job_manifest(
                job.name,
                self.namespace,
                job.shape,
                self.command,
                failurePolicy={"maxRestarts": 3, "backoffSeconds": 0},
            )
        )

    def _fail_worker(self, job: Job) -> None:
        self.cluster.agent.kill_pod(self.namespace, f"{job.name}-0-1", exit_code=1)

    def _suspend(self, job: Job, suspend: bool) -> None:
        self.tpu.patch_job(self.namespace, job.name, {"spec": {"suspend": suspend}})

    def _step(
        self,
        step: str,
        jobs: list[Job],
        act: Callable[[Job], None],
        phase: str,
        attempt: int | None = None,
    ) -> None:
        started = time.monotonic()
        for job in jobs:
            act(job)
        self.hook(step)
        for job in jobs:
            self.wait_reached(step, job, phase, attempt)
        self.timings[step] = round(time.monotonic() - started, 1)

    def wait_reached(self, step: str, job: Job, phase: str, attempt: int | None) -> None:
        wait_until(
            lambda: self.reached(job, phase, attempt),
            timeout=STEP_SECONDS,
            message=lambda: seeded(
                f"{step}: TPUJob {job.name} to be {phase} (attempt {attempt}); "
                f"{self.describe(job)}; {self._logs()}"
            ),
        )

    def _wait_gone(self, job: Job) -> None:
        wait_until(
            lambda: self.orphans(job) == [],
            timeout=STEP_SECONDS,
            message=lambda: seeded(
                f"everything of {job.name} to be gone; left: {self.orphans(job)}; {self._logs()}"
            ),
        )

    def reached(self, job: Job, phase: str, attempt: int | None) -> bool:
        status = self.tpu.status(self.namespace, job.name)
        if status.get("phase") != phase:
            return False
        pods = self.job_pods(job)
        if phase == "Suspended":
            return not pods
        if attempt is not None and status.get("attempt") != attempt:
            return False
        workers = sorted(
            (
                int(p["metadata"]["labels"][contract.LABEL_WORKER_INDEX]),
                p["metadata"]["labels"][contract.LABEL_RESTART_ATTEMPT],
            )
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
        )
        return workers == [(w, str(attempt)) for w in range(job.hosts)] and len(pods) == job.hosts

    def job_pods(self, job: Job) -> list[dict[str, Any]]:
        return self.tpu.pods(self.namespace, f"{contract.LABEL_JOB_NAME}={job.name}")

    def describe(self, job: Job) -> str:
        status = self.tpu.status(self.namespace, job.name)
        pods = [
            (
                p["metadata"]["name"],
                p["metadata"]["labels"].get(contract.LABEL_RESTART_ATTEMPT),
                bool(p["metadata"].get("deletionTimestamp")),
            )
            for p in self.job_pods(job)
        ]
        return (
            f"it is {status.get('phase')} attempt {status.get('attempt')} "
            f"restarts {status.get('restarts')}: {status.get('message')}; pods "
            f"(name, attempt, deleting): {pods}"
        )

    def orphans(self, job: Job) -> list[str]:
        """What is left of a deleted job: the job, its slices, pods and services, and
        anything in the namespace whose owner is gone."""
        left: list[str] = []
        raw = self.tpu.raw
        code, _ = raw.request("GET", f"{self._jobs()}/{job.name}")
        if code != 404:
            left.append(f"TPUJob {job.name}")
        slices = self.tpu.slices(self.namespace)
        services = raw.get(f"/api/v1/namespaces/{self.namespace}/services")["items"]
        pods = self.tpu.pods(self.namespace)
        jobs = raw.get(self._jobs())["items"]
        owners = {o["metadata"]["uid"] for o in [*jobs, *slices]}
        for kind, items in (("TPUSlice", slices), ("Service", services), ("Pod", pods)):
            for item in items:
                meta = item["metadata"]
                mine = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME) == job.name
                refs = meta.get("ownerReferences") or []
                orphaned = any(r["uid"] not in owners for r in refs if r["kind"] != "Node")
                if mine or orphaned:
                    left.append(f"{kind} {meta['name']}")
        return left

    def _logs(self) -> str:
        return "; ".join(
            f"operator log {p.log_path}:\n{p.tail(25)}" for p in self.operators() if p.log_path
        )

    def assert_no_traceback(self) -> None:
        for process in self.operators():
            text = process.log_path.read_text(errors="replace")
            assert "Traceback" not in text, seeded(
                f"a traceback in the operator's log {process.log_path}:\n"
                + text[text.index("Traceback") - 500 :][:4000]
            )
