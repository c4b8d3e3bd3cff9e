"""A small synchronous JSON client for the local apiserver (standard library only).

The launcher uses it to wait for readiness without importing a full Kubernetes client;
tests may use it for raw requests. It speaks JSON and returns plain dicts.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body


@dataclass
class SyncApi:
    """Client-certificate authenticated JSON requests against one apiserver."""

    server: str
    ca: Path
    cert: Path
    key: Path
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self._context = ssl.create_default_context(cafile=str(self.ca))
        self._context.load_cert_chain(str(self.cert), str(self.key))
        parts = urlsplit(self.server)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 443

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=self.timeout
        )
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            data: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            data = raw.decode(errors="replace")
        return response.status, data

    def get(self, path: str) -> Any:
        status, data = self.request("GET", path)
        if status >= 300:
            raise ApiError(status, data, "GET", path)
        return data

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data = self.request(method, path, body, **kwargs)
        if status >= 300:
            raise ApiError(status, data, method, path)
        return data
