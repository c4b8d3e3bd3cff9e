"""No spec the apiserver accepts makes the operator raise (issue 11, item 1).

- Property (hypothesis): every pod template the models accept builds a worker pod. The
  builder reads only parts the CRD types, so what `kubectl apply` lets through cannot
  break it; what the models reject is marked Invalid naming the field.
- A template stored before the CRD typed it (a wrong type where the operator reads it)
  fails once with ``InvalidPodTemplate`` and the field, never a retry loop.
- The apiserver refusing pods: a pod it finds invalid fails the job with
  ``InvalidPodTemplate``; one an admission plugin or policy forbids (403, or a
  ValidatingAdmissionPolicy's 422 "is forbidden") keeps the job Pending with
  ``PodsScheduled`` False reason ``PodsForbidden`` and the apiserver's words, one Warning
  event, and the job starts by itself once the pods are allowed.
- Every integer the operator turns into a time is bounded, so no date overflows.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.unit.fakeapi import FakeCluster
from tpu_operator import catalog, contract
from tpu_operator.api.job import TPUJobSpec
from tpu_operator.api.policy import MAX_SECONDS
from tpu_operator.api.slice import TPUSliceSpec
from tpu_operator.api.status import Reason
from tpu_operator.api.template import PodTemplate
from tpu_operator.builders.pods import NodePlacement, Owner, worker_pod
from tpu_operator.builders.wiring import PodWiring
from tpu_operator.policies.plan import MIN_REQUEUE_SECONDS
from tpu_operator.reconcile.context import invalid_spec
from tpu_operator.reconcile.slices import refusal_reason
from tpu_operator.runtime.kube import ApiError

pytestmark = pytest.mark.unit

WIRING = PodWiring(
    job_name="j",
    service="j",
    slice_name="j-0",
    shape=catalog.from_short_type("v5p-16"),
    num_slices=2,
    slice_index=0,
    worker_index=1,
    attempt=1,
)
OWNER = Owner(contract.API_VERSION, contract.SLICE_KIND, "j-0", "uid")

# Arbitrary JSON, with the keys the operator looks for, so that it meets them.
KEYS = [
    "name",
    "value",
    "requests",
    "limits",
    "cpu",
    contract.TPU_RESOURCE,
    "containerPort",
    "key",
    "operator",
    "effect",
    "matchExpressions",
    "nodeSelectorTerms",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, 10**30, -1, 0, 65536]),
    st.floats(allow_nan=False),
    st.text(max_size=6),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), inner, max_size=3),
    ),
    max_leaves=8,
)


def either(shaped: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value of the shape the operator expects, or one time in six any JSON at all (a
    gate drawn from a list: hypothesis favours the last branch of one_of)."""
    return st.sampled_from([True] * 5 + [False]).flatmap(lambda shape: shaped if shape else JSON)


def fields(**parts: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with any subset of ``parts``."""
    return st.fixed_dictionaries({}, optional=parts)


ENV_NAMES = st.sampled_from(
    ["FOO", "TPU_TOPOLOGY", "JAX_COORDINATOR_ADDRESS", contract.ENV_TPU_PROCESS_PORT]
)
ENV = either(
    st.lists(
        st.builds(
            lambda name, rest: {"name": name, **rest},
            either(ENV_NAMES),
            fields(value=either(st.text(max_size=6)), valueFrom=JSON),
        ),
        max_size=3,
    )
)
QUANTITIES = either(st.dictionaries(st.sampled_from([*KEYS[4:6], "memory"]), JSON, max_size=3))
RESOURCES = either(fields(requests=QUANTITIES, limits=QUANTITIES, claims=JSON))
PORT = fields(
    name=either(st.sampled_from(["metrics", "coordinator", "http"])),
    containerPort=either(st.sampled_from([8482, 9431, 80, 65535])),
    protocol=JSON,
)
PORTS = either(st.lists(PORT, max_size=3))
WORKER = st.builds(
    lambda rest: {"name": contract.WORKER_CONTAINER, **rest},
    fields(env=ENV, resources=RESOURCES, ports=PORTS, command=JSON),
)
TERMS = either(st.lists(fields(matchExpressions=either(st.lists(JSON, max_size=2))), max_size=2))
AFFINITY = either(
    fields(
        nodeAffinity=either(
            fields(
                requiredDuringSchedulingIgnoredDuringExecution=either(
                    fields(nodeSelectorTerms=TERMS)
                )
            )
        ),
        podAffinity=JSON,
    )
)
TEMPLATES = st.builds(
    lambda worker, others, spec, metadata: {
        "metadata": metadata,
        "spec": {"containers": [*others, worker], **spec},
    },
    WORKER,
    st.lists(
        st.builds(
            lambda name, rest: {"name": name, **rest},
            st.sampled_from(["sidecar", "worker"]),
            fields(env=ENV, ports=PORTS, resources=JSON),
        ),
        max_size=2,
    ),
    fields(
        nodeSelector=either(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
        tolerations=either(st.lists(fields(key=JSON, operator=JSON, effect=JSON), max_size=2)),
        affinity=AFFINITY,
        hostNetwork=either(st.booleans()),
        initContainers=JSON,
        volumes=JSON,
    ),
    either(fields(labels=either(st.just({"a": "b"})), annotations=either(st.just({"n": "ü"})))),
)


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(template=TEMPLATES, spot=st.sampled_from([None, True, False]))
def test_every_template_the_models_accept_builds_a_pod(template: Any, spot: bool | None) -> None:
    try:
        PodTemplate.model_validate(template)
    except ValidationError as exc:
        event("rejected by the models")
        _reason, message = invalid_spec(exc)
        assert message.startswith("invalid spec: spec.")
        return
    event("accepted by the models")
    pod = worker_pod(
        namespace="ml",
        wiring=WIRING,
        template=template,
        owner=OWNER,
        placement=NodePlacement(spot=spot),
    )
    json.dumps(pod)  # a body the client can send
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    assert worker["resources"]["limits"][contract.TPU_RESOURCE] == "4"


@pytest.mark.parametrize(
    ("part", "value", "field", "expected"),
    [
        ("resources", "1", "containers[0].resources", "must be an object, not a string"),
        ("resources", {"requests": "1"}, "resources.requests", "must be an object, not a string"),
        ("resources", {"limits": [1]}, "resources.limits", "must be an object, not a list"),
        ("resources", {"limits": {"cpu": True}}, "limits.cpu", "must be a quantity"),
        ("resources", {"limits": {"cpu": [1]}}, "limits.cpu", "must be a quantity"),
        ("env", "FOO=1", "containers[0].env", "must be a list, not a string"),
        ("ports", [{"containerPort": "x"}], "ports[0].containerPort", "must be an integer"),
        ("ports", [{"containerPort": 70000}], "ports[0].containerPort", "less than or equal"),
        ("ports", ["8080"], "containers[0].ports[0]", "must be an object, not a string"),
    ],
)
def test_a_wrong_type_in_the_template_names_the_field(part, value, field, expected):
    template = {"spec": {"containers": [{"name": "worker", part: value}]}}
    with pytest.raises(ValidationError) as raised:
        TPUJobSpec.model_validate({"slice": {"type": "v5p-16"}, "template": template})
    reason, message = invalid_spec(raised.value)
    assert reason == Reason.INVALID_POD_TEMPLATE
    assert f"spec.template.spec.{field}" in message or field in message, message
    assert expected in message


@pytest.mark.parametrize(
    ("spec_part", "value"),
    [
        ("nodeSelector", {"disk": 5}),
        ("nodeSelector", "ssd"),
        ("tolerations", "x"),
        ("tolerations", ["x"]),
        ("affinity", "x"),
        ("affinity", {"nodeAffinity": "x"}),
        ("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}),
        (
            "affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": "x"}]
                    }
                }
            },
        ),
        ("hostNetwork", [True]),
    ],
)
def test_the_parts_of_the_pod_spec_the_operator_reads_are_typed(spec_part, value):
    template = {"spec": {"containers": [{"name": "worker"}], spec_part: value}}
    with pytest.raises(ValidationError) as raised:
        PodTemplate.model_validate(template)
    _reason, message = invalid_spec(raised.value)
    assert f"spec.spec.{spec_part}" in message  # relative to the template here


def test_a_spec_error_outside_the_template_is_invalid_spec():
    with pytest.raises(ValidationError) as raised:
        TPUJobSpec.model_validate(
            {"slice": {"type": "v5p-16"}, "numSlices": "two", "template": {"spec": {}}}
        )
    reason, message = invalid_spec(raised.value)
    assert reason == Reason.INVALID_SPEC
    assert "spec.numSlices: must be an integer, not a string" in message


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (403, 'pods "p" is forbidden: error looking up service account ml/sa', "PodsForbidden"),
        (403, 'pods "p" is forbidden: exceeded quota: compute', "PodsForbidden"),
        (
            422,
            "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'deny' with binding 'deny' "
            "denied request: no hostNetwork",
            "PodsForbidden",
        ),
        (422, 'Pod "p" is invalid: spec.containers[0].image: Required value', "InvalidPodTemplate"),
        (400, "json: cannot unmarshal number into Go struct field", "InvalidPodTemplate"),
        (500, 'Internal error occurred: failed calling webhook "x"', "PodCreationFailed"),
        (429, "too many requests", "PodCreationFailed"),
    ],
)
def test_what_a_refused_pod_means(status, message, reason):
    error = ApiError("POST", "/api/v1/namespaces/ml/pods", status, "", message)
    assert refusal_reason(error) == reason


# Durations: every bounded integer still gives a date.


def test_the_longest_deadline_and_ttl_are_reconciled():
    base = {"slice": {"type": "v5p-16"}, "template": {"spec": {"containers": [{"name": "w"}]}}}
    for field in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        with pytest.raises(ValidationError):
            TPUJobSpec.model_validate({**base, field: MAX_SECONDS + 1})
    cluster = FakeCluster()
    cluster.apply_job(
        "j",
        job_spec() | {"activeDeadlineSeconds": MAX_SECONDS, "ttlSecondsAfterFinished": MAX_SECONDS},
    )
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    for pod in cluster.pods("j"):
        cluster.exit_pod(pod, 0)
    cluster.settle()
    assert cluster.job("j")["status"]["phase"] == "Succeeded"
    assert cluster.reconcile_job("j") == pytest.approx(MAX_SECONDS, rel=1e-3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sliceIndex", 1024),
        ("numSlices", 1025),
        ("attempt", 2**31),
        ("service", "Bad!"),
        ("jobName", "x" * 64),
        ("nodePool", "not a label"),
    ],
)
def test_slice_fields_the_operator_uses_are_bounded(field, value):
    spec = {"type": "v5p-16", "template": {"spec": {"containers": [{"name": "worker"}]}}}
    with pytest.raises(ValidationError):
        TPUSliceSpec.model_validate({**spec, field: value})


# Reconcilers: a template stored before the CRD typed it; pods the apiserver refuses.


class RefusingCluster(FakeCluster):
    """The fake apiserver, refusing worker pods with ``refusal`` while it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.refusal: ApiError | None = None

    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        if self.refusal is not None and path.endswith("/pods"):
            raise self.refusal
        return await super().create(path, body)


def job_spec(**template_spec: Any) -> dict[str, Any]:
    container = {"name": "worker", "image": "w", **template_spec.pop("worker", {})}
    return {
        "slice": {"type": "v5litepod-4"},
        "template": {"spec": {"containers": [container], **template_spec}},
    }


def conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["status"]["conditions"]}


def test_a_template_of_the_wrong_shape_fails_once_naming_the_field():
    cluster = FakeCluster()
    cluster.apply_job("j", job_spec(worker={"resources": {"requests": "1"}}))
    for _ in range(3):
        cluster.reconcile_job("j")
    status = cluster.job("j")["status"]
    assert status["phase"] == "Failed"
    assert (
        "spec.template.spec.containers[0].resources.requests: must be an object"
        in (status["message"])
    )
    assert conditions(cluster.job("j"))["Invalid"]["reason"] == "InvalidPodTemplate"
    assert cluster.status_writes() == (1, 0)
    assert cluster.recorded.reasons("j") == ["Invalid"]


def test_forbidden_pods_say_why_and_start_once_allowed():
    cluster = RefusingCluster()
    why = 'pods "j-0-0" is forbidden: error looking up service account ml/sa: not found'
    cluster.refusal = ApiError("POST", "/pods", 403, "Forbidden", why)
    cluster.apply_job("j", job_spec(serviceAccountName="sa"))
    cluster.settle()
    job = cluster.job("j")
    assert job["status"]["phase"] == "Pending"
    assert why in job["status"]["message"]
    scheduled = conditions(job)["PodsScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "PodsForbidden")
    assert why in scheduled["message"]
    ready = conditions(cluster.slice("j-0"))["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "PodsForbidden")
    assert cluster.recorded.reasons("j").count("PodsForbidden") == 1
    assert cluster.recorded.reasons("j-0", contract.SLICE_KIND).count("PodsForbidden") == 1
    # retried later, without a traceback, and the job does not fail
    assert cluster.reconcile_slice("j-0") == pytest.approx(30.0)
    cluster.settle()
    assert cluster.recorded.reasons("j").count("PodsForbidden") == 1
    # the ServiceAccount is created: the next retry creates the pods
    cluster.refusal = None
    cluster.reconcile_slice("j-0")
    cluster.settle()
    cluster.run_pods("j")
    cluster.settle()
    job = cluster.job("j")
    assert job["status"]["phase"] == "Running"
    assert conditions(job)["PodsScheduled"]["status"] == "True"


def test_pods_allowed_and_done_before_the_job_looks_clear_the_refusal():
    cluster = RefusingCluster()
    why = 'pods "j-0-0" is forbidden: no PriorityClass with name late was found'
    cluster.refusal = ApiError("POST", "/pods", 403, "Forbidden", why)
    cluster.apply_job("j", job_spec(priorityClassName="late"))
    cluster.settle()
    cluster.refusal = None
    cluster.reconcile_slice("j-0")  # creates the pod, which runs and exits at once
    cluster.run_pods("j")
    for pod in cluster.pods("j"):
        cluster.exit_pod(pod, 0)
    cluster.settle()
    job = cluster.job("j")
    assert job["status"]["phase"] == "Succeeded"
    scheduled = conditions(job)["PodsScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("True", "Scheduled")


def test_pods_that_exist_clear_the_refusal_even_if_the_slice_status_trails():
    """The job can see its pods run to the end before the slice's status write that
    follows their creation: pods that exist were not refused, whatever it still says."""
    cluster = RefusingCluster()
    why = 'pods "j-0-0" is forbidden: error looking up service account ml/late-sa'
    cluster.refusal = ApiError("POST", "/pods", 403, "Forbidden", why)
    cluster.apply_job("j", job_spec(serviceAccountName="late-sa"))
    cluster.settle()
    refused = copy.deepcopy(cluster.slice("j-0")["status"])
    cluster.refusal = None
    cluster.reconcile_slice("j-0")
    cluster.slice("j-0")["status"] = refused  # the slice's next status not yet seen
    cluster.run_pods("j")
    for pod in cluster.pods("j"):
        cluster.exit_pod(pod, 0)
    cluster.reconcile_job("j")
    job = cluster.job("j")
    assert job["status"]["phase"] == "Succeeded"
    scheduled = conditions(job)["PodsScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("True", "Scheduled")


def test_an_admission_policy_denial_is_forbidden_not_an_invalid_template():
    cluster = RefusingCluster()
    why = (
        "pods \"j-0-0\" is forbidden: ValidatingAdmissionPolicy 'no-host-network' with "
        "binding 'b' denied request: hostNetwork is not allowed"
    )
    cluster.refusal = ApiError("POST", "/pods", 422, "Invalid", why)
    cluster.apply_job("j", job_spec(hostNetwork=True))
    cluster.settle()
    status = cluster.job("j")["status"]
    assert status["phase"] == "Pending" and why in status["message"]


def test_a_pod_the_apiserver_finds_invalid_fails_the_job_once():
    cluster = RefusingCluster()
    why = 'Pod "j-0-0" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value'
    cluster.refusal = ApiError("POST", "/pods", 422, "Invalid", why)
    cluster.apply_job("j", job_spec(worker={"resources": {"requests": {"cpu": "abc"}}}))
    cluster.settle()
    job = cluster.job("j")
    assert job["status"]["phase"] == "Failed"
    assert conditions(job)["Failed"]["reason"] == "InvalidPodTemplate"
    assert why in job["status"]["message"]
    assert cluster.recorded.reasons("j").count("Failed") == 1


def slice_spec(**template_spec: Any) -> dict[str, Any]:
    """A standalone TPUSlice: the shape fields at the top of its spec."""
    spec = job_spec(**template_spec)
    return {**spec.pop("slice"), **spec}


def test_a_standalone_slices_forbidden_pods_are_said_by_its_next_status_and_retried():
    cluster = RefusingCluster()
    why = 'pods "s-0" is forbidden: error looking up service account ml/sa: not found'
    cluster.refusal = ApiError("POST", "/pods", 403, "Forbidden", why)
    cluster.apply_slice("s", slice_spec(serviceAccountName="sa"))
    # the status is written first; the refusal it meets asks for the next status at once
    assert cluster.reconcile_slice("s") == pytest.approx(MIN_REQUEUE_SECONDS)
    assert cluster.slice("s")["status"]["message"] == "creating pods"
    assert cluster.reconcile_slice("s") == pytest.approx(30.0)
    status = cluster.slice("s")["status"]
    assert status["phase"] == "Pending" and why in status["message"]
    ready = conditions(cluster.slice("s"))["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "PodsForbidden")
    cluster.settle()
    assert cluster.recorded.reasons("s", contract.SLICE_KIND).count("PodsForbidden") == 1
    cluster.refusal = None
    cluster.reconcile_slice("s")
    cluster.run_pods("s")
    cluster.settle()
    assert cluster.slice("s")["status"]["phase"] == "Running"


def test_a_pod_the_apiserver_finds_invalid_fails_a_standalone_slice_once():
    cluster = RefusingCluster()
    why = 'Pod "s-0" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value'
    cluster.refusal = ApiError("POST", "/pods", 422, "Invalid", why)
    cluster.apply_slice("s", slice_spec(worker={"resources": {"requests": {"cpu": "abc"}}}))
    cluster.settle()
    status = cluster.slice("s")["status"]
    assert status["phase"] == "Failed" and why in status["message"]
    assert status["failure"]["reason"] == "InvalidPodTemplate"
    assert status["failure"]["counted"] is False
    assert status.get("restarts", 0) == 0
    assert cluster.recorded.reasons("s", contract.SLICE_KIND).count("Failed") == 1
