# Developer entry points. `make demo` and `make test` are the README's two commands: each
# sets up what it needs (virtualenv, Go-built control plane, helm and the chart's linters,
# Prometheus) on a fresh machine and reuses the caches on later runs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: venv test unit lint fmt crds dashboards docs lock demo demo-down cluster-up cluster-down clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "[setup] creating $(VENV) and installing tpu-operator with its dev extras"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

# The whole suite: lint, unit, integration (local control plane, real JAX processes)
# and end-to-end (helm chart, operator, workers, Prometheus).
test: venv
	bash scripts/test.sh

unit: venv
	$(BIN)/pytest -m unit -q

lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The local demo: cluster, chart, operator, Prometheus, a JAX training job with live
# progress and a summary. It keeps running until `make demo-down`.
demo: venv
	$(BIN)/python -m localcluster.demo

demo-down: venv
	$(BIN)/python -m localcluster.demo down

crds: venv
	$(BIN)/tpu-operator crds --write

dashboards: venv
	$(BIN)/tpu-operator dashboards --write

# The reference pages of the docs (docs/reference/), from the models, contract, metrics,
# alert rules, flags and chart values; a unit test fails when they are stale.
docs: venv
	$(BIN)/tpu-operator docs --write

# The images' lock files (requirements/*.txt), resolved with hashes from pyproject.toml.
# A unit test fails while one is stale (tests/unit/test_lockfiles.py).
lock: venv
	$(BIN)/python scripts/lock.py

# The local control plane with simulated TPU pools, detached (KUBECONFIG is printed).
cluster-up: venv
	$(BIN)/python -m localcluster up

cluster-down: venv
	$(BIN)/python -m localcluster down

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .localcluster .demo
