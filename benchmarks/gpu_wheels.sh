#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.py on a CUDA machine without network (`make gpu-wheels`).
#
# Into .whl/ (git-ignored by .gitignore): the CPython 3.12 manylinux x86-64 wheels of looprl's
# runtime dependencies (pyproject.toml) and of their own requirements that the device image lacks
# (NAMES below), at the versions installed in $PY's environment (the ones the tests run with
# here), and looprl's own wheel (from the repository root, Python imports the checkout's looprl
# first; the wheel serves a run from elsewhere). The image already holds torch, transformers, tokenizers, safetensors,
# huggingface-hub, numpy, rich, httpx, peft, jinja2, sympy, matplotlib, tensorboard, scipy and
# typing-extensions. Then, on the device machine, from the repository root:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site python3 -m benchmarks.gpu_check --out gpu_check.json
#
# Needs network here (pip download from PyPI). PY defaults to the venv `make setup` makes.
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEST=${DEST:-.whl}
# missing there: pydantic and pydantic-core (imported by gpu_check through looprl's config) with
# annotated-types and typing-inspection; math-verify with latex2sympy2-extended and
# antlr4-python3-runtime; bm25s. Not carried: reasoning-gym, which needs pycosat, a C extension
# with no CPython 3.12 wheel on PyPI (only looprl's reasoning_gym environment imports it).
NAMES=(pydantic pydantic-core annotated-types typing-inspection math-verify latex2sympy2-extended
       antlr4-python3-runtime bm25s)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

pins=$("$PY" -c 'import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
except PackageNotFoundError as e:
    sys.exit(f"{e.name} is not installed in {sys.executable}; run make setup first")' "${NAMES[@]}")
mkdir -p "$DEST"
# shellcheck disable=SC2086  # $pins is a list of NAME==VERSION words
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp ${PLATFORMS[@]/#/--platform } -d "$DEST" $pins
# looprl's wheel from a copy of the sources, so that no build/ folder is left in the checkout
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -r pyproject.toml README.md looprl "$src"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" "$src"
ls -1 "$DEST"
du -sh "$DEST"
