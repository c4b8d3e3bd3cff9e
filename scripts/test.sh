#!/usr/bin/env bash
# The whole test suite (the README's test command runs this through `make test`):
# lint, then build or reuse the local control plane and helm, then every pytest tier on
# real components: unit, integration (local control plane, real JAX processes) and
# end-to-end (helm chart, operator, workers, Prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
started=$(date +%s)

echo "[test] lint: ruff, mypy, import layers, hadolint"
"$BIN/ruff" format --check .
"$BIN/ruff" check .
"$BIN/mypy"
"$BIN/lint-imports"
"$BIN/hadolint" Dockerfile worker-image/Dockerfile

echo "[test] control plane, helm and the chart's linters (built from Go modules once, then cached)"
"$BIN/python" -m localcluster build --helm --chart-tools

echo "[test] operator and worker images (buildah, rebuilt when their inputs change; docs/contributing/images.md)"
"$BIN/python" -m localcluster build --images

sh scripts/ensure-prometheus.sh

echo "[test] pytest: unit, integration, e2e, kueue and chaos tiers"
"$BIN/pytest" -m "unit or integration or e2e or kueue or chaos" --durations=20 "$@"

echo "[test] passed in $(( $(date +%s) - started )) s"
