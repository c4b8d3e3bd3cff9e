"""A job whose children the apiserver or a scheduler will never act on says so, on the
real control plane: TPUSlices refused by a ValidatingAdmissionPolicy (retried until the
policy goes), and worker pods whose ``schedulerName`` no scheduler serves (named after
``SCHEDULER_GRACE_SECONDS``). A job that waits for a spot pool the cluster lacks falls
back to on-demand VMs after the limit it set (``placement.fallbacks``)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from localcluster import Pool
from localcluster.testing import wait_until
from tests.operator.support import job_manifest
from tpu_operator import contract
from tpu_operator.api.conditions import parse
from tpu_operator.state.gang import SCHEDULER_GRACE_SECONDS

pytestmark = pytest.mark.integration


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_refused_slices_and_an_absent_scheduler_are_named_in_the_status(
    tpu, namespace, running_operator
):
    policy = f"deny-slices-{namespace}"[:63]
    manifests = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [contract.GROUP],
                            "apiVersions": ["*"],
                            "operations": ["CREATE"],
                            "resources": [contract.SLICE_PLURAL],
                        }
                    ]
                },
                "matchConditions": [
                    {
                        "name": "frozen-only",
                        "expression": "object.metadata.name.startsWith('frozen-')",
                    }
                ],
                "validations": [
                    {"expression": "false", "message": "TPUSlices are frozen in this namespace"}
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]
    cluster = tpu.cluster
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
    )
    try:
        # The binding takes effect within a second or so: until a dry run is refused.
        wait_until(
            lambda: (
                cluster.kubectl(
                    "apply",
                    "--dry-run=server",
                    "-n",
                    namespace,
                    "-f",
                    "-",
                    input=json.dumps(
                        {
                            "apiVersion": contract.API_VERSION,
                            "kind": contract.SLICE_KIND,
                            "metadata": {"name": "frozen-probe"},
                            "spec": {
                                "type": "v5litepod-4",
                                "template": {
                                    "spec": {"containers": [{"name": "worker", "image": "x"}]}
                                },
                            },
                        }
                    ),
                    check=False,
                ).returncode
                != 0
            ),
            timeout=30,
            message="the admission policy to refuse TPUSlices",
        )
        unscheduled = job_manifest("unscheduled", namespace, {"type": "v5litepod-4"}, "sleep 300")
        unscheduled["spec"]["template"]["spec"]["schedulerName"] = "no-such-scheduler"
        created = time.monotonic()
        tpu.apply(unscheduled)  # its pods wait for a scheduler meanwhile
        tpu.apply(job_manifest("frozen", namespace, {"type": "v5litepod-4"}, "sleep 300"))
        refused = wait_until(
            lambda: (
                (s := tpu.status(namespace, "frozen")).get("attempt") == 1
                and "refuses the job's TPUSlices" in s.get("message", "")
                and s
            ),
            timeout=60,
            message=lambda: (
                f"the job to say its slices are refused: {tpu.status(namespace, 'frozen')}"
            ),
        )
        assert "TPUSlices are frozen in this namespace" in refused["message"]
        assert condition(refused, "PodsScheduled")["reason"] == "SliceCreationFailed"
        tpu.wait_events(namespace, "frozen", "SliceCreationFailed")
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", policy
        )
    # The policy is gone: the job's next try (at most 30 s later) creates its slice.
    tpu.wait_phase(namespace, "frozen", "Running", timeout=90)
    waiting = wait_until(
        lambda: (
            "no scheduler has looked at"
            in (s := tpu.status(namespace, "unscheduled")).get("message", "")
            and s
        ),
        timeout=SCHEDULER_GRACE_SECONDS + 60,
        message=lambda: (
            f"the job to name the scheduler its pods wait for: "
            f"{tpu.status(namespace, 'unscheduled')}"
        ),
    )
    # Not said before the grace (pods' creationTimestamp has second precision: up to 1 s
    # earlier than the moment the test took).
    assert time.monotonic() - created >= SCHEDULER_GRACE_SECONDS - 1
    assert waiting["phase"] == "Starting"
    assert "named 'no-such-scheduler'" in waiting["message"]
    assert condition(waiting, "PodsScheduled")["reason"] == "NoScheduler"
    tpu.wait_events(namespace, "unscheduled", "NoScheduler")


FALLBACK_AFTER = 5


def test_a_job_waiting_for_spot_falls_back_to_on_demand_after_its_limit(
    tpu, namespace, running_operator
):
    """The cluster has an on-demand v4 2x2x2 pool in the job's reservation and no spot
    one: the job waits for spot, then runs on the on-demand pool once it has waited
    FALLBACK_AFTER seconds (the reservation keeps other tests' pools out of its way)."""
    tag = uuid.uuid4().hex[:4]
    reservation = f"fallback-{tag}"
    pool = Pool(
        name=f"od{tag}",
        vms=2,
        accelerator="tpu-v4-podslice",
        topology="2x2x2",
        chips_per_vm=4,
        reservation=reservation,
        mode="simulate",
    )
    agent = tpu.cluster.agent
    agent.add_pool(pool)
    placement = {
        "spot": True,
        "reservation": reservation,
        "fallbacks": [{"afterSeconds": FALLBACK_AFTER, "spot": False, "reservation": reservation}],
    }
    try:
        tpu.apply(
            job_manifest("spot", namespace, {"type": "v4-16"}, "sleep 300", placement=placement)
        )
        waiting = wait_until(
            lambda: (
                f"{pool.name} is on-demand"
                in (s := tpu.status(namespace, "spot")).get("message", "")
                and s
            ),
            timeout=30,
            message=lambda: f"the job waiting for spot: {tpu.status(namespace, 'spot')}",
        )
        assert not waiting.get("nodePools") and "fallback" not in waiting
        began = parse(condition(waiting, "PodsScheduled")["lastTransitionTime"])
        running = tpu.wait_phase(namespace, "spot", "Running", timeout=90)
        assert running["nodePools"] == [pool.name]
        step = running["fallback"]
        assert (step["step"], step["capacity"]) == (1, f"on-demand in reservation {reservation}")
        moved = parse(step["since"])
        assert began is not None and moved is not None
        assert (moved - began).total_seconds() >= FALLBACK_AFTER
        (event,) = [
            e["message"] for e in tpu.events(namespace, "spot") if e["reason"] == "CapacityFallback"
        ]
        assert event.endswith(
            f"falling back to step 1 of placement.fallbacks: on-demand in reservation {reservation}"
        )
        assert f"of spot in reservation {reservation} (step 0)" in event
        (slice_,) = tpu.raw.get(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/"
            f"{contract.SLICE_PLURAL}"
        )["items"]
        assert slice_["spec"]["placement"] == {"spot": False, "reservation": reservation}
        nodes = {p["spec"]["nodeName"] for p in tpu.pods(namespace)}
        assert nodes == {f"{pool.name}-0", f"{pool.name}-1"}
    finally:
        tpu.cluster.kubectl("delete", "tpujobs", "--all", "-n", namespace, "--wait=false")
        wait_until(lambda: not tpu.pods(namespace), timeout=30, message="the job's pods gone")
        agent.remove_pool(pool.name)
