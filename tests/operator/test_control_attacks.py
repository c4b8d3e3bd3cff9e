"""The control channel of in-place restarts against a tenant who attacks it, on the local
cluster with the operator as a real process.

- A key Secret planted under every name computable from the job: never used; the job's
  Secret is named after its key's id and immutable. One replaced after the fact (deleted
  and made again under the same name) reaches new pods, whose supervisors refuse it.
- Pods of a job whose "supervisors" never answer, or answer a gigabyte: the operator cuts
  them off (timeout, answer cap), restarts that job by recreation, and another job's
  in-place restart runs meanwhile.
"""

from __future__ import annotations

import base64
import json
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from localcluster.testing import wait_until
from tests.operator.support import Api
from tests.operator.test_inplace import demo_job, exits_once, identities, running_attempt
from tpu_operator import contract
from tpu_operator import supervision as sv

pytestmark = pytest.mark.integration
SCRIPTS = Path("/var/tmp/tpu-operator-tests/control-attacks")
ATTACKER_KEY = b"the attacker's own key, 32 bytes"


def master_key(operator: Any) -> bytes:
    """The operator's master key (the file the test operator reads)."""
    path = next(a for a in operator.extra_args if a.startswith("--control-key-file="))
    return Path(path.split("=", 1)[1]).read_bytes().strip()


def script(name: str, text: str) -> Path:
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    path = SCRIPTS / name
    path.write_text(textwrap.dedent(text))
    return path


def sleeper_job(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """A 2-host v5p job under the supervisor whose workers join (JAX rendezvous) and then
    sleep: ready in seconds, nothing to compile."""
    sleep = script("sleep.py", "import time\nwhile True:\n    time.sleep(3600)\n")
    worker = {
        "name": "worker",
        "image": "unused.local/worker",
        "command": ["tpu-worker", "run", str(sleep)],
    }
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.JOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "slice": {"type": "v5p-16"},
            "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [worker]}},
            "failurePolicy": {"backoffSeconds": 0, "maxRestarts": 3},
            **spec,
        },
    }


def secret(namespace: str, name: str, key: bytes, job: dict[str, Any]) -> dict[str, Any]:
    """A Secret made to look like the operator's: its labels, owned by the job."""
    meta = job["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
                contract.LABEL_JOB_NAME: meta["name"],
                contract.LABEL_CONTROL_KEY: "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": contract.JOB_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "data": {contract.CONTROL_KEY_FILE: base64.b64encode(key).decode()},
    }


def ask(pod: dict[str, Any], key: bytes) -> tuple[int, dict[str, Any], str | None]:
    """GET /v1/status of the pod's supervisor signed with ``key``; (code, body, the
    answer's signature if it checks out with ``key``)."""
    header = sv.sign(key, "GET", sv.STATUS_PATH, b"", pod=pod["metadata"]["uid"])
    url = f"http://{pod['status']['podIP']}:{contract.DEFAULT_CONTROL_PORT}{sv.STATUS_PATH}"
    request = urllib.request.Request(url, headers={"Authorization": header})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            code, body, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        code, body, headers = error.code, error.read(), error.headers
    signature = headers.get(sv.ANSWER_HEADER)
    if signature is not None:
        nonce, uid = sv.nonce_of(header), pod["metadata"]["uid"]
        sv.verify_answer(key, uid, nonce, code, body, signature)
    return code, json.loads(body), signature


def volume_secret(pod: dict[str, Any]) -> str:
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == contract.CONTROL_VOLUME)
    return volume["secret"]["secretName"]


def test_a_planted_key_secret_is_never_used(tpu: Api, namespace, cluster, running_operator):
    tpu.apply(sleeper_job(namespace, "planted", suspend=True))
    job = wait_until(
        lambda: (j := tpu.job(namespace, "planted")).get("status", {}).get("phase") and j,
        timeout=60,
        message="the suspended job to be seen by the operator",
    )
    uid = job["metadata"]["uid"]
    # Every name the attacker can compute from the job alone (the name the key Secret
    # used to have among them), made to look like the operator's own.
    guesses = [f"planted-control-{uid[:8]}", f"planted-control-{uid}", "planted-control"]
    for name in guesses:
        tpu.apply(secret(namespace, name, ATTACKER_KEY, job))
    tpu.patch_job(namespace, "planted", {"spec": {"suspend": False}})
    running_attempt(tpu, namespace, "planted", 1)

    key = sv.derive_job_key(master_key(running_operator), uid)
    key_id = sv.key_id(key)
    pods = tpu.pods(namespace)
    assert {volume_secret(p) for p in pods} == {f"planted-control-{key_id}"}
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env[contract.ENV_CONTROL_KEY_ID] == key_id
    ours = tpu.raw.get(f"/api/v1/namespaces/{namespace}/secrets/planted-control-{key_id}")
    assert ours["immutable"] is True
    assert base64.b64decode(ours["data"][contract.CONTROL_KEY_FILE]) == key
    assert ours["metadata"]["ownerReferences"][0]["uid"] == uid
    for name in guesses:  # left alone, never read or mounted
        planted = tpu.raw.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        assert base64.b64decode(planted["data"][contract.CONTROL_KEY_FILE]) == ATTACKER_KEY

    # The attacker's key commands nothing; the operator's does, and the answer is signed.
    code, body, _ = ask(pods[0], ATTACKER_KEY)
    assert code == 401 and "bad signature" in body["error"]
    code, body, signature = ask(pods[0], key)
    assert (code, body["state"]) == (200, "running") and signature is not None

    # Replaced after the fact: the Secret deleted and made again under its name (public in
    # the pod spec) with the attacker's key. New pods mount it; their supervisors use no
    # key whose id is not the one the operator gave the pod.
    path = f"/api/v1/namespaces/{namespace}/secrets/planted-control-{key_id}"
    tpu.raw.call("DELETE", path)
    tpu.apply(secret(namespace, f"planted-control-{key_id}", ATTACKER_KEY, job))
    cluster.kubectl("delete", "pod", "-n", namespace, "planted-0-1", "--wait=false")
    running_attempt(tpu, namespace, "planted", 2, timeout=240)
    for pod in tpu.pods(namespace):
        for which in (ATTACKER_KEY, key):
            code, body, signature = ask(pod, which)
            assert code == 401 and signature is None
            assert "the mounted control key is not the operator's" in body["error"]
    assert "Traceback" not in running_operator.tail(400)


HOSTILE = """
    import os, socket, sys, threading, time

    # Worker 0 takes every control request and never answers; worker 1 answers each with a
    # gigabyte. Both look like a training process that stopped after a few seconds.
    ip = os.environ["TPU_OPERATOR_POD_IP"]
    port = int(os.environ["TPU_OPERATOR_CONTROL_PORT"])
    mode = "silent" if os.environ["TPU_WORKER_ID"] == "0" else "flood"
    report = os.path.join(sys.argv[1], f"{os.environ['TPU_OPERATOR_POD_NAME']}.{mode}")
    started = time.monotonic()
    server = socket.create_server((ip, port), backlog=512)

    def serve(conn):
        sent = 0
        try:
            request = conn.recv(65536)
            if request.startswith(b"GET /readyz"):
                up = time.monotonic() - started < 8
                body = b"ok" if up else b"not running"
                head = "HTTP/1.1 %d X\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n"
                conn.sendall((head % (200 if up else 503, len(body))).encode() + body)
                return
            if mode == "silent":
                time.sleep(3600)
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nConnection: close\\r\\n\\r\\n")
            chunk = b"{" * 1048576
            for _ in range(1024):
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            if mode == "flood" and sent:
                with open(report, "a") as out:
                    out.write(f"{sent}\\n")
            conn.close()

    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def test_supervisors_that_never_answer_or_flood_do_not_hold_up_another_job(
    tpu: Api, namespace, running_operator, tmp_path
):
    reports = SCRIPTS / namespace
    reports.mkdir(parents=True, exist_ok=True)
    hostile = script("hostile.py", HOSTILE)
    worker = {
        "name": "worker",
        "image": "unused.local/worker",
        "command": [sys.executable, str(hostile), str(reports)],
    }
    tpu.apply(
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.JOB_KIND,
            "metadata": {"name": "hostile", "namespace": namespace},
            "spec": {
                "slice": {"type": "v5litepod-8", "chipsPerHost": 4},
                "template": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [worker]}},
                # Supervised (InPlace: the image's entrypoint would be tpu-worker), and
                # hostile again after every recreation.
                "failurePolicy": {"restartMode": "InPlace", "backoffSeconds": 0, "maxRestarts": 50},
            },
        }
    )
    first = wait_until(
        lambda: (s := tpu.status(namespace, "hostile")).get("restarts", 0) >= 1 and s,
        timeout=180,
        message="the hostile job's first restart",
    )
    assert first["lastFailure"]["reason"] == "SupervisorUnreachable"
    assert first["restartKind"] == "Recreate"

    # Another job's in-place restart, while the hostile one keeps being asked.
    hostile_before = tpu.status(namespace, "hostile")["restarts"]
    manifest, _ = demo_job(
        namespace, "honest", "--steps=100000", env=exits_once(step=12, process=1)
    )
    tpu.apply(manifest)
    running_attempt(tpu, namespace, "honest", 1, timeout=240)
    before = identities(tpu, namespace)
    status = running_attempt(tpu, namespace, "honest", 2, timeout=240)
    assert status["restartKind"] == "InPlace"
    honest_now = {k: v for k, v in identities(tpu, namespace).items() if k.startswith("honest")}
    assert honest_now == {k: v for k, v in before.items() if k.startswith("honest")}
    # The hostile job is still being asked and recreated in its own loop (its cycle, about
    # 20 s, may or may not have completed inside the honest restart's window).
    wait_until(
        lambda: tpu.status(namespace, "hostile")["restarts"] > hostile_before,
        timeout=180,
        message="the hostile job's next restart (the operator must not be wedged on it)",
    )

    log = running_operator.log_path.read_text(errors="replace")
    assert "no answer within 5 s" in log
    assert f"passed the {sv.MAX_BODY_BYTES}-byte cap; cut there" in log
    sent = [int(n) for f in reports.glob("*.flood") for n in f.read_text().split()]
    assert sent and max(sent) < 256 * 1024 * 1024, sent  # nowhere near the gigabyte
    assert "Traceback" not in running_operator.tail(400)
    tpu.patch_job(namespace, "hostile", {"spec": {"suspend": True}})
