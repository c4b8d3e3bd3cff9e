"""Async apiserver client of the node agent: raw aiohttp, JSON dicts, JSON-lines watches.

Why raw aiohttp rather than kubernetes_asyncio: the agent handles thousands of pods in
simulate mode and every event is only inspected for a few fields, so deserializing into
generated model classes (and back for patches) would be most of its CPU on a 2-core
machine; watch streams are plain JSON lines that ``json.loads`` handles directly. The
agent needs strategic-merge patches of ``pods/status`` with explicit ``null``s (as the
kubelet sends them), preconditioned deletes, and one long-lived watch per resource:
a few dozen lines here, with full control of connection pooling and timeouts.

Authentication is the node agent's client certificate from the cluster's PKI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class KubeError(RuntimeError):
    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Kube:
    """A pooled HTTPS client for one apiserver."""

    def __init__(
        self, server: str, ca: Path, cert: Path, key: Path, *, connections: int = 64
    ) -> None:
        self.server = server.rstrip("/")
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        self._connector = aiohttp.TCPConnector(ssl=context, limit=connections)
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            timeout=aiohttp.ClientTimeout(total=30, sock_connect=5),
            json_serialize=json.dumps,
        )

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = json.dumps(body) if body is not None else None
        headers = {"Accept": JSON}
        if data is not None:
            headers["Content-Type"] = content_type
        async with self._session.request(
            method, self.server + path, data=data, headers=headers, params=params
        ) as response:
            raw = await response.read()
            try:
                payload = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                payload = raw.decode(errors="replace")
            return response.status, payload

    async def wait_serving(self, stop: asyncio.Event, interval: float = 0.2) -> bool:
        """Wait until the apiserver answers ``/readyz`` with 200, as a kubelet retries its
        registration until the apiserver takes it: the launcher starts the agent together
        with the apiserver, and a fast agent would otherwise register its nodes before
        the apiserver listens. False if ``stop`` was set first."""
        while not stop.is_set():
            try:
                status, _ = await self.request("GET", "/readyz")
                if status == 200:
                    return True
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
        return False

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """Like :meth:`request`, raising :class:`KubeError` for a status >= 300 not in ``ok``."""
        status, payload = await self.request(
            method, path, body, content_type=content_type, params=params
        )
        if status >= 300 and status not in ok:
            raise KubeError(status, payload, method, path)
        return payload

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events of ``path`` (JSON lines) until the server ends the stream."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None)
        async with self._session.get(
            self.server + path, params=query, timeout=timeout, headers={"Accept": JSON}
        ) as response:
            if response.status == 410:
                raise WatchExpired(path)
            if response.status >= 300:
                raise KubeError(response.status, await response.text(), "WATCH", path)
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                while (newline := buffer.find(b"\n")) >= 0:
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object", {})
                        if status.get("code") == 410:
                            raise WatchExpired(path)
                        raise KubeError(status.get("code", 500), status, "WATCH", path)
                    yield event


EventHandler = Callable[[str, dict[str, Any]], Awaitable[None] | None]


async def list_watch(
    kube: Kube,
    path: str,
    params: Mapping[str, str],
    on_event: EventHandler,
    *,
    on_synced: Callable[[list[dict[str, Any]]], Awaitable[None] | None] | None = None,
) -> None:
    """An informer without a cache: list, then watch from the list's resourceVersion.

    ``on_synced`` sees every listed object first (a re-list after a 410 too), then
    ``on_event(type, object)`` each change. Reconnects forever with a short back-off.
    """
    resource_version = ""
    backoff = 0.2
    while True:
        try:
            if not resource_version:
                listing = await kube.call("GET", path, params=params)
                resource_version = listing["metadata"]["resourceVersion"]
                if on_synced is not None:
                    result = on_synced(listing.get("items", []))
                    if result is not None:
                        await result
            async for event in kube.watch(path, {**params, "resourceVersion": resource_version}):
                obj = event["object"]
                resource_version = obj["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                result = on_event(event["type"], obj)
                if result is not None:
                    await result
            backoff = 0.2
        except WatchExpired:
            resource_version = ""
        except asyncio.CancelledError:
            raise
        except Exception as error:  # reconnect on any transport or server error
            log.warning("watch %s failed (%s); retrying in %.1f s", path, error, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
