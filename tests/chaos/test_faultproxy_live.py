"""The fault proxy against the real kube-apiserver, seen by the official client: requests
pass with the upstream credentials, watches stream, and each fault kind arrives as a real
apiserver's would (status, headers, Status body, a cut connection, a 410 ERROR event)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from localcluster import Cluster
from localcluster.faultproxy import STATS_PATH, FaultProxy, Rates

pytestmark = pytest.mark.chaos


def test_each_fault_reaches_the_client_as_the_apiserver_would_send_it(
    chaos_cluster: Cluster, seed: int, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "proxy.kubeconfig"
    with FaultProxy(chaos_cluster.kubeconfig, kubeconfig, seed=seed) as proxy:
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        assert len(api.list_node().items) > 0  # forwarded with the admin's certificate

        proxy.set_rates(Rates(expire=1.0, watch_delay=(0.5, 0.5)))
        events = []
        with pytest.raises(ApiException) as expired:
            for event in watch.Watch().stream(api.list_namespace, timeout_seconds=30):
                events.append(event["type"])
        assert events and set(events) == {"ADDED"}, events  # streamed before the expiry
        assert expired.value.status == 410 and "Expired" in str(expired.value)

        proxy.set_rates(Rates(throttle=1.0, retry_after=2))
        with pytest.raises(ApiException) as throttled:
            api.list_node()
        assert throttled.value.status == 429
        assert throttled.value.headers is not None and throttled.value.body is not None
        assert throttled.value.headers["Retry-After"] == "2"
        assert json.loads(throttled.value.body)["reason"] == "TooManyRequests"

        for rate, code, reason in (
            (Rates(internal=1.0), 500, "InternalError"),
            (Rates(unavailable=1.0), 503, "ServiceUnavailable"),
        ):
            proxy.set_rates(rate)
            with pytest.raises(ApiException) as failed:
                api.list_node()
            body = json.loads(failed.value.body or "{}")
            assert (failed.value.status, body.get("reason")) == (code, reason)

        proxy.set_rates(Rates(reset=1.0))
        with pytest.raises(urllib3.exceptions.HTTPError):  # the client's retries are cut too
            api.list_node(_request_timeout=10)

        proxy.set_rates(Rates())
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}{STATS_PATH}") as answer:
            stats = json.loads(answer.read())
    assert stats["seed"] == seed
    kinds = [fault["kind"] for fault in stats["injected"]]
    assert {"expire", "throttle", "internal", "unavailable", "reset"} <= set(kinds), kinds
    counted = {label for second in stats["per_second"].values() for label in second}
    assert {"list nodes", "watch namespaces", "list namespaces"} & counted, counted
