#!/usr/bin/env bash
# Pilot 2 of the GRPO-vs-CAPO comparison (docs/results/pilot2.md: pilot 1's plan and the amendment fixed before
# any of its units), exactly as it runs. It trains from a clone of this repository at the commit in
# code_commit.txt (every unit the same code), writes into $CAPO_PILOT2_DIR/out (default ~/capo_pilot2/out) and goes
# on where an earlier run stopped. One unit per call, in the background, e.g.
#   SEEDS=0 METHODS=grpo nohup bash benchmarks/results/compare_pilot2_cpu/run_pilot2.sh > ~/capo_pilot2/run.log 2>&1 &
# then copy the finished unit into the repository (checkpoints stay behind):
#   .venv/bin/python benchmarks/collect_compare.py ~/capo_pilot2/out benchmarks/results/compare_pilot2_cpu/pilot
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
root=${CAPO_PILOT2_DIR:-$HOME/capo_pilot2}
commit=$(cat "$here/code_commit.txt")
: "${SEEDS:?set SEEDS=k (one seed: 0, 1 or 2)}" "${METHODS:?set METHODS=grpo or METHODS=capo}"
mkdir -p "$root"
[ -d "$root/code/.git" ] || git clone -q "$repo" "$root/code"
git -C "$root/code" fetch -q "$repo" main
git -C "$root/code" reset -q --hard "$commit"
cd "$root/code"
export PYTHONPATH=$PWD
exec "$repo/.venv/bin/python" -m capo_verl.compare --methods $METHODS --seeds "$SEEDS" --steps 30 \
  --val-questions 256 --teacher-forced 8 --out "$root/out" \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.test_freq=30 trainer.save_freq=15 \
  'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}' \
  '+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
