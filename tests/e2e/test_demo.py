"""The README's first command: the local demo runs to a successful job and a summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_the_local_demo_trains_and_points_to_its_results():
    demo = [sys.executable, "-m", "localcluster.demo"]
    try:
        result = subprocess.run(
            [*demo, "--timeout=600"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        for step in range(1, 8):
            assert f"[demo {step}/7]" in output
        assert "TPUJob default/demo Succeeded: all 4 workers exited 0" in output, output
        summary = output[output.index("TPUJob default/demo Succeeded") :]
        assert "step 400, attempt 1, restarts 0" in summary, summary
        assert "tokens/s" in summary and "goodput" in summary, summary
        assert "Prometheus  http://127.0.0.1:" in output
        assert "make demo-down" in output
    finally:
        subprocess.run([*demo, "down"], cwd=REPO, capture_output=True, timeout=120, check=False)
