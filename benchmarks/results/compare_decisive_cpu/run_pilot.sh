#!/usr/bin/env bash
# The decisive GRPO-vs-CAPO comparison's pilot (docs/compare.md: the plan and its amendment 1), exactly as it runs.
# It trains from a clone of this repository at the commit in code_commit.txt (every unit the same code), writes
# into $CAPO_PILOT_DIR/out (default ~/capo_pilot/out) and goes on where an earlier run stopped. Run it in the
# background and copy finished units into the repository with benchmarks/collect_compare.py:
#   nohup bash benchmarks/results/compare_decisive_cpu/run_pilot.sh > ~/capo_pilot/run.log 2>&1 &
#   .venv/bin/python benchmarks/collect_compare.py ~/capo_pilot/out benchmarks/results/compare_decisive_cpu/pilot
# SEEDS (default 0,1,2) and METHODS (default "grpo capo") pick the units; one unit a call, e.g.
# SEEDS=0 METHODS=capo, makes its held-out evaluation when it finishes (amendment 2 in docs/compare.md).
# PILOT_PATCH=resume_val_only.patch applies that file of this folder to the clone (amendment 3: only to resume a
# unit stopped after its step-30 checkpoint); done.json then records the code as modified.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
root=${CAPO_PILOT_DIR:-$HOME/capo_pilot}
commit=$(cat "$here/code_commit.txt")
mkdir -p "$root"
[ -d "$root/code/.git" ] || git clone -q "$repo" "$root/code"
git -C "$root/code" reset -q --hard "$commit"
[ -z "${PILOT_PATCH:-}" ] || git -C "$root/code" apply "$here/$PILOT_PATCH"
cd "$root/code"
export PYTHONPATH=$PWD
exec "$repo/.venv/bin/python" -m capo_verl.compare --methods ${METHODS:-grpo capo} --seeds "${SEEDS:-0,1,2}" --steps 30 \
  --val-questions 256 --teacher-forced 8 --out "$root/out" \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.test_freq=30 trainer.save_freq=15 \
  'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}' \
  '+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
