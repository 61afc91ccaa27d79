#!/usr/bin/env bash
# CAPO (logistic AUC advantages + reference-PPL noise mask, no KL) on Qwen/Qwen2.5-Math-7B:
#   configs/capo_qwen2.5_math_7b.yaml, 400 steps on 8 GPUs.
#
#   bash scripts/run_capo_qwen2.5_math_7b.sh                       # train (one node, local Ray)
#   bash scripts/run_capo_qwen2.5_math_7b.sh --dry-run             # command + resolved config only
#   bash scripts/run_capo_qwen2.5_math_7b.sh trainer.test_freq=10  # Hydra overrides go to verl
#   bash scripts/run_capo_qwen2.5_math_7b.sh ablation=tau0.4       # configs/ablation/<name>.yaml on top
#
# Paths, model and cluster: CAPO_DATA_DIR, CAPO_CKPT_DIR,
#   CAPO_MODEL_7B (default Qwen/Qwen2.5-Math-7B),
#   CAPO_VAL_SETS, NNODES, N_GPUS_PER_NODE, RAY_ADDRESS (multi-node through an existing Ray cluster:
#   see scripts/_common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
capo_launch capo_qwen2.5_math_7b "${CAPO_MODEL_7B:-Qwen/Qwen2.5-Math-7B}" "$@"
