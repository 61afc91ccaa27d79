#!/usr/bin/env bash
# The no-mask run's summaries, written from the committed units (its plan: README.md beside this file), all three
# over the same seeds:
#   bash benchmarks/results/compare_nomask_cpu/readings.sh 3-12
# 1. the verdict, no-mask CAPO against the main run's GRPO, by plan.yaml: units/seeds_summary.{json,md};
# 2. what the mask does, no-mask CAPO against the main run's masked CAPO (secondary reading 1, no verdict):
#    mask_reading/seeds_summary.{json,md};
# 3. the main run's own reading, masked CAPO against GRPO by its plan (../compare_main_cpu/plan.yaml), over these
#    seeds: main_reading/seeds_summary.{json,md} (over seeds 3-12 it is the main run's units/seeds_summary.json).
# Each is `capo-verl compare --plot-only` over a folder laid out of the committed files: the main run's
# teacher-forced pool, step-0 passes and GRPO or CAPO units, and this run's no-mask units. The figures are drawn in
# that folder and left there (anyone can redraw them so). tests/test_results_storage.py recomputes the summaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
main=$repo/benchmarks/results/compare_main_cpu/units
units=$here/units
seeds=${1:?give the seeds, e.g. 3-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=$repo/.venv/bin/python
# lays into $work/$1 the main run's shared files and, per seed, the units named after it: capo_no_mask from this
# run, any other from the main run
lay() {
  local out=$work/$1 k u
  shift
  mkdir -p "$out"
  cp -r "$main/teacher_forced" "$main/.capo-verl-compare.json" "$out/"
  for k in $(for part in ${seeds//,/ }; do seq "${part%-*}" "${part#*-}"; done); do  # 3-12, or 3,5,7-9
    mkdir -p "$out/seed$k"
    cp -r "$main/seed$k/.capo-verl-compare.json" "$main/seed$k/step0" "$out/seed$k/"
    for u in "$@"; do
      if [ "$u" = capo_no_mask ]; then cp -r "$units/seed$k/$u" "$out/seed$k/"; else cp -r "$main/seed$k/$u" "$out/seed$k/"; fi
    done
  done
}
lay verdict grpo capo_no_mask
"$py" -m capo_verl.compare --plot-only --seeds "$seeds" --methods grpo capo_no_mask --plan "$here/plan.yaml" \
  --out "$work/verdict"
lay mask capo capo_no_mask
"$py" -m capo_verl.compare --plot-only --seeds "$seeds" --methods capo capo_no_mask --out "$work/mask"
lay main grpo capo
"$py" -m capo_verl.compare --plot-only --seeds "$seeds" --methods grpo capo --plan "$main/../plan.yaml" \
  --out "$work/main"
mkdir -p "$here/mask_reading" "$here/main_reading"
cp "$work/verdict/seeds_summary.json" "$work/verdict/seeds_summary.md" "$units/"
cp "$work/mask/seeds_summary.json" "$work/mask/seeds_summary.md" "$here/mask_reading/"
cp "$work/main/seeds_summary.json" "$work/main/seeds_summary.md" "$here/main_reading/"
echo "wrote $units/seeds_summary.{json,md}, $here/mask_reading/ and $here/main_reading/ (seeds $seeds)"
