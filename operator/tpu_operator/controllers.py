"""kopf wiring: start-up and clean-up, probes, credentials, Kueue's Workloads, kopf's
settings and ``run``.

TPUJobs, TPUSlices, worker pods and TPU nodes have list-and-watch caches of the
operator's own (``runtime/listwatch.py``, ``reconcile/cached.py``), started here: a shared
cluster's thousands of jobs cost kopf's per-object event processing more than everything
else the operator did for them. kopf watches Kueue's Workloads (``--kueue``), keeping
plain copies of them in an index and calling the ``on.event`` handler below, which only
enqueues keys for the reconcilers. Nothing here writes to any object: the operator stores
no annotations, finalizers or handler results on TPUJobs or TPUSlices, so deleting a
TPUJob never waits for the operator.

With leader election (``--leader-elect``) every replica watches and caches (a warm
standby), and only the replica that acts enqueues (``_acting``, ``Runtime.acting``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

import kopf

from tpu_operator import contract
from tpu_operator.app import OperatorConfig, Runtime
from tpu_operator.builders.workload import KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL
from tpu_operator.reconcile.cached import snapshot
from tpu_operator.runtime import collector, loops
from tpu_operator.runtime.kube import connection_info, load_configuration
from tpu_operator.runtime.leader import LeaderElector

log = logging.getLogger(__name__)
RUNTIME_KEY = "runtime"
WATCH_RETRY_BACKOFFS = (0.5, 1, 2, 3, *(5,) * 10)
"""kopf's retries of a failed API request (its watches'): at most 5 s apart, so a watch is
back within 5 s of the apiserver's (kopf's default grows to 21 s apart). As long in total
as kopf's default (56.5 s against 54 s) before a persistent 5xx escalates."""
ELECTOR_KEY = "elector"
LEADING_KEY = "leading"
STOP_KEY = "stop"
LOST_KEY = "lost"
WATCH_KEY = "own-watches"


def _runtime(memo: Any) -> Runtime:
    return cast(Runtime, memo[RUNTIME_KEY])


def _acting(memo: Any) -> Runtime | None:
    """The runtime if this replica reconciles, None on a standby. Any handler call also
    tells the runtime that kopf's indexes hold their initial listing."""
    runtime = _runtime(memo)
    runtime.listed.set()
    return runtime if runtime.acting else None


def _key(namespace: str | None, name: str) -> tuple[str, str]:
    """The queue key of a TPUJob or TPUSlice. kopf types ``namespace`` as optional (for
    cluster-scoped resources); both kinds are namespaced, so it is always set."""
    return cast(str, namespace), name


def _workload_job(body: kopf.Body) -> str | None:
    """The TPUJob that owns a Kueue Workload (its controller owner reference), if any."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if (
            ref.get("kind") == contract.JOB_KIND
            and ref.get("apiVersion") == contract.API_VERSION
            and ref.get("controller")
        ):
            return cast(str, ref.get("name"))
    return None


async def tpu_workloads(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, Any] | None:
    """Kueue Workloads of TPUJobs, by job (registered only with ``--kueue``)."""
    job = _workload_job(body)
    return {(namespace, job): snapshot(body)} if job else None


async def workload_changed(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    """Kueue admitted, evicted or re-queued a job's Workload: reconcile the job."""
    job = _workload_job(body)
    runtime = _acting(memo)
    if job and runtime is not None:
        runtime.jobs.add(_key(namespace, job))


def watch_workloads() -> None:
    """Watch Kueue's Workloads (``--kueue``; docs/tasks/kueue.md). Registered at run time so an
    operator without Kueue never watches a resource the cluster does not serve."""
    kopf.index(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL)(tpu_workloads)
    kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL)(workload_changed)


@kopf.on.login()
def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use the same credentials as the operator's own API client."""
    return connection_info(load_configuration(memo["config"].kubeconfig))


@kopf.on.startup()
async def started(memo: Any, **kwargs: Any) -> None:
    config = memo["config"]
    runtime = Runtime(config)
    memo[RUNTIME_KEY] = runtime
    if "tpu_workloads" in kwargs:
        runtime.caches.attach_workloads(kwargs["tpu_workloads"])
    memo[WATCH_KEY] = asyncio.create_task(runtime.watch(), name="list-and-watch")
    await runtime.serve()
    if config.leader_election is None:
        memo[LEADING_KEY] = asyncio.create_task(runtime.act(), name="act")
    else:
        elector = LeaderElector(config.leader_election, load_configuration(config.kubeconfig))
        memo[ELECTOR_KEY] = elector
        elector.start()
        memo[LEADING_KEY] = asyncio.create_task(runtime.lead(elector, _on_lost(memo)))
    log.info("tpu-operator started: %s", config.describe())


def _on_lost(memo: Any) -> Callable[[str], None]:
    """Stop kopf as on SIGTERM; ``run`` then exits with status 1."""

    def lost(reason: str) -> None:
        memo[LOST_KEY] = reason
        memo[STOP_KEY].set()

    return lost


@kopf.on.cleanup()
async def stopping(memo: Any, **_: Any) -> None:
    for key in (LEADING_KEY, WATCH_KEY):
        task = memo.get(key)
        if task is not None:
            task.cancel()
    runtime = memo.get(RUNTIME_KEY)
    if runtime is not None:
        # Not wait_for: it would wait for a cancelled stop to finish cancelling too.
        halting = asyncio.ensure_future(runtime.stop())
        done, _pending = await asyncio.wait({halting}, timeout=10)
        if not done:
            log.error("the runtime did not stop within 10 s; exiting without waiting for it")
    elector = memo.get(ELECTOR_KEY)
    if elector is not None:
        # After the runtime stopped: the standby takes over at once, not after expiry.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(elector.release(), timeout=5)


@kopf.on.probe(id="queues")
async def queue_depth(memo: Any, **_: Any) -> dict[str, int]:
    runtime = memo.get(RUNTIME_KEY)
    if runtime is None:
        raise kopf.PermanentError("not started")
    return runtime.depths()


@kopf.on.probe(id="leader")
async def leadership(memo: Any, **_: Any) -> dict[str, Any]:
    """Who leads, as this replica sees it (kopf caches probe results for 10 s)."""
    runtime = memo.get(RUNTIME_KEY)
    elector = memo.get(ELECTOR_KEY)
    found = elector.describe() if elector is not None else {"election": False}
    return {**found, "acting": runtime is not None and runtime.acting}


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's "last handled state" of objects, kept as nothing.

    kopf builds a deep copy of every object on every watch event to diff it against the
    state its create/update handlers last saw. The operator has no such handlers (only
    indexes and on.event), so the copy is pure cost: at hundreds of worker pods it was the
    largest share of the operator's CPU during pod creation and gang restarts.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def operator_settings() -> kopf.OperatorSettings:
    config = kopf.OperatorSettings()
    config.watching.server_timeout = 300
    config.watching.client_timeout = 330
    config.networking.error_backoffs = WATCH_RETRY_BACKOFFS
    config.persistence.diffbase_storage = NoDiffBase()
    config.posting.enabled = False  # the operator posts its own, aggregated events
    config.peering.standalone = True
    # The CRDs are installed with the chart; do not watch CRDs or namespaces for changes
    # (that would need cluster-wide read access to both).
    config.scanning.disabled = True
    return config


def run(config: OperatorConfig) -> int:
    """Run the operator until SIGINT/SIGTERM, or until it loses the leadership; return
    the exit status (1: the leadership was lost)."""
    # The handlers above are registered with kopf's default registry on import.
    address = config.bind_address
    host = f"[{address}]" if ":" in address else address
    liveness = f"http://{host}:{config.health_port}/healthz" if config.health_port else None
    # Raised when the leadership is lost: kopf stops as on SIGTERM. (An asyncio.Event
    # binds to the loop that first waits on it: kopf's.)
    stop = asyncio.Event()
    memo = kopf.Memo(config=config)
    memo[STOP_KEY] = stop
    if config.kueue:
        watch_workloads()
    collector.tune(config.gc_threshold)
    collector.limit_arenas()
    kwargs: dict[str, Any] = {
        "standalone": True,
        "settings": operator_settings(),
        "memo": memo,
        "liveness_endpoint": liveness,
        "stop_flag": stop,
    }
    if config.namespaces:
        kwargs["namespaces"] = config.namespaces
    else:
        kwargs["clusterwide"] = True
    factory, kind = loops.loop_factory(config.event_loop)
    log.info("event loop: %s", kind)
    # The runner closes the loop as asyncio.run does: what is left is cancelled, async
    # generators and the default executor are shut down.
    with asyncio.Runner(loop_factory=factory) as runner:
        kopf.run(loop=runner.get_loop(), **kwargs)
    if memo.get(LOST_KEY):
        log.error("exiting: the leadership was lost (%s)", memo[LOST_KEY])
        return 1
    return 0
