#!/usr/bin/env bash
# CDE baseline (GRPO on the reward + CDE's perplexity bonus, no KL) on Qwen/Qwen2.5-Math-1.5B:
#   configs/cde_qwen2.5_math_1.5b.yaml, 600 steps on 8 GPUs.
#
#   bash scripts/run_cde_qwen2.5_math_1.5b.sh                       # train (one node, local Ray)
#   bash scripts/run_cde_qwen2.5_math_1.5b.sh --dry-run             # command + resolved config only
#   bash scripts/run_cde_qwen2.5_math_1.5b.sh trainer.test_freq=10  # Hydra overrides go to verl
#
# Paths, model and cluster: CAPO_DATA_DIR, CAPO_CKPT_DIR,
#   CAPO_MODEL_1_5B (default Qwen/Qwen2.5-Math-1.5B),
#   CAPO_VAL_SETS, NNODES, N_GPUS_PER_NODE, RAY_ADDRESS, PYTHON (see scripts/_common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
capo_launch cde_qwen2.5_math_1.5b "${CAPO_MODEL_1_5B:-Qwen/Qwen2.5-Math-1.5B}" "$@"
