"""A slice's ProvisioningRequest (``policies/provisioning_request.py``): what is read, what
the status records, and what is made, withdrawn or moved (after the status is written)."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_operator.placement.capacity import RequestState
from tpu_operator.policies.provisioning_request import (
    POLL_SECONDS,
    RequestFacts,
    RequestPlan,
    decide,
    to_read,
)
from tpu_operator.state.views import PodView

pytestmark = pytest.mark.unit

R0, R1 = "s-a2-r0", "s-a2-r1"


def pod(index: int, node: str | None = None, consumes: str | None = R0, attempt: int = 2):
    return PodView(
        name=f"s-{index}",
        namespace="ml",
        uid=f"u{index}",
        job_name="s",
        slice_name="s",
        slice_index=0,
        worker_index=index,
        attempt=attempt,
        phase="Running" if node else "Pending",
        ready=False,
        deletion_deadline=None,
        node=node,
        pool=None,
        pod_ip=None,
        exit_code=None,
        exit_reason=None,
        disruption=None,
        unschedulable=None,
        created=None,
        started=None,
        finished=None,
        consumes=consumes,
    )


def facts(**fields: Any) -> RequestFacts:
    base: dict[str, Any] = {
        "slice_name": "s",
        "queued": True,
        "kueue_made": False,
        "stopping": False,
        "attempt": 2,
        "recorded": None,
        "recorded_state": "",
        "tries": 0,
        "claim": True,
        "hosts": 2,
        "to_create": True,
        "pods": (),
    }
    return RequestFacts(**{**base, **fields})


PLACED = (pod(0, "n0"), pod(1, "n1"))
Found = tuple[RequestState, str] | None


@pytest.mark.parametrize(
    ("given", "read", "found", "plan"),
    [
        pytest.param(
            facts(),
            R0,
            None,
            RequestPlan(consume=R0, recorded=(R0, 0, "Pending"), make=R0, recheck=POLL_SECONDS),
            id="a claim without its request makes it after the write",
        ),
        pytest.param(
            facts(to_create=False),
            R0,
            None,
            RequestPlan(consume=R0, recorded=(R0, 0, "Pending"), recheck=POLL_SECONDS),
            id="no pod to create or waiting: nothing is made",
        ),
        pytest.param(
            facts(pods=(pod(0, consumes="s-a1-r0"), pod(1, "n1"))),
            R0,
            ("Accepted", "waiting for capacity"),
            RequestPlan(
                consume=R0,
                recorded=(R0, 0, "Accepted: waiting for capacity"),
                move=("s-0",),
                recheck=POLL_SECONDS,
            ),
            id="a waiting pod of another request is moved to this one",
        ),
        pytest.param(
            facts(pods=PLACED, to_create=False),
            R0,
            ("Provisioned", "Provisioned"),
            RequestPlan(consume=R0, recorded=(R0, 0, "Provisioned")),
            id="provisioned and every pod placed: no recheck",
        ),
        pytest.param(
            facts(tries=1),
            R1,
            ("Failed", "no capacity"),
            RequestPlan(
                consume=R1,
                recorded=(R1, 2, "Failed: no capacity"),
                failed=f"ProvisioningRequest {R1}: Failed: no capacity; asking again in 20 s",
                recheck=20.0,
            ),
            id="a failed request ends the try: the next is counted, nothing made",
        ),
        pytest.param(
            facts(tries=10),
            "s-a2-r10",
            ("Revoked", ""),
            RequestPlan(
                consume="s-a2-r10",
                recorded=("s-a2-r10", 11, "Revoked"),
                failed="ProvisioningRequest s-a2-r10: Revoked: ; asking again in 600 s",
                recheck=600.0,
            ),
            id="the backoff stops doubling at its limit",
        ),
        pytest.param(
            facts(pods=PLACED, to_create=False),
            R0,
            ("BookingExpired", "not consumed"),
            RequestPlan(
                consume=R0, recorded=(R0, 0, "BookingExpired: not consumed"), recheck=POLL_SECONDS
            ),
            id="an expiry after every pod was placed ends no try",
        ),
        pytest.param(
            facts(claim=False, recorded=R0, recorded_state="Accepted"),
            R0,
            ("Provisioned", "done"),
            RequestPlan(recorded=(R0, 0, "Provisioned: done")),
            id="on an existing pool the request is only read, for the status",
        ),
        pytest.param(
            facts(claim=False, recorded=R0, recorded_state="Provisioned"),
            None,
            None,
            RequestPlan(),
            id="once it said Provisioned it is read no more",
        ),
        pytest.param(
            facts(queued=False, recorded=R0),
            None,
            None,
            RequestPlan(withdraw=R0),
            id="capacity no longer queued: the request made is withdrawn",
        ),
        pytest.param(
            facts(kueue_made=True, recorded=None),
            None,
            None,
            RequestPlan(),
            id="Kueue made the request: the slice makes none",
        ),
        pytest.param(facts(stopping=True), None, None, RequestPlan(), id="stopping"),
        pytest.param(facts(attempt=0), None, None, RequestPlan(), id="not started"),
    ],
)
def test_the_request_plan(given: RequestFacts, read: str | None, found: Found, plan: RequestPlan):
    assert to_read(given) == read
    assert decide(given, found) == plan
