"""The operator's metrics endpoint behind the apiserver's authorization.

The package's operator acts as the chart's ServiceAccount with the chart's RBAC (its
``create`` on TokenReviews and SubjectAccessReviews), and its scraper is a ServiceAccount
the chart binds to ``<release>-metrics-reader``. A scrape without a token, with a made-up
token, or with the token of an account that may not get /metrics is refused; plain HTTP
gets no answer; the reviews behind an accepted scraper are asked once and reused.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.operator.support import OperatorProcess, read_metrics
from tpu_operator.runtime.metrics_server import ALLOWED_TTL, AUTHENTICATED_TTL

pytestmark = pytest.mark.integration


def refused(process: OperatorProcess, token: str | None) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as caught:
        read_metrics(process.metrics_url, token)
    return caught.value.code, caught.value.read().decode()


def reviews(process: OperatorProcess, token: str | None = None) -> dict[tuple[str, str], float]:
    """The reviews the endpoint asked for so far (read with ``token``, default the chart's
    scraper's: the reviews of that very read are counted in it)."""
    found = {}
    for line in process.metrics(token).splitlines():
        if line.startswith("tpu_operator_metrics_auth_reviews_total{"):
            labels, value = line.rsplit(" ", 1)
            pairs = dict(p.split("=", 1) for p in labels[labels.index("{") + 1 : -1].split(","))
            found[(pairs["review"].strip('"'), pairs["result"].strip('"'))] = float(value)
    return found


def account(cluster, identity, name: str, *, reader: bool) -> str:
    """A token of a new ServiceAccount in the release namespace, bound to the chart's
    metrics reader role or not."""
    cluster.kubectl("create", "serviceaccount", name, "-n", identity.namespace)
    if reader:
        cluster.kubectl(
            "create",
            "clusterrolebinding",
            name,
            f"--clusterrole={identity.release}-metrics-reader",
            f"--serviceaccount={identity.namespace}:{name}",
        )
    return cluster.service_account_token(identity.namespace, name)


def test_a_scrape_without_a_token_or_with_a_made_up_one_is_refused(running_operator):
    assert running_operator.metrics_url.startswith("https://")
    code, body = refused(running_operator, None)
    assert code == 401 and "bearer token is required" in body
    assert "tpu_operator_" not in body
    code, body = refused(running_operator, "made.up.token")
    assert code == 401 and "not accepted" in body


def test_a_token_without_the_permission_is_forbidden(cluster, identity, running_operator):
    name = f"no-metrics-{uuid.uuid4().hex[:6]}"
    token = account(cluster, identity, name, reader=False)
    code, body = refused(running_operator, token)
    assert code == 403
    assert f"system:serviceaccount:{identity.namespace}:{name} may not get /metrics" in body
    assert "tpu_operator_" not in body


def test_plain_http_gets_no_metrics(running_operator):
    url = running_operator.metrics_url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=5)


def test_a_reader_is_let_in_and_its_reviews_are_reused(cluster, identity, running_operator):
    assert "tpu_operator_leader" in running_operator.metrics()  # the chart's own reader
    token = account(cluster, identity, f"reader-{uuid.uuid4().hex[:6]}", reader=True)
    before = reviews(running_operator)
    started = time.monotonic()
    for _ in range(4):
        assert "tpu_operator_build_info" in read_metrics(running_operator.metrics_url, token)
    after = reviews(running_operator, token)
    elapsed = time.monotonic() - started

    def asked(key: tuple[str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    # Five scrapes with the new token: one review of each kind, another only if the
    # scrapes outlasted a cached answer.
    assert 1 <= asked(("TokenReview", "authenticated")) <= 1 + elapsed // AUTHENTICATED_TTL
    assert 1 <= asked(("SubjectAccessReview", "allowed")) <= 1 + elapsed // ALLOWED_TTL
    assert asked(("TokenReview", "error")) == asked(("SubjectAccessReview", "error")) == 0
