"""Helpers for tests on the local cluster: polling with clear timeouts, pod manifests.

Importable from any test (``from localcluster.testing import wait_until, tpu_pod``); the
fixtures in ``tests/conftest.py`` expose the same things.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from localcluster.pools import ACCELERATOR_LABEL, POOL_LABEL, TOPOLOGY_LABEL, TPU_RESOURCE

T = TypeVar("T")

TPU_TOLERATION = {
    "key": TPU_RESOURCE,
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}


class WaitTimeout(AssertionError):
    """A condition did not hold in time; the message says what and shows the last value."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.2,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy; return that.

    Exceptions from ``probe`` count as "not yet" (the last one is reported on timeout).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last = probe()
            error = None
            if last:
                return last
        except Exception as exc:
            error = exc
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            detail = f"; last error: {error!r}" if error else f"; last value: {last!r}"
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


def pod(
    name: str,
    command: Sequence[str],
    *,
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    restart_policy: str = "Never",
    grace: int | None = None,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    container: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A one-container pod running ``command`` (image is informative only)."""
    main: dict[str, Any] = {"name": "main", "image": "local", "command": list(command)}
    if env:
        main["env"] = [{"name": k, "value": v} for k, v in env.items()]
    main.update(container or {})
    pod_spec: dict[str, Any] = {"restartPolicy": restart_policy, "containers": [main]}
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    pod_spec.update(spec or {})
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def tpu_pod(
    name: str,
    command: Sequence[str],
    *,
    accelerator: str,
    topology: str,
    chips: int = 4,
    pool: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A pod placed as GKE TPU workloads are: selectors, toleration, google.com/tpu."""
    manifest = pod(name, command, **kwargs)
    spec = manifest["spec"]
    selector = {ACCELERATOR_LABEL: accelerator, TOPOLOGY_LABEL: topology}
    if pool:
        selector[POOL_LABEL] = pool
    spec.setdefault("nodeSelector", {}).update(selector)
    spec.setdefault("tolerations", []).append(dict(TPU_TOLERATION))
    spec["containers"][0]["resources"] = {
        "requests": {TPU_RESOURCE: str(chips)},
        "limits": {TPU_RESOURCE: str(chips)},
    }
    return manifest
