"""The progress sampler's reads: leaders every round, everyone every sixth, unless no
worker answered the round before (``runtime/sampler.py``). Workers are a local HTTP
server on 127.0.0.1; a worker "not serving" has its pod IP at 127.0.0.2, where nothing
listens (the connection is refused at once)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from tpu_operator import contract, worker_metrics
from tpu_operator.runtime import sampler as sampler_module
from tpu_operator.runtime.caches import Caches, identity_of
from tpu_operator.runtime.listwatch import PODS
from tpu_operator.runtime.sampler import ProgressSampler, monitoring_of, round_targets
from tpu_operator.state.views import pod_view

pytestmark = pytest.mark.unit

NAMESPACE, JOB, SLICES, HOSTS = "ml", "j", 2, 8
SERVING, SILENT = "127.0.0.1", "127.0.0.2"


def worker_pod(slice_index: int, worker: int, ip: str) -> dict[str, Any]:
    slice_name = contract.slice_name(JOB, slice_index)
    return {
        "metadata": {
            "name": contract.pod_name(slice_name, worker),
            "namespace": NAMESPACE,
            "uid": f"uid-{slice_index}-{worker}",
            "labels": {
                contract.LABEL_SLICE_NAME: slice_name,
                contract.LABEL_JOB_NAME: JOB,
                contract.LABEL_WORKER_INDEX: str(worker),
                contract.LABEL_RESTART_ATTEMPT: "1",
            },
        },
        "spec": {"nodeName": f"node-{slice_index}-{worker}"},
        "status": {"phase": "Running", "podIP": ip},
    }


def caches(leaders_serve: bool) -> Caches:
    return cached(
        *(
            worker_pod(s, w, SERVING if leaders_serve and w == 0 else SILENT)
            for s in range(SLICES)
            for w in range(HOSTS)
        )
    )


def cached(*bodies: dict[str, Any]) -> Caches:
    store = PODS.store()
    for body in bodies:
        view = pod_view(body)
        assert view is not None
        store.put(identity_of(body), view)
    return Caches(pods=store, slices={}, jobs={}, nodes={})


async def rounds(leaders_serve: bool, count: int, serve_from: int = 0) -> tuple[list[str], int]:
    """Run ``count`` sampling rounds of one Running job (its leaders serving metrics
    from round ``serve_from`` on, if ``leaders_serve``); the addresses the sampler read
    (in order, as the server saw them) and its count of reads."""
    served: list[str] = []

    async def metrics(request: web.Request) -> web.Response:
        served.append(request.remote or "")
        return web.Response(text="")  # a worker that has not trained yet: no samples

    app = web.Application()
    app.router.add_get(worker_metrics.METRICS_PATH, metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, SERVING, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    job = {
        "metadata": {"namespace": NAMESPACE, "name": JOB, "uid": "u", "generation": 1},
        "spec": {"ports": {"metrics": port}},
        "status": {"phase": "Running", "attempt": 1},
    }
    silent, serving = caches(False), caches(leaders_serve)
    first = serving if serve_from == 0 else silent
    sampler = ProgressSampler(first, lambda _key: None, timeout=1.0)
    sampler.open()  # no sampling loop: the test drives the rounds
    try:
        monitoring = sampler_monitoring(job)
        for number in range(count):
            if number == serve_from:
                sampler.caches = serving
            await sampler._sample((NAMESPACE, JOB), job, monitoring)
    finally:
        await sampler.stop()
        await runner.cleanup()
    return served, sampler.reads


def sampler_monitoring(job: dict[str, Any]) -> Any:
    monitoring = monitoring_of(job)
    assert monitoring is not None  # monitoring is on by default
    return monitoring


def test_a_job_whose_workers_serve_no_metrics_is_read_one_worker_a_round():
    """12 rounds: the first reads all 16 workers and none answers; after that one leader
    (worker 0 of a slice, each slice in turn) is read a round, the sixth round included."""
    served, reads = asyncio.run(rounds(leaders_serve=False, count=12))
    assert served == []
    assert reads == SLICES * HOSTS + 11  # 27; 38 with a read per slice, 52 with full rounds


def test_a_silent_job_is_read_in_full_again_once_a_leader_answers():
    """Rounds 1-3 find nobody (16 reads, then one a round); the leaders serve from round
    4 on: its one read answers, rounds 5 and 6 read both leaders, round 7 everyone."""
    served, reads = asyncio.run(rounds(leaders_serve=True, count=7, serve_from=3))
    assert reads == SLICES * HOSTS + 3 + 2 * SLICES + SLICES * HOSTS
    assert len(served) == 1 + 3 * SLICES


def test_once_the_leaders_answer_every_sixth_round_reads_every_worker():
    served, reads = asyncio.run(rounds(leaders_serve=True, count=12))
    assert reads == 2 * SLICES * HOSTS + 10 * SLICES
    assert len(served) == 12 * SLICES  # the leaders answered every round


def test_monitoring_settings_are_parsed_once_per_generation_and_dropped_with_the_job(
    monkeypatch: pytest.MonkeyPatch,
):
    """The settings are parsed when a job or its spec is new (the resync of a replica that
    starts to act, then each job's events), and kept for as many jobs as exist, however
    many that is."""
    parsed: list[str] = []

    def counted(job: dict[str, Any]) -> Any:
        parsed.append(job["metadata"]["name"])
        return monitoring_of(job)

    monkeypatch.setattr(sampler_module, "monitoring_of", counted)
    jobs: dict[Any, list[Any]] = {}

    def put(name: str, generation: int) -> dict[str, Any]:
        meta = {"namespace": NAMESPACE, "name": name, "uid": f"uid-{name}"}
        body = {"metadata": {**meta, "generation": generation}, "status": {"phase": "Pending"}}
        jobs[("job", NAMESPACE, name)] = [body]
        return body

    for i in range(12_000):  # more jobs than any fixed bound would hold
        put(f"j{i}", 1)
    sampler = ProgressSampler(Caches(pods=PODS.store(), slices={}, jobs=jobs, nodes={}), print)
    sampler.resync()
    sampler.tick()
    assert len(parsed) == 12_000
    parsed.clear()
    sampler.job_changed("MODIFIED", put("j7", 2))  # its spec changed
    sampler.job_changed("MODIFIED", put("j9", 1))  # its status changed
    sampler.job_changed("DELETED", jobs.pop(("job", NAMESPACE, "j8"))[0])
    sampler.tick()
    assert parsed == ["j7"]
    assert len(sampler._settings) == 11_999
    del jobs[("job", NAMESPACE, "j10")]  # gone while this replica stood by
    sampler.resync()
    assert len(sampler._settings) == 11_998


def _job(name: str, phase: str, *, monitoring: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {"monitoring": {"enabled": monitoring}},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("events", "sampled"),
    [
        pytest.param([(None, _job("a", "Running"))], ["a"], id="listed running"),
        pytest.param([(None, _job("a", "Pending"))], [], id="not yet active"),
        pytest.param([(None, _job("a", "Running", monitoring=False))], [], id="monitoring off"),
        pytest.param(
            [(None, _job("a", "Running")), ("MODIFIED", _job("a", "Succeeded"))],
            [],
            id="finished",
        ),
        pytest.param(
            [(None, _job("a", "Running")), ("DELETED", _job("a", "Running"))],
            [],
            id="deleted",
        ),
        pytest.param(
            [(None, _job("a", "Pending")), ("MODIFIED", _job("a", "Starting"))],
            [],
            id="starting: not every worker runs",
        ),
        pytest.param(
            [(None, _job("a", "Starting")), ("MODIFIED", _job("a", "Running"))],
            ["a"],
            id="became active",
        ),
        pytest.param(
            [(None, _job("a", "Running")), ("MODIFIED", _job("a", "Restarting"))],
            [],
            id="restarting",
        ),
    ],
)
def test_the_sampled_jobs_follow_their_events(
    events: list[tuple[str | None, dict[str, Any]]], sampled: list[str]
) -> None:
    sampler = ProgressSampler(Caches(pods=PODS.store(), slices={}, jobs={}, nodes={}), print)
    for type, body in events:
        sampler.job_changed(type, body)
    assert sorted(name for _, name in sampler._sampled) == sampled


def test_a_tick_looks_only_at_the_jobs_it_samples() -> None:
    """A shared cluster's idle or unmonitored jobs cost a tick nothing: the tick reads
    the sampled jobs from the cache by key and never walks every job."""
    jobs: dict[Any, list[Any]] = {}
    for i in range(1_000):
        body = _job(f"idle{i}", "Succeeded")
        jobs[("job", NAMESPACE, body["metadata"]["name"])] = [body]
    running = _job("running", "Running")
    jobs[("job", NAMESPACE, "running")] = [running]
    caches_ = Caches(pods=PODS.store(), slices={}, jobs=jobs, nodes={})
    sampler = ProgressSampler(caches_, print)
    sampler.resync()
    assert list(sampler._sampled) == [(NAMESPACE, "running")]

    def walked() -> Any:
        raise AssertionError("a tick walked every cached job")

    caches_.jobs = walked  # type: ignore[method-assign]

    async def one_tick() -> list[str]:
        sampler.tick()
        started = [task.get_name() for task in sampler._busy.values()]
        for task in sampler._busy.values():
            task.cancel()
        return started

    assert asyncio.run(one_tick()) == ["sample-running"]
    # Gone from the cache before its DELETED event: dropped at the next tick.
    del jobs[("job", NAMESPACE, "running")]
    sampler._busy.clear()
    sampler._due.clear()
    assert asyncio.run(one_tick()) == []
    assert sampler._sampled == {}


def pod_at(slice_index: int, worker: int, attempt: int = 1, **status: Any) -> dict[str, Any]:
    body = worker_pod(slice_index, worker, SERVING)
    body["metadata"]["uid"] += f"-a{attempt}"
    labels = body["metadata"]["labels"]
    labels[contract.LABEL_RESTART_ATTEMPT] = str(attempt)
    labels[contract.LABEL_SLICE_INDEX] = str(slice_index)
    body["status"].update(status)
    return body


MIXED = (
    pod_at(1, 0),
    pod_at(1, 1),
    pod_at(0, 0),
    pod_at(0, 1),
    pod_at(2, 0, attempt=2),  # the next attempt's
    pod_at(3, 0, phase="Pending"),
    pod_at(4, 0, podIP=""),
)


@pytest.mark.parametrize(
    ("full", "silent", "round_number", "names"),
    [
        pytest.param(True, False, 0, ["j-0-0", "j-0-1", "j-1-0", "j-1-1"], id="full round"),
        pytest.param(False, False, 1, ["j-0-0", "j-1-0"], id="leaders, by slice"),
        pytest.param(False, True, 1, ["j-1-0"], id="silent: one leader, round 1"),
        pytest.param(False, True, 2, ["j-0-0"], id="silent: the next leader, round 2"),
    ],
)
def test_a_round_reads_the_readable_pods_of_the_attempt(
    full: bool, silent: bool, round_number: int, names: list[str]
) -> None:
    """Pods of another attempt, not Running or without an IP are never read; a round that
    is not full reads the leaders from their own index, in slice order."""
    targets = round_targets(cached(*MIXED), (NAMESPACE, JOB), 1, full, silent, round_number)
    found = [p.name for p in targets]
    assert (sorted(found) if full else found) == names


def test_no_readable_leader_reads_nobody() -> None:
    caches = cached(pod_at(0, 1), pod_at(1, 0, phase="Pending"))
    assert round_targets(caches, (NAMESPACE, JOB), 1, False, True, 3) == []
