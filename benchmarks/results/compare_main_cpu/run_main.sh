#!/usr/bin/env bash
# The main GRPO-vs-CAPO run (docs/results/main.md; its plan: README.md and plan.yaml beside this file), exactly as it
# runs. It trains from a clone of this repository at the commit in code_commit.txt (every unit the same code), writes
# into $CAPO_MAIN_DIR/out (default ~/capo_main/out) and goes on where an earlier run stopped. One unit per call, in
# the background, seed by seed, GRPO then CAPO, e.g.
#   SEED=3 METHOD=grpo nohup bash benchmarks/results/compare_main_cpu/run_main.sh > ~/capo_main/run.log 2>&1 &
#   SEED=3 METHOD=capo nohup bash benchmarks/results/compare_main_cpu/run_main.sh > ~/capo_main/run.log 2>&1 &
# Each seed's step-0 validation pass is made once, before its units, and both units take it (--share-step0; the
# plan's amendment of 2026-11-27):
#   SEED=3 METHOD=step0 nohup bash benchmarks/results/compare_main_cpu/run_main.sh > ~/capo_main/run.log 2>&1 &
# SHARE_STEP0=0 validates step 0 in every unit instead (the plan's rule if seed 3's check fails). Before the first
# unit, METHOD=prepare writes the data and draws and scores the teacher-forced pool that every unit shares, and
# trains nothing. Then copy the finished unit (or step-0 pass) into the repository (checkpoints stay behind,
# validation dumps compressed):
#   .venv/bin/python benchmarks/collect_compare.py --compress-dumps ~/capo_main/out benchmarks/results/compare_main_cpu/units
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
root=${CAPO_MAIN_DIR:-$HOME/capo_main}
commit=$(cat "$here/code_commit.txt")
: "${SEED:?set SEED=k (one seed of plan.yaml: 3 to 12)}" "${METHOD:?set METHOD=prepare, step0, grpo or capo}"
share=${SHARE_STEP0:-1}
case "$METHOD" in
  prepare) methods=(--methods grpo --prepare-only) ;;
  step0) methods=(--methods grpo --step0-only) ;;
  grpo) methods=(--methods grpo) ;;
  capo) methods=(--methods grpo capo --plan "$here/plan.yaml") ;;
  *) echo "METHOD must be prepare, step0, grpo or capo, got $METHOD" >&2; exit 2 ;;
esac
if [ "$METHOD" != prepare ] && [ "$share" = 1 ]; then
  methods+=(--share-step0)
elif [ "$METHOD" = step0 ]; then
  echo "METHOD=step0 makes the shared step-0 pass: it needs SHARE_STEP0=1 (the default)" >&2; exit 2
fi
mkdir -p "$root"
[ -d "$root/code/.git" ] || git clone -q "$repo" "$root/code"
git -C "$root/code" fetch -q "$repo" main
git -C "$root/code" reset -q --hard "$commit"
cd "$root/code"
export PYTHONPATH=$PWD
exec "$repo/.venv/bin/python" -m capo_verl.compare "${methods[@]}" --seeds "$SEED" --steps 30 \
  --val-questions all --teacher-forced 8 --out "$root/out" \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.test_freq=30 trainer.save_freq=30 \
  actor_rollout_ref.rollout.val_kwargs.n=16 \
  'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}' \
  '+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
