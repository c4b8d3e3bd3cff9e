"""What a supervised worker pod and its job get (``builders/supervision.py``): the stop
grace and its ceiling, who is refused supervision, the key Secret's name, and the env the
template cannot override."""

from __future__ import annotations

import pytest

from tpu_operator import contract
from tpu_operator import supervision as sv
from tpu_operator.builders.supervision import (
    DEFAULT_STOP_GRACE_SECONDS,
    MAX_STOP_GRACE_SECONDS,
    Supervision,
    key_secret,
    key_secret_name,
    stop_grace,
    supervise_container,
    supervision_refused,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("grace", "expected"),
    [
        (None, DEFAULT_STOP_GRACE_SECONDS),
        (0, 0.0),
        (45, 45.0),
        (10**9, MAX_STOP_GRACE_SECONDS),  # the template's value is unbounded; the stop is not
        (-1, DEFAULT_STOP_GRACE_SECONDS),
        (True, DEFAULT_STOP_GRACE_SECONDS),
        ("30", DEFAULT_STOP_GRACE_SECONDS),
    ],
)
def test_the_stop_grace_follows_the_template_up_to_a_ceiling(grace: object, expected: float):
    spec = {} if grace is None else {"terminationGracePeriodSeconds": grace}
    assert stop_grace(spec) == expected
    assert stop_grace(spec) <= sv.MAX_GRACE_S


def test_pods_the_network_policy_cannot_guard_are_not_supervised():
    host = {"spec": {"hostNetwork": True, "containers": []}}
    plain = {"spec": {"containers": []}}
    guarded = frozenset({"ml"})
    assert supervision_refused(host, "ml", None) is None  # no policy: nothing to refuse
    why = supervision_refused(host, "ml", guarded)
    assert why is not None and "hostNetwork" in why and "NetworkPolicy" in why
    assert supervision_refused(plain, "ml", guarded) is None
    why = supervision_refused(plain, "other", guarded)
    assert why is not None and "namespace other" in why


def test_the_key_secret_is_named_by_the_keys_id_and_immutable():
    key = sv.derive_job_key(b"master", "job-uid")
    name = key_secret_name("train", sv.key_id(key))
    assert name == f"train-control-{sv.key_id(key)}"
    assert "job-uid"[:8] not in name  # nothing anyone could compute from the job alone
    secret = key_secret(name=name, namespace="ns", job_name="train", owner={}, key=key)
    assert secret["immutable"] is True


def test_the_template_cannot_set_the_supervisors_identity():
    container = {
        "name": contract.WORKER_CONTAINER,
        "env": [
            {"name": contract.ENV_CONTROL_KEY_ID, "value": "f" * 32},
            {"name": contract.ENV_POD_UID, "value": "someone-else"},
        ],
    }
    worker = supervise_container(container, Supervision("s", "a" * 32))
    env = [
        e for e in worker["env"] if e["name"] in (contract.ENV_CONTROL_KEY_ID, contract.ENV_POD_UID)
    ]
    assert env == [
        {"name": contract.ENV_CONTROL_KEY_ID, "value": "a" * 32},
        {"name": contract.ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
