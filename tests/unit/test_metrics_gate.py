"""The metrics endpoint's gate: TokenReview and SubjectAccessReview, cached, bounded.

The reviews are answered by a stand-in for the apiserver (the real one answers them in
tests/operator/test_metrics_auth.py and in the e2e tier, where Prometheus scrapes
through the gate); these tests cover what the apiserver cannot be made to show on
demand: the cache's expiry on a clock moved by hand, failures, concurrent scrapes, a
flood of made-up tokens. The server itself is served over TLS on a local socket.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.unit.fakeapi import ManualClock
from tpu_operator.runtime import metrics_server as ms
from tpu_operator.runtime.metrics_server import Gate, MetricsServer, User

pytestmark = pytest.mark.unit

READER = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "uid": "u-1",
    "groups": ["system:serviceaccounts", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
}


class Apiserver:
    """Answers reviews as the apiserver would, and records them."""

    def __init__(self) -> None:
        self.tokens: dict[str, Mapping[str, Any]] = {"reader-token": READER}
        self.allowed: set[str] = {READER["username"]}
        self.asked: list[tuple[str, Mapping[str, Any]]] = []
        self.failing = False
        self.delay = 0.0
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.asked.append((path, body))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.failing:
                raise OSError("connection refused")
        finally:
            self.in_flight -= 1
        spec = body["spec"]
        if path == ms.TOKEN_REVIEWS:
            user = self.tokens.get(spec["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": user}}
        assert path == ms.ACCESS_REVIEWS
        allowed = spec["user"] in self.allowed and spec["nonResourceAttributes"] == {
            "path": "/metrics",
            "verb": "get",
        }
        return {"status": {"allowed": allowed}}

    def kinds(self) -> list[str]:
        return ["token" if p == ms.TOKEN_REVIEWS else "access" for p, _ in self.asked]


def check(gate: Gate, header: str | None, verb: str = "get", path: str = "/metrics") -> int:
    return asyncio.run(gate.check(header, verb, path)).status


def gate_on(apiserver: Apiserver, clock: ManualClock, **options: Any) -> Gate:
    counted: list[tuple[str, str]] = []
    gate = Gate(apiserver, clock=clock, counted=lambda *r: counted.append(r), **options)
    gate.counted_log = counted  # type: ignore[attr-defined]
    return gate


def test_a_scrape_without_a_bearer_token_is_refused_without_asking():
    apiserver, clock = Apiserver(), ManualClock()
    gate = gate_on(apiserver, clock)
    assert check(gate, None) == 401
    assert check(gate, "Basic dXNlcjpwYXNz") == 401
    assert check(gate, "Bearer ") == 401
    assert apiserver.asked == []


def test_an_authorized_scraper_gets_in_and_its_reviews_are_reused_until_they_expire():
    apiserver, clock = Apiserver(), ManualClock()
    gate = gate_on(apiserver, clock)
    assert check(gate, "Bearer reader-token") == 200
    assert apiserver.kinds() == ["token", "access"]
    token_review, access_review = (body for _, body in apiserver.asked)
    assert token_review["spec"] == {"token": "reader-token"}
    assert access_review["spec"] == {
        "user": READER["username"],
        "uid": "u-1",
        "groups": READER["groups"],
        "extra": READER["extra"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    # A scrape every 15 s for the token's TTL: no more reviews.
    for _ in range(3):
        clock.now += 15
        assert check(gate, "bearer reader-token") == 200
    assert len(apiserver.asked) == 2
    clock.now = ms.AUTHENTICATED_TTL  # the token's review expired, the access one not
    assert check(gate, "Bearer reader-token") == 200
    assert apiserver.kinds() == ["token", "access", "token"]
    clock.now = ms.ALLOWED_TTL + 1
    assert check(gate, "Bearer reader-token") == 200
    assert apiserver.kinds() == ["token", "access", "token", "token", "access"]
    assert gate.counted_log[:2] == [  # type: ignore[attr-defined]
        ("TokenReview", "authenticated"),
        ("SubjectAccessReview", "allowed"),
    ]


def test_a_token_the_apiserver_rejects_is_refused_and_asked_again_after_its_ttl():
    apiserver, clock = Apiserver(), ManualClock()
    gate = gate_on(apiserver, clock)
    assert check(gate, "Bearer made-up") == 401
    assert check(gate, "Bearer made-up") == 401
    assert apiserver.kinds() == ["token"]
    clock.now = ms.UNAUTHENTICATED_TTL
    apiserver.tokens["made-up"] = READER  # e.g. a token that was not valid yet
    assert check(gate, "Bearer made-up") == 200
    assert apiserver.kinds() == ["token", "token", "access"]
    assert ("TokenReview", "unauthenticated") in gate.counted_log  # type: ignore[attr-defined]


def test_a_user_without_the_permission_is_forbidden_and_its_denial_expires_sooner():
    apiserver, clock = Apiserver(), ManualClock()
    apiserver.allowed.clear()
    gate = gate_on(apiserver, clock)
    verdict = asyncio.run(gate.check("Bearer reader-token", "get", "/metrics"))
    assert verdict.status == 403
    assert verdict.message == f"Forbidden: {READER['username']} may not get /metrics"
    assert check(gate, "Bearer reader-token") == 403
    assert apiserver.kinds() == ["token", "access"]
    apiserver.allowed.add(READER["username"])  # the ClusterRoleBinding is created
    clock.now = ms.DENIED_TTL
    assert check(gate, "Bearer reader-token") == 200
    assert apiserver.kinds() == ["token", "access", "access"]


def test_other_paths_and_verbs_are_authorized_as_such():
    apiserver, clock = Apiserver(), ManualClock()
    gate = gate_on(apiserver, clock)
    assert check(gate, "Bearer reader-token", verb="post") == 403
    assert check(gate, "Bearer reader-token", path="/debug") == 403
    attributes = [b["spec"]["nonResourceAttributes"] for p, b in apiserver.asked[1:]]
    assert attributes == [{"path": "/metrics", "verb": "post"}, {"path": "/debug", "verb": "get"}]


def test_a_failed_review_refuses_the_scrape_and_is_not_cached():
    apiserver, clock = Apiserver(), ManualClock()
    apiserver.failing = True
    gate = gate_on(apiserver, clock)
    assert check(gate, "Bearer reader-token") == 500
    assert ("TokenReview", "error") in gate.counted_log  # type: ignore[attr-defined]
    apiserver.failing = False
    assert check(gate, "Bearer reader-token") == 200
    assert apiserver.kinds() == ["token", "token", "access"]


def test_concurrent_scrapes_with_one_token_share_one_review():
    apiserver, clock = Apiserver(), ManualClock()
    apiserver.delay = 0.05
    gate = gate_on(apiserver, clock)

    async def scrapes() -> list[int]:
        verdicts = await asyncio.gather(
            *(gate.check("Bearer reader-token", "get", "/metrics") for _ in range(10))
        )
        return [v.status for v in verdicts]

    assert asyncio.run(scrapes()) == [200] * 10
    assert apiserver.kinds() == ["token", "access"]


def test_a_flood_of_made_up_tokens_keeps_few_reviews_in_flight_and_a_bounded_cache():
    apiserver, clock = Apiserver(), ManualClock()
    apiserver.delay = 0.01
    gate = gate_on(apiserver, clock, entries=16)

    async def flood() -> list[int]:
        verdicts = await asyncio.gather(
            *(gate.check(f"Bearer forged-{i}", "get", "/metrics") for i in range(40))
        )
        return [v.status for v in verdicts]

    assert asyncio.run(flood()) == [401] * 40
    assert apiserver.most_in_flight == ms.REVIEWS_AT_ONCE
    assert len(gate._users) == 16


def test_refusals_are_logged_at_most_once_per_interval(caplog):
    apiserver, clock = Apiserver(), ManualClock()
    gate = gate_on(apiserver, clock)
    with caplog.at_level("WARNING", logger=ms.__name__):
        for i in range(5):
            check(gate, f"Bearer forged-{i}")
        clock.now = ms.REFUSALS_LOGGED_EVERY
        check(gate, "Bearer forged-last")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "token was not accepted: invalid bearer token" in lines[0]
    assert "(4 more since the last such line)" in lines[1]


def test_the_user_of_a_review_keeps_what_the_access_review_needs():
    user = User.from_review(READER)
    assert user.name == READER["username"]
    assert user.groups == tuple(READER["groups"])
    assert User.from_review({"username": "alice"}).access_review("get", "/metrics")["spec"] == {
        "user": "alice",
        "groups": [],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def _serve(server: MetricsServer, *requests: tuple[str, str | None]) -> list[Any]:
    async def run() -> list[Any]:
        await server.start()
        try:
            return [await asyncio.to_thread(_get, url, token) for url, token in requests]
        finally:
            await server.stop()

    return asyncio.run(run())


def test_the_server_answers_over_tls_only_the_scrapers_the_gate_lets_in():
    registry = CollectorRegistry()
    Counter("tpu_operator_example_total", "An example", registry=registry).inc()
    port = _free_port()
    server = MetricsServer(registry, port, "127.0.0.1", gate=Gate(Apiserver()))
    base = f"https://127.0.0.1:{port}"
    anonymous, forged, reader, other = _serve(
        server,
        (f"{base}/metrics", None),
        (f"{base}/metrics", "forged"),
        (f"{base}/metrics", "reader-token"),
        (f"{base}/other", "reader-token"),
    )
    assert anonymous[0] == 401 and anonymous[2].get("WWW-Authenticate") == "Bearer"
    assert "tpu_operator_example_total" not in anonymous[1]
    assert forged[0] == 401
    assert reader[0] == 200 and "tpu_operator_example_total 1.0" in reader[1]
    assert other[0] == 403  # the gate answers first: nothing tells a stranger what exists


def test_the_server_refuses_plain_http_when_it_serves_tls():
    port = _free_port()
    server = MetricsServer(CollectorRegistry(), port, "127.0.0.1", gate=Gate(Apiserver()))

    async def run() -> BaseException | None:
        await server.start()
        try:
            await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        except Exception as exc:
            return exc
        finally:
            await server.stop()
        return None

    assert isinstance(asyncio.run(run()), (urllib.error.URLError, ConnectionError, OSError))


def test_without_a_gate_the_server_answers_anyone_over_plain_http():
    registry = CollectorRegistry()
    Counter("tpu_operator_example_total", "An example", registry=registry).inc()
    port = _free_port()
    (answer,) = _serve(
        MetricsServer(registry, port, "127.0.0.1"), (f"http://127.0.0.1:{port}/metrics", None)
    )
    assert answer[0] == 200 and "tpu_operator_example_total 1.0" in answer[1]


def test_a_provided_certificate_is_served_and_a_broken_one_is_named(tmp_path: Path):
    certs = tmp_path / "certs"
    certs.mkdir()
    ms.self_signed(["metrics.example"], certs)
    assert ms.cert_dir_problem(str(certs)) is None
    port = _free_port()
    server = MetricsServer(CollectorRegistry(), port, "127.0.0.1", cert_dir=str(certs))

    async def served_names() -> list[str]:
        await server.start()
        try:
            context = ssl.create_default_context(cafile=str(certs / "tls.crt"))
            context.check_hostname = False
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            cert = writer.get_extra_info("peercert")
            writer.close()
            return [value for kind, value in cert["subjectAltName"] if kind == "DNS"]
        finally:
            await server.stop()

    assert asyncio.run(served_names()) == ["metrics.example"]
    (certs / "tls.key").unlink()
    assert "tls.key is missing" in (ms.cert_dir_problem(str(certs)) or "")
    (certs / "tls.key").write_text("not a key")
    assert "do not load" in (ms.cert_dir_problem(str(certs)) or "")
