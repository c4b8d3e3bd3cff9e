"""The product path end to end on real parts.

helm chart -> operator (in the cluster, as the chart's ServiceAccount, run from its image by
podman) -> TPUJob -> TPUSlices -> pods run by the node agent -> real JAX
workers rendezvous and train -> a real Prometheus scrapes operator and workers through
the chart's monitors -> every dashboard query and alert returns what it claims.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import images
from localcluster.helm import CHART, values_file
from localcluster.pools import Pool
from localcluster.prometheus import Prometheus
from localcluster.testing import wait_until
from tests.e2e.conftest import RELEASE, RELEASE_NAMESPACE, ReleaseHelm
from tests.operator.support import Api, job_manifest, read_metrics
from tpu_operator import contract, dashboards

pytestmark = pytest.mark.e2e
EXAMPLES = CHART.parents[1] / "examples"
SERVICE_ACCOUNT = f"system:serviceaccount:{RELEASE_NAMESPACE}:{RELEASE}"


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def release(cluster, helm: ReleaseHelm, monitoring_crds, release_values):
    """The chart installed; the operator Deployment's pod running in the cluster."""
    helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--values",
        values_file(release_values),
        "--wait",
        "--timeout",
        "180s",
    )
    yield RELEASE
    helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", check=False)


@pytest.fixture
def tpu(cluster) -> Api:
    return Api(cluster)


def operator_pods(cluster) -> list[dict[str, Any]]:
    """The operator's running pods (the chart runs two: a leader and a standby)."""
    pods = json.loads(
        cluster.kubectl(
            "get",
            "pods",
            "-n",
            RELEASE_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=tpu-operator",
            "-o",
            "json",
        ).stdout
    )["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def lease_holder(cluster) -> str:
    """The pod whose operator holds the leader election Lease (identity: pod name_suffix)."""
    lease = json.loads(
        cluster.kubectl("get", "lease", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout
    )
    return (lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]


def test_chart_renders_the_install_it_documents(helm):
    """What the chart renders for the settings the docs name. Lint, strict schema
    validation, the server dry-run and promtool for every values combination are the chart
    tier's (tests/chart)."""
    everything = {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboards": {"enabled": True},
    }
    namespaced = {"watchNamespaces": ["team-a", "team-b"]}
    bad = helm(
        "lint",
        str(CHART),
        "--values",
        values_file({"prometheusRule": {"goodputBelow": 2}}),
        check=False,
    )
    assert bad.returncode != 0 and "goodputBelow" in bad.stdout + bad.stderr

    documents = helm.template(everything)
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--leader-elect" in container["args"]
    assert f"--leader-elect-namespace={RELEASE_NAMESPACE}" in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    budget = next(d for d in documents if d["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    lease_rules = next(
        d for d in documents if d["kind"] == "Role" and d["metadata"]["name"].endswith("-election")
    )
    assert lease_rules["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert {v for r in lease_rules["rules"] for v in r["verbs"]} == {"get", "create", "update"}
    single = helm.template({"replicas": 1, "leaderElection": {"enabled": False}})
    assert next(d for d in single if d["kind"] == "Deployment")["spec"]["strategy"] == {
        "type": "Recreate"
    }
    assert not {"PodDisruptionBudget", "Role"} & {d["kind"] for d in single}
    racing = helm(
        "template",
        str(CHART),
        "--values",
        values_file({"leaderElection": {"enabled": False}}),
        check=False,
    )
    assert racing.returncode != 0 and "needs leaderElection.enabled" in racing.stderr
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"]
    kinds = {d["kind"] for d in documents}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    configmaps = [d for d in documents if d["kind"] == "ConfigMap"]
    assert all(c["metadata"]["labels"]["grafana_dashboard"] == "1" for c in configmaps)
    shipped = {name: json.loads(body) for c in configmaps for name, body in c["data"].items()}
    assert shipped == dashboards.dashboards()

    rules = next(d for d in documents if d["kind"] == "PrometheusRule")
    assert len([r for g in rules["spec"]["groups"] for r in g["rules"]]) == 5

    roles = [d for d in helm.template(namespaced) if d["kind"] in ("Role", "ClusterRole")]
    assert sorted((d["kind"], d["metadata"].get("namespace", "")) for d in roles) == [
        *[("ClusterRole", "")] * 5,  # nodes; metrics auth and reader; users' edit and view
        ("Role", "team-a"),
        ("Role", "team-b"),
        ("Role", RELEASE_NAMESPACE),  # the leader election Lease
    ]


def test_the_operator_runs_in_the_cluster_as_its_service_account(cluster, release):
    pods = operator_pods(cluster)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == RELEASE
        log = cluster.pod_log(RELEASE_NAMESPACE, pod["metadata"]["name"], "operator")
        wait_until(
            lambda log=log: "tpu-operator started" in log.read_text(),
            timeout=60,
            message="the operator's start-up line",
        )
    # One of them leads (it holds the Lease, which its RBAC lets it renew).
    leader = wait_until(lambda: lease_holder(cluster), timeout=60, message="a Lease holder")
    assert leader in {p["metadata"]["name"] for p in pods}


def test_the_operator_runs_from_its_image_as_its_non_root_user(cluster, release, operator_image):
    # Each operator pod's container is podman running the operator image's filesystem
    # (tests/e2e/conftest.py, docs/contributing/images.md), its process the image's user.
    pods = {p["metadata"]["name"] for p in operator_pods(cluster)}
    label = f"{images.LABEL_CLUSTER}={cluster.directory}"
    listed = json.loads(images.podman("ps", "--format=json", f"--filter=label={label}").stdout)
    containers = {c["Names"][0]: c["Id"] for c in listed}
    assert set(containers) == {f"operator-{pod}" for pod in pods}
    for container_id in containers.values():
        (inspected,) = json.loads(images.podman("container", "inspect", container_id).stdout)
        assert inspected["Rootfs"] == str(operator_image.rootfs)
        status = Path(f"/proc/{inspected['State']['Pid']}/status").read_text()
        uids = re.search(r"^Uid:\s+(.*)$", status, re.M)
        assert uids and set(uids.group(1).split()) == {"65532"}, status


CAN = [
    ("list", "tpujobs.tpu-operator.dev", "--all-namespaces"),
    ("patch", "tpujobs.tpu-operator.dev", "-n=default --subresource=status"),
    ("delete", "tpujobs.tpu-operator.dev", "-n=default"),
    ("create", "tpuslices.tpu-operator.dev", "-n=default"),
    ("create", "pods", "-n=default"),
    ("patch", "pods", "-n=default"),
    ("delete", "pods", "-n=default"),
    ("create", "secrets", "-n=default"),
    ("create", "services", "-n=default"),
    ("get", "services", "-n=default"),
    ("list", "services", "--all-namespaces"),
    ("create", "events", "-n=default"),
    ("watch", "nodes", ""),
    ("get", f"leases.coordination.k8s.io/{RELEASE}", f"-n={RELEASE_NAMESPACE}"),
    ("update", f"leases.coordination.k8s.io/{RELEASE}", f"-n={RELEASE_NAMESPACE}"),
    ("create", "leases.coordination.k8s.io", f"-n={RELEASE_NAMESPACE}"),
    ("create", "tokenreviews.authentication.k8s.io", ""),
    ("create", "subjectaccessreviews.authorization.k8s.io", ""),
]
CANNOT = [
    ("deletecollection", "pods", "-n=default"),  # pods are deleted one by one, by UID
    ("get", "secrets", "--all-namespaces"),
    ("list", "secrets", "-n=kube-system"),
    ("update", "secrets", "-n=default"),
    ("delete", "secrets", "-n=default"),
    ("get", "configmaps", "-n=default"),
    ("create", "tpujobs.tpu-operator.dev", "-n=default"),
    ("update", "tpujobs.tpu-operator.dev", "-n=default"),
    ("delete", "services", "-n=default"),
    ("patch", "nodes", ""),
    ("delete", "nodes", ""),
    ("create", "clusterrolebindings", ""),
    ("create", "pods", "-n=default --subresource=exec"),
    ("patch", "deployments", f"-n={RELEASE_NAMESPACE}"),
    ("delete", "namespaces", ""),
    ("update", "leases.coordination.k8s.io/other", f"-n={RELEASE_NAMESPACE}"),
    ("create", "leases.coordination.k8s.io", "-n=kube-system"),
    ("delete", f"leases.coordination.k8s.io/{RELEASE}", f"-n={RELEASE_NAMESPACE}"),
    ("create", "serviceaccounts", f"-n={RELEASE_NAMESPACE} --subresource=token"),
    ("get", "/metrics", ""),  # its own metrics are for scrapers, not for the operator
]


@pytest.mark.parametrize(
    ("verb", "resource", "scope"),
    CAN + CANNOT,
    ids=[f"{'can' if c in CAN else 'cannot'} {c[0]} {c[1]} {c[2]}" for c in CAN + CANNOT],
)
def test_rbac_is_sufficient_and_not_excessive(cluster, release, verb, resource, scope):
    args = ["auth", "can-i", verb, resource, f"--as={SERVICE_ACCOUNT}"]
    answer = cluster.kubectl(*args, *scope.split(), check=False).stdout.strip()
    assert answer == ("yes" if (verb, resource, scope) in CAN else "no")


def demo_manifest(namespace: str) -> dict[str, Any]:
    manifest = load(EXAMPLES / "local-demo.yaml")
    manifest["metadata"]["namespace"] = namespace
    return manifest


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) for every query of every panel."""
    found = []
    for name, board in dashboards.dashboards().items():
        for panel in board["panels"]:
            for target in panel["targets"]:
                found.append((name, panel["title"], target["expr"]))
    return found


def concrete(expr: str, namespace: str, job: str) -> str:
    return (
        expr.replace("$namespace", namespace)
        .replace("$tpujob", job)
        .replace("$slice", ".*")
        .replace("$worker", ".*")
        .replace("$__rate_interval", "30s")
        .replace("$__range", "15m")
    )


def sane(title: str, values: list[float]) -> bool:
    """Finite, non-negative, and fractions at most 1 (plus rate() extrapolation: a rate over
    a 30 s window overshoots by up to the longest gap between two scrapes over the window:
    2 s / 30 s on time, but scrapes run late on two cores shared with a cluster and 4 JAX
    workers, and one CI run saw 1.107). A fraction counted twice would still be far above
    the bound. The phase counters advance while a phase runs (``tpu_worker.metrics.
    PhaseSeconds``); when they moved a whole step at a time at its end, the phase panel
    read 1.49."""
    if not values or not all(math.isfinite(v) for v in values):
        return False
    if "MFU" in title or "Goodput" in title or "fraction" in title:
        return all(0 <= v <= 1.2 for v in values)
    return all(v >= 0 for v in values)


def test_demo_trains_through_a_worker_failure_and_is_observable(
    cluster, release, prometheus: Prometheus, namespace, tpu: Api
):
    manifest = demo_manifest(namespace)
    (worker,) = manifest["spec"]["template"]["spec"]["containers"]
    # Long enough that attempt 2 trains for more than a rate window before it ends (the
    # dashboard check below waits for that).
    worker["args"] = ["--steps=800" if a.startswith("--steps=") else a for a in worker["args"]]
    tpu.apply(manifest)
    wait_until(
        lambda: ((tpu.status(namespace, "demo").get("progress") or {}).get("step") or 0) >= 70,
        timeout=300,
        message="the demo to pass step 70 (checkpoint at 50)",
    )
    first = tpu.status(namespace, "demo")
    assert first["attempt"] == 1 and first["phase"] == "Running"
    assert sorted(first["nodePools"]) == ["v5p-a", "v5p-b"]

    # A worker dies: the whole gang restarts and resumes from the last checkpoint.
    cluster.agent.kill_pod(namespace, "demo-1-1", exit_code=1)
    restarted = wait_until(
        lambda: (
            (s := tpu.status(namespace, "demo")).get("attempt") == 2
            and s.get("phase") == "Running"
            and s
        ),
        timeout=240,
        message="attempt 2 of the demo to run",
    )
    assert restarted["restarts"] == 1 and restarted["restartsByReason"] == {"Failed": 1}
    assert restarted["lastFailure"]["pod"] == "demo-1-1"
    assert restarted["lastFailure"]["exitCode"] == 1
    selector = f'namespace="{namespace}", tpujob="demo"'

    def of_attempt_2(series: str, offset: str = "") -> str:
        """``series`` of the processes that run attempt 2: a pod restarted in place keeps
        the `attempt` label of the attempt it was created for, and the process's own
        build info says which it runs (`exported_attempt`: the scrape adds `attempt`)."""
        runs = f'tpu_worker_build_info{{{selector}, exported_attempt="2"}}{offset}'
        return f"(({series}) and on (pod) {runs})"

    prometheus.wait_for(
        f"tpu_operator_job_restarts{{{selector}}} == 1", 60, "the restart in the operator's metrics"
    )
    prometheus.wait_for(
        of_attempt_2(f"tpu_worker_steps_total{{{selector}}} > 0"),
        180,
        "attempt 2 steps in the workers' metrics",
    )
    log = cluster.pod_log(namespace, "demo-0-0", "worker")
    found = wait_until(
        lambda: re.search(r"resumed from checkpoint at step (\d+)", log.read_text()),
        timeout=120,
        message="attempt 2 to resume from a checkpoint",
    )
    checkpoint = int(found.group(1))
    assert checkpoint >= 50 and checkpoint % 50 == 0  # --checkpoint-every=50
    resumed = prometheus.query(
        "max("
        + of_attempt_2(
            f"(tpu_worker_step{{{selector}}} - tpu_worker_steps_total{{{selector}}})"
            f" and on (pod) (tpu_worker_steps_total{{{selector}}} > 0)"
        )
        + ")"
    )
    assert resumed and float(resumed[0]["value"][1]) == checkpoint, resumed

    # Every worker is a target, labelled as the PodMonitor relabels it.
    targets = [t for t in prometheus.targets() if t["labels"].get("tpujob") == "demo"]
    up = {(t["labels"]["slice"], t["labels"]["worker"]) for t in targets if t["health"] == "up"}
    assert up == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}

    # Every dashboard query answers, with sane values, while the job trains. A worker's
    # first steps book their compile time at once, when JAX reports it (it knows the span
    # only at its end): a 30 s window that holds that jump reads compilation above wall
    # time when it took longer than the window. So the queries run once every worker of
    # attempt 2 was past its first steps a window ago, and while they all still step.
    wait_until(
        lambda: prometheus.query(
            "count("
            + of_attempt_2(f"tpu_worker_steps_total{{{selector}}} offset 35s > 2", " offset 35s")
            + ") == 4"
        ),
        timeout=180,
        message="every worker of attempt 2 past its first steps for longer than a rate window",
    )
    wait_until(
        lambda: prometheus.query(
            "count("
            + of_attempt_2(f"rate(tpu_worker_steps_total{{{selector}}}[30s]) > 0")
            + ") == 4"
        ),
        timeout=60,
        message="every worker of attempt 2 stepping in two scrapes",
    )
    failures = []
    for board, title, expr in dashboard_queries():
        query = concrete(expr, namespace, "demo")
        result = prometheus.query(query)
        values = [float(r["value"][1]) for r in result]
        if not sane(title, values):
            failures.append(f"{board} / {title}: {query} -> {values}")
    assert not failures, "\n".join(failures)

    done = tpu.wait_phase(namespace, "demo", "Succeeded", timeout=600)
    assert done["attempt"] == 2 and done["progress"]["step"] >= 390
    goodput = done["goodput"]
    assert 0 < goodput["fraction"] < 1
    assert goodput["badputSeconds"]["restartDowntime"] > 0


def test_stall_alert_fires_for_a_hung_job(
    cluster, release, prometheus: Prometheus, namespace, tpu: Api
):
    command = "tpu-worker demo --steps=100000 --hang-at-step=8 --watchdog-floor=900"
    manifest = job_manifest(
        "hung",
        namespace,
        {"type": "v5litepod-8", "chipsPerHost": 4},
        command,
        monitoring={"sampleInterval": "2s", "stallTimeout": "10s", "stallAction": "None"},
    )
    tpu.apply(manifest)
    alert = prometheus.wait_for(
        f'ALERTS{{alertname="TPUJobStalled", alertstate="firing", namespace="{namespace}",'
        ' tpujob="hung"}',
        240,
        "the TPUJobStalled alert to fire",
    )
    assert alert[0]["metric"]["severity"] == "critical"
    stalled = wait_until(
        lambda: next(
            (
                c
                for c in tpu.status(namespace, "hung").get("conditions", [])
                if c["type"] == "Stalled" and c["status"] == "True"
            ),
            None,
        ),
        timeout=60,
        message="the Stalled condition",
    )
    assert "no training step" in stalled["message"]
    assert tpu.status(namespace, "hung")["restarts"] == 0  # stallAction None: no restart


def test_every_example_is_accepted_placed_and_wired(cluster, release, namespace, tpu: Api):
    pools = [
        Pool(name="ex-v5p-a", vms=32, accelerator="tpu-v5p-slice", topology="4x4x8"),
        Pool(name="ex-v5p-b", vms=32, accelerator="tpu-v5p-slice", topology="4x4x8"),
        Pool(name="ex-v6e", vms=4, accelerator="tpu-v6e-slice", topology="4x4"),
        Pool(name="ex-v6e-b", vms=4, accelerator="tpu-v6e-slice", topology="4x4"),
    ]
    for pool in pools:
        cluster.agent.add_pool(pool)
    try:
        # The ServiceAccount the pods of the Cloud Storage examples run as.
        [account] = [
            d
            for d in yaml.safe_load_all((EXAMPLES / "checkpoints-gcsfuse.yaml").read_text())
            if d["kind"] == "ServiceAccount"
        ]
        account["metadata"]["namespace"] = namespace
        cluster.kubectl("apply", "-f", "-", input=json.dumps(account))
        expected = {
            "v5e-single-slice.yaml": ("TPUJob", "v5e-train", 4),
            "v5p-multislice.yaml": ("TPUJob", "v5p-multislice", 64),
            "tpuslice-standalone.yaml": ("TPUSlice", "v6e-interactive", 4),
            "v6e-jax.yaml": ("TPUJob", "v6e-jax", 4),
        }
        for file, (kind, name, workers) in expected.items():
            manifest = load(EXAMPLES / file)
            manifest["metadata"]["namespace"] = namespace
            # Placement and wiring only: the pods are simulated instead of run.
            template = manifest["spec"]["template"]
            template.setdefault("metadata", {}).setdefault("annotations", {})[
                "localcluster.tpu-operator.dev/simulate"
            ] = "true"
            tpu.apply(manifest)
            selector = (
                f"{contract.LABEL_JOB_NAME}={name}"
                if kind == "TPUJob"
                else f"{contract.LABEL_SLICE_NAME}={name}"
            )
            wait_until(
                lambda sel=selector, n=workers: (
                    len(
                        [
                            p
                            for p in tpu.pods(namespace, sel)
                            if p["status"].get("phase") == "Running"
                        ]
                    )
                    == n
                ),
                timeout=120,
                message=f"the {workers} workers of {file} to run",
            )
        multislice = tpu.status(namespace, "v5p-multislice")
        assert sorted(multislice["nodePools"]) == ["ex-v5p-a", "ex-v5p-b"]
        assert multislice["phase"] == "Running" and multislice["ready"] == "64/64"
        slice_labels = [
            s["metadata"]["labels"]
            for s in tpu.slices(namespace)
            if s["metadata"]["name"].startswith("v5p-multislice")
        ]
        assert all(labels[contract.LABEL_KUEUE_QUEUE] == "tpu" for labels in slice_labels)
        assert tpu.status(namespace, "v5e-train")["nodePools"] == ["v5e-4x4"]
        interactive = next(
            s for s in tpu.slices(namespace) if s["metadata"]["name"] == "v6e-interactive"
        )
        v6e_pools = {
            interactive["status"]["nodePool"],
            *tpu.status(namespace, "v6e-jax")["nodePools"],
        }
        assert v6e_pools == {"ex-v6e", "ex-v6e-b"}  # a v6e-16 pool each
        local = demo_manifest(namespace)
        result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(local))
        assert "created (server dry run)" in result.stdout
    finally:
        cluster.kubectl(
            "delete", "tpujobs,tpuslices", "--all", "-n", namespace, "--wait=true", timeout=180
        )
        for pool in pools:
            cluster.agent.remove_pool(pool.name)


def test_helm_upgrade_rolls_the_operator_and_keeps_reconciling(
    cluster, helm: ReleaseHelm, release, release_values, namespace, tpu: Api
):
    # A job that runs across the upgrade: its Service, Secret and pods exist before the
    # new operator pods start, so they must take it over with the chart's RBAC as it is
    # (learn of its Service by listing, not by creating it again and reading it back).
    tpu.apply(job_manifest("across", namespace, {"type": "v5litepod-4"}, "sleep 600"))
    tpu.wait_phase(namespace, "across", "Running", timeout=120)
    before = {p["metadata"]["uid"] for p in operator_pods(cluster)}
    upgraded = {**release_values, "operator": {**release_values["operator"], "apiConcurrency": 16}}
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--values",
        values_file(upgraded),
        "--wait",
        "--timeout",
        "180s",
    )
    pods = wait_until(
        lambda: (
            len(ps := operator_pods(cluster)) == 2
            and not {p["metadata"]["uid"] for p in ps} & before
            and ps
        ),
        timeout=120,
        message="the two upgraded operator pods",
    )
    assert all("--api-concurrency=16" in p["spec"]["containers"][0]["args"] for p in pods)
    # The Lease passed to an upgraded pod (the old leader released it when it stopped).
    wait_until(
        lambda: lease_holder(cluster) in {p["metadata"]["name"] for p in pods},
        timeout=60,
        message="an upgraded pod to hold the Lease",
    )
    tpu.apply(job_manifest("after-upgrade", namespace, {"type": "v5litepod-4"}, "true"))
    tpu.wait_phase(namespace, "after-upgrade", "Succeeded", timeout=120)

    # The job from before the upgrade: a worker fails and the new leader restarts its gang.
    cluster.agent.kill_pod(namespace, "across-0-0", exit_code=1)
    wait_until(
        lambda: (
            (s := tpu.status(namespace, "across")).get("attempt") == 2
            and s.get("phase") == "Running"
        ),
        timeout=120,
        message=lambda: (
            f"TPUJob across Running in attempt 2; status {tpu.status(namespace, 'across')}"
        ),
    )
    # Nothing the upgraded operators asked of the apiserver was forbidden.
    for pod in pods:
        log = cluster.pod_log(RELEASE_NAMESPACE, pod["metadata"]["name"], "operator").read_text()
        refused = [line for line in log.splitlines() if "forbidden" in line.lower()]
        assert not refused, f"{pod['metadata']['name']}: {refused[:3]}"


def test_prometheus_scrapes_the_operator_through_its_authorization_and_others_are_refused(
    cluster, release, release_values, prometheus: Prometheus, prometheus_token
):
    # Both replicas are the ServiceMonitor's targets, scraped over HTTPS with the token of
    # the ServiceAccount the chart binds to its metrics reader role.
    job = f"serviceMonitor/{RELEASE_NAMESPACE}/{RELEASE}/0"
    prometheus.wait_for(f'count(up{{job="{job}"}} == 1) == 2', 60, "both operator replicas up")
    targets = [t for t in prometheus.targets() if t["labels"]["job"] == job]
    assert {t["scrapeUrl"].split("://")[0] for t in targets} == {"https"}
    prometheus.wait_for(f'tpu_operator_leader{{job="{job}"}} == 1', 60, "the leader's gauge")

    port = release_values["operator"]["metricsPort"]
    stranger = "metrics-stranger"
    cluster.kubectl("create", "serviceaccount", stranger, "-n", "monitoring", check=False)
    forbidden = cluster.service_account_token("monitoring", stranger)
    for pod in operator_pods(cluster):
        url = f"https://{pod['status']['podIP']}:{port}/metrics"
        assert "tpu_operator_build_info" in read_metrics(url, prometheus_token)
        for token, code in ((None, 401), ("not-a-token", 401), (forbidden, 403)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                read_metrics(url, token)
            body = refused.value.read()
            assert refused.value.code == code, (token, body)
            assert b"tpu_operator_" not in body


def test_users_get_tpujobs_through_the_default_edit_and_view_roles(cluster, release, namespace):
    for user, role in (("alice", "edit"), ("bob", "view")):
        cluster.kubectl(
            "create",
            "rolebinding",
            user,
            f"--clusterrole={role}",
            f"--user={user}",
            "-n",
            namespace,
        )

    def can(user: str, verb: str, resource: str, *more: str) -> bool:
        answer = cluster.kubectl(
            "auth", "can-i", verb, resource, f"--as={user}", "-n", namespace, *more, check=False
        )
        return answer.stdout.strip() == "yes"

    # The controller-manager aggregates the chart's roles into edit and view.
    for user, verb, role in (("alice", "create", "edit"), ("bob", "list", "view")):
        wait_until(
            lambda user=user, verb=verb: can(user, verb, "tpujobs.tpu-operator.dev"),
            timeout=60,
            message=f"TPUJobs aggregated into the {role} role",
        )
    for verb in ("create", "patch", "delete", "get", "watch"):
        for resource in ("tpujobs.tpu-operator.dev", "tpuslices.tpu-operator.dev"):
            assert can("alice", verb, resource), (verb, resource)
            assert can("bob", verb, resource) == (verb in ("get", "watch")), (verb, resource)
    assert not can("carol", "get", "tpujobs.tpu-operator.dev")
    assert can("bob", "get", "tpujobs.tpu-operator.dev", "--subresource=status")
    assert not can("alice", "patch", "tpujobs.tpu-operator.dev", "--subresource=status")


def test_the_install_notes_find_the_leader(cluster, helm: ReleaseHelm, release):
    notes = helm("get", "notes", RELEASE, "--namespace", RELEASE_NAMESPACE).stdout
    lines = [line.strip() for line in notes.splitlines()]
    find = next(line for line in lines if line.startswith("LEADER="))
    logs = next(line for line in lines if line.startswith(f"kubectl -n {RELEASE_NAMESPACE} logs"))
    assert "deploy/" not in notes
    # The notes' commands as a user runs them, with `kubectl logs` reduced to naming the pod
    # (the local cluster serves no pod logs; its files are read instead).
    pod = subprocess.run(
        ["sh", "-c", f"{find}\nprintf %s {logs.rsplit(' ', 1)[1]}"],
        env={**cluster.env(), "PATH": f"{cluster.kubectl_path.parent}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert pod == lease_holder(cluster)
    log = cluster.pod_log(RELEASE_NAMESPACE, pod, "operator").read_text()
    assert "acting as the leader" in log
