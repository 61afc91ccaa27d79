#!/usr/bin/env bash
# GSPO baseline (sequence-level ratios, clip 3e-4/4e-4, no KL) on Qwen/Qwen2.5-Math-7B:
#   configs/gspo_qwen2.5_math_7b.yaml, 400 steps on 8 GPUs.
#
#   bash scripts/run_gspo_qwen2.5_math_7b.sh                       # train (one node, local Ray)
#   bash scripts/run_gspo_qwen2.5_math_7b.sh --dry-run             # command + resolved config only
#   bash scripts/run_gspo_qwen2.5_math_7b.sh trainer.test_freq=10  # Hydra overrides go to verl
#
# Paths, model and cluster: CAPO_DATA_DIR, CAPO_CKPT_DIR,
#   CAPO_MODEL_7B (default Qwen/Qwen2.5-Math-7B),
#   CAPO_VAL_SETS, NNODES, N_GPUS_PER_NODE, RAY_ADDRESS (multi-node through an existing Ray cluster:
#   see scripts/_common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
capo_launch gspo_qwen2.5_math_7b "${CAPO_MODEL_7B:-Qwen/Qwen2.5-Math-7B}" "$@"
