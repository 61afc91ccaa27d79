#!/usr/bin/env bash
# CoDaPO baseline (GRPO advantages x CoDaPO's confidence-difficulty weight, no resampling, no KL) on Qwen/Qwen2.5-Math-7B:
#   configs/codapo_qwen2.5_math_7b.yaml, 400 steps on 8 GPUs.
#
#   bash scripts/run_codapo_qwen2.5_math_7b.sh                       # train (one node, local Ray)
#   bash scripts/run_codapo_qwen2.5_math_7b.sh --dry-run             # command + resolved config only
#   bash scripts/run_codapo_qwen2.5_math_7b.sh trainer.test_freq=10  # Hydra overrides go to verl
#
# Paths, model and cluster: CAPO_DATA_DIR, CAPO_CKPT_DIR,
#   CAPO_MODEL_7B (default Qwen/Qwen2.5-Math-7B),
#   CAPO_VAL_SETS, NNODES, N_GPUS_PER_NODE, RAY_ADDRESS, PYTHON (see scripts/_common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
capo_launch codapo_qwen2.5_math_7b "${CAPO_MODEL_7B:-Qwen/Qwen2.5-Math-7B}" "$@"
