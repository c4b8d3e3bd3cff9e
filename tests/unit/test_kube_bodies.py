"""Request bodies as the API client writes them (``runtime/kube.dumps``): the JSON
``json`` would write, by orjson where it can, and never a bare NaN."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpu_operator.runtime.kube import dumps

pytestmark = pytest.mark.unit
GOLDEN = Path(__file__).parent / "golden"


def strict(raw: bytes) -> Any:
    """Decode as the apiserver does: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=refuse)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"status": {"phase": "Running", "ready": 3}}, id="status patch"),
        pytest.param({"a": [1, 2.5, None, True, "é"], "b": {}}, id="plain values"),
        pytest.param({"template": {"big": 2**64}}, id="integer beyond 64 bits (json)"),
        pytest.param({"template": {"small": -(2**63) - 1}}, id="below -2**63 (json)"),
        pytest.param({"labels": {1: "x"}}, id="a key that is not a string (json)"),
        pytest.param({"pair": (1, 2)}, id="tuple as a list"),
    ],
)
def test_a_body_decodes_to_what_json_would_write(body: dict[str, Any]) -> None:
    assert strict(dumps(body)) == json.loads(json.dumps(body))


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("pod-*.json")), ids=lambda p: p.stem)
def test_a_worker_pod_is_written_as_json_writes_it(golden: Path) -> None:
    pod = json.loads(golden.read_text())
    assert strict(dumps(pod)) == pod
    assert dumps(pod) == json.dumps(pod, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_written_as_null(value: float) -> None:
    assert strict(dumps({"status": {"progress": {"loss": value}}})) == {
        "status": {"progress": {"loss": None}}
    }
