"""The agent's control API: HTTP+JSON over a unix socket in the cluster directory.

Only processes that can open the socket file (mode 0600, owned by the agent's user) can
use it. Routes (all answer JSON; errors are ``{"error": message}`` with 400/404/409):

==========================================  ===============================================
``GET  /healthz``                           ``{"ready": bool}`` (nodes registered)
``GET  /status``                            nodes, run-mode pods and their processes
``POST /pools``                             add a pool (body: a pool as in pools.yaml)
``DELETE /pools/{name}``                    remove a pool and its nodes
``POST /nodes/{name}/partition``            stop heartbeats, Ready=Unknown
``POST /nodes/{name}/not-ready``            Ready=False, heartbeats go on (``message``)
``POST /nodes/{name}/heal``                 back to Ready=True with heartbeats
``DELETE /nodes/{name}?graceful=0|1``       preemption: the VM and its processes are gone
``POST /pods/{ns}/{name}/kill``             SIGKILL, report ``exit_code`` (``container``,
                                            ``reason`` optional)
``POST /pods/{ns}/{name}/evict``            Eviction API (``grace_period_seconds``)
``PUT  /autoprovisioning``                  simulated autoscaler settings (``null``: off)
==========================================  ===============================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from localcluster.agent.kube import KubeError
from localcluster.agent.provisioner import Autoprovisioning
from localcluster.pools import PoolError, pool_from_dict

if TYPE_CHECKING:
    from localcluster.agent.kube import Kube
    from localcluster.agent.nodes import NodeManager
    from localcluster.agent.pods import PodManager
    from localcluster.agent.provisioner import AutoProvisioner

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Controlled(Protocol):
    """What the control API acts on: the node agent's parts (``app.Agent`` is one)."""

    ready: asyncio.Event
    kube: Kube
    nodes: NodeManager
    pods: PodManager
    provisioner: AutoProvisioner | None

    def status(self) -> dict[str, Any]: ...

    async def set_autoprovisioning(self, config: Autoprovisioning | None) -> None: ...


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except KeyError as error:
        return web.json_response({"error": f"not found: {error.args[0]}"}, status=404)
    except LookupError as error:
        return web.json_response({"error": str(error)}, status=409)
    except (ValueError, PoolError) as error:
        return web.json_response({"error": str(error)}, status=400)
    except KubeError as error:
        return web.json_response({"error": str(error)}, status=error.status)


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    data = await request.json()
    if not isinstance(data, dict):
        raise ValueError("the request body must be a JSON object")
    return data


def build_app(agent: Controlled) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ready": agent.ready.is_set()})

    @routes.get("/status")
    async def status(_: web.Request) -> web.Response:
        return web.json_response(agent.status())

    @routes.post("/pools")
    async def add_pool(request: web.Request) -> web.Response:
        pool = pool_from_dict(await _body(request))
        nodes = await agent.nodes.add_pool(pool)
        if pool.autoscaling and agent.provisioner is not None:
            agent.provisioner.templates[pool.name] = pool
        return web.json_response({"pool": pool.name, "nodes": nodes})

    @routes.put("/autoprovisioning")
    async def autoprovisioning(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        config = Autoprovisioning.from_json(body) if body is not None else None
        await agent.set_autoprovisioning(config)
        return web.json_response({"autoprovisioning": config.to_json() if config else None})

    @routes.delete("/pools/{name}")
    async def remove_pool(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        pool = agent.nodes.pools.get(name)
        if pool is None:
            raise KeyError(f"pool {name}")
        for node in pool.node_names():
            if node in agent.nodes.nodes:
                await agent.pods.on_node_deleted(node, graceful=False)
        nodes = await agent.nodes.remove_pool(name)
        return web.json_response({"pool": name, "nodes": nodes})

    @routes.post("/nodes/{name}/partition")
    async def partition(request: web.Request) -> web.Response:
        await agent.nodes.partition(request.match_info["name"])
        return web.json_response({"node": request.match_info["name"], "health": "partitioned"})

    @routes.post("/nodes/{name}/not-ready")
    async def not_ready(request: web.Request) -> web.Response:
        body = await _body(request)
        message = body.get("message") or "container runtime is down (injected fault)"
        await agent.nodes.not_ready(request.match_info["name"], message)
        return web.json_response({"node": request.match_info["name"], "health": "not-ready"})

    @routes.post("/nodes/{name}/heal")
    async def heal(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await agent.nodes.heal(name)
        agent.pods.on_node_healed(name)
        return web.json_response({"node": name, "health": "ready"})

    @routes.delete("/nodes/{name}")
    async def delete_node(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        agent.nodes.get(name)
        graceful = request.query.get("graceful", "0") in ("1", "true")
        await agent.pods.on_node_deleted(name, graceful=graceful)
        await agent.nodes.delete_node(name)
        return web.json_response({"node": name, "deleted": True})

    @routes.post("/pods/{namespace}/{name}/kill")
    async def kill(request: web.Request) -> web.Response:
        body = await _body(request)
        result = agent.pods.kill(
            request.match_info["namespace"],
            request.match_info["name"],
            int(body.get("exit_code", 137)),
            body.get("container"),
            body.get("reason"),
        )
        return web.json_response(result)

    @routes.post("/pods/{namespace}/{name}/evict")
    async def evict(request: web.Request) -> web.Response:
        body = await _body(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        eviction: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if body.get("grace_period_seconds") is not None:
            eviction["deleteOptions"] = {"gracePeriodSeconds": int(body["grace_period_seconds"])}
        result = await agent.kube.call(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", eviction
        )
        return web.json_response(result)

    app = web.Application(middlewares=[_errors])
    app.add_routes(routes)
    return app


async def serve(agent: Controlled, socket_path: Path) -> web.AppRunner:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # noqa: PTH108 - a stale socket from a crashed agent
    runner = web.AppRunner(build_app(agent), access_log=None)
    await runner.setup()
    site = web.UnixSite(runner, str(socket_path))
    old_umask = os.umask(0o177)
    try:
        await site.start()
    finally:
        os.umask(old_umask)
    return runner
