#!/usr/bin/env bash
# The no-mask run (its plan: README.md and plan.yaml beside this file), exactly as it runs: CAPO without the
# reference-PPL mask (compare's capo_no_mask), seeds 3-12, paired with the main run's GRPO units. It trains from a
# clone of this repository at the commit in code_commit.txt (the main run's), writes into $CAPO_NOMASK_DIR/out
# (default ~/capo_nomask/out) and goes on where an earlier run stopped. One unit per call, in the background:
#   SEED=3 nohup bash benchmarks/results/compare_nomask_cpu/run_nomask.sh > ~/capo_nomask/run.log 2>&1 &
# Before its first unit it lays into the output folder what the main run made and this run shares, from the main
# run's committed files (../compare_main_cpu/units): the top folder's marker, the teacher-forced pool with its
# base-model scores, and per seed the seed folder's marker, the step-0 pass and the GRPO unit, each compressed file
# decompressed. compare reuses them only if their recorded settings equal this run's, else it stops before training.
# Then copy the finished unit into the repository, without what it shares with the main run (its GRPO units, step-0
# passes, teacher-forced pool and folder markers, all identical to the main run's committed ones) and without the
# figures (checkpoints stay behind, dumps compressed; `compare --plot-only` redraws the figures):
#   .venv/bin/python benchmarks/collect_compare.py --compress-dumps --skip 'seed*/grpo' --skip 'seed*/step0' \
#     --skip teacher_forced --skip '*.png' --skip '*.capo-verl-compare.json' \
#     ~/capo_nomask/out benchmarks/results/compare_nomask_cpu/units
# and write the summaries over the seeds done so far from the committed files (readings.sh beside this file):
#   bash benchmarks/results/compare_nomask_cpu/readings.sh 3-K
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
main=$repo/benchmarks/results/compare_main_cpu/units
root=${CAPO_NOMASK_DIR:-$HOME/capo_nomask}
out=$root/out
commit=$(cat "$here/code_commit.txt")
: "${SEED:?set SEED=k (one seed of plan.yaml: 3 to 12)}"
[ -d "$main/seed$SEED/grpo" ] && [ -d "$main/seed$SEED/step0" ] || {
  echo "no main-run GRPO unit or step-0 pass for seed $SEED in $main" >&2; exit 2; }
mkdir -p "$out"
# copies one shared folder of the main run once, with every *.xz and *.gz decompressed beside it (the pinned
# commit reads plain and .gz dumps only)
lay() {
  [ -e "$out/$1" ] && return
  mkdir -p "$(dirname "$out/$1")"
  cp -r "$main/$1" "$out/$1.partial"
  find "$out/$1.partial" -name '*.xz' -exec unxz {} +
  find "$out/$1.partial" -name '*.gz' -exec gunzip {} +
  mv "$out/$1.partial" "$out/$1"
}
[ -e "$out/.capo-verl-compare.json" ] || cp "$main/.capo-verl-compare.json" "$out/"
lay teacher_forced
mkdir -p "$out/seed$SEED"
[ -e "$out/seed$SEED/.capo-verl-compare.json" ] || cp "$main/seed$SEED/.capo-verl-compare.json" "$out/seed$SEED/"
lay "seed$SEED/step0"
lay "seed$SEED/grpo"
[ -d "$root/code/.git" ] || git clone -q "$repo" "$root/code"
git -C "$root/code" fetch -q "$repo" main
git -C "$root/code" reset -q --hard "$commit"
# The venv's capo-verl metadata is this checkout's, whose entry points may name modules the pinned commit lacks
# (vLLM loads its general plugins in every process). A dist-info with the pinned commit's own entry points, first on
# the path, takes its place: importlib.metadata keeps the first distribution of a name.
meta=$root/meta/capo_verl-0.1.0.dist-info
rm -rf "$root/meta" && mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: capo-verl\nVersion: 0.1.0\n' > "$meta/METADATA"
"$repo/.venv/bin/python" - "$root/code/pyproject.toml" > "$meta/entry_points.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
for group, points in groups.items():
    print(f"[{group}]", *(f"{name} = {target}" for name, target in points.items()), "", sep="\n")
PY
cd "$root/code"
export PYTHONPATH=$root/meta:$PWD
exec "$repo/.venv/bin/python" -m capo_verl.compare --methods grpo capo_no_mask --plan "$here/plan.yaml" --share-step0 \
  --seeds "$SEED" --steps 30 --val-questions all --teacher-forced 8 --out "$out" \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.test_freq=30 trainer.save_freq=30 \
  actor_rollout_ref.rollout.val_kwargs.n=16 \
  'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}' \
  '+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
