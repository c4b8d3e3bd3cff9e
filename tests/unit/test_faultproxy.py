"""The fault proxy's pure parts: request classification, Status bodies, the schedule."""

from __future__ import annotations

import json

import pytest

from localcluster.faultproxy import (
    Fault,
    Rates,
    RequestKind,
    Schedule,
    Stats,
    classify,
    expired_event,
    fault_response,
    rate,
    rates_from,
)

pytestmark = pytest.mark.unit

POD = RequestKind("get", "pods", False)
WATCH = RequestKind("watch", "pods", True)


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/a/pods", {}, ("list", "pods", False)),
        ("GET", "/api/v1/namespaces/a/pods", {"watch": ["true"]}, ("watch", "pods", True)),
        ("GET", "/api/v1/pods", {"watch": ["1"]}, ("watch", "pods", True)),
        ("GET", "/api/v1/watch/namespaces/a/pods", {}, ("watch", "pods", True)),
        ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "pods", False)),
        (
            "PATCH",
            "/apis/tpu-operator.dev/v1/namespaces/a/tpujobs/j/status",
            {},
            ("patch", "tpujobs/status", False),
        ),
        ("POST", "/api/v1/namespaces/a/pods", {}, ("create", "pods", False)),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            {},
            ("update", "leases", False),
        ),
        ("DELETE", "/api/v1/namespaces/a/pods/p", {}, ("delete", "pods", False)),
        ("DELETE", "/api/v1/namespaces/a/pods", {}, ("deletecollection", "pods", False)),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "namespaces", False)),
        ("GET", "/api/v1/namespaces", {}, ("list", "namespaces", False)),
        ("GET", "/readyz", {}, ("get", "/readyz", False)),
    ],
)
def test_requests_are_named_as_the_apiserver_names_them(
    method: str, path: str, query: dict[str, list[str]], expected: tuple[str, str, bool]
) -> None:
    kind = classify(method, path, query)
    assert (kind.verb, kind.resource, kind.watch) == expected


def test_a_429_is_what_priority_and_fairness_sends() -> None:
    code, headers, body = fault_response(Fault("throttle", retry_after=3))
    assert code == 429 and headers == {"Retry-After": "3"}
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["reason"] == "TooManyRequests" and body["code"] == 429
    assert body["details"] == {"retryAfterSeconds": 3}


@pytest.mark.parametrize(
    ("kind", "code", "reason"),
    [("internal", 500, "InternalError"), ("unavailable", 503, "ServiceUnavailable")],
)
def test_server_errors_carry_their_status_reason(kind: str, code: int, reason: str) -> None:
    status, headers, body = fault_response(Fault(kind))
    assert (status, body["code"], body["reason"]) == (code, code, reason)
    assert "Retry-After" not in headers


def test_resets_and_expiries_have_no_response_body() -> None:
    with pytest.raises(ValueError, match="reset"):
        fault_response(Fault("reset"))


def test_an_expired_watch_ends_with_an_error_event_of_410_gone() -> None:
    line = expired_event("42")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    assert "42" in event["object"]["message"]


def decisions(schedule: Schedule, kinds: list[RequestKind]) -> list[Fault | None]:
    return [schedule.decide(kind, now=0.0) for kind in kinds]


def test_the_same_seed_gives_the_same_faults_and_another_seed_others() -> None:
    rates = Rates(throttle=0.1, internal=0.1, unavailable=0.1, reset=0.1, expire=0.1)
    kinds = [POD, WATCH] * 200
    first = decisions(Schedule(7, rates), kinds)
    assert first == decisions(Schedule(7, rates), kinds)
    assert first != decisions(Schedule(8, rates), kinds)


def test_rates_shape_the_mix_and_expiry_hits_watches_only() -> None:
    rates = Rates(throttle=0.2, expire=0.5)
    plain = [f for f in decisions(Schedule(1, rates), [POD] * 2000) if f]
    watches = [f for f in decisions(Schedule(1, rates), [WATCH] * 2000) if f]
    assert {f.kind for f in plain} == {"throttle"}
    assert 300 < len(plain) < 500  # 20 % of 2000
    assert {f.kind for f in watches} == {"throttle", "expire"}
    assert 1200 < len(watches) < 1600  # 70 % of 2000
    assert all(1.0 <= f.delay <= 8.0 for f in watches)
    assert all(f.delay == 0.0 for f in plain)


def test_no_rates_no_faults() -> None:
    assert decisions(Schedule(3), [POD, WATCH] * 100) == [None] * 200


def test_a_storm_fails_every_request_until_it_ends() -> None:
    schedule = Schedule(5)
    schedule.storm("throttle", until=10.0, retry_after=2)
    assert schedule.decide(POD, now=9.9) == Fault("throttle", retry_after=2)
    assert schedule.decide(WATCH, now=9.9) == Fault("throttle", retry_after=2)
    assert schedule.decide(POD, now=10.0) is None
    with pytest.raises(ValueError, match="expire"):
        schedule.storm("expire", until=1.0)


def test_rates_are_validated() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        Rates(throttle=0.6, reset=0.6)
    with pytest.raises(ValueError, match=">= 0"):
        Rates(internal=-0.1)
    with pytest.raises(ValueError, match="unknown fault kinds"):
        rates_from({"teapot": 0.1})
    assert rates_from({"reset": 0.25}, retry_after=4) == Rates(reset=0.25, retry_after=4)


def test_stats_count_requests_per_second_and_rates_average_them() -> None:
    stats = Stats(started=100.0)
    for now in (100.1, 100.5, 101.2, 103.9):
        stats.request(POD, now)
    stats.fault(WATCH, Fault("expire", delay=2.0), 101.5)
    snapshot = json.loads(json.dumps(stats.as_json()))
    assert snapshot["per_second"] == {
        "0": {"get pods": 2},
        "1": {"get pods": 1},
        "3": {"get pods": 1},
    }
    assert snapshot["injected"] == [
        {
            "at": 1.5,
            "request": "watch pods",
            "kind": "expire",
            "delay": 2.0,
            "forward_first": False,
            "retry_after": 1,
        }
    ]
    assert rate(snapshot, 0, 2) == 1.5
    assert rate(snapshot, 2, 4) == 0.5


def test_about_half_of_the_resets_reach_the_apiserver_first_and_only_resets_do() -> None:
    resets = decisions(Schedule(2, Rates(reset=1.0)), [POD] * 400)
    forwarded = sum(1 for f in resets if f and f.forward_first)
    assert 150 < forwarded < 250
    throttled = decisions(Schedule(2, Rates(throttle=1.0)), [POD] * 100)
    watch_resets = decisions(Schedule(2, Rates(reset=1.0)), [WATCH] * 100)
    assert not any(f and f.forward_first for f in [*throttled, *watch_resets])
