#!/usr/bin/env bash
# The CAPO paper's ablations (appendix), one CAPO run after another on this node / Ray cluster:
#   tau0.4 tau0.6 tau1.0   tau sensitivity (tau in {0.4, 0.6, 1.0})
#   mask_1.25_2.1          masking interval tightened from [1.05, 2.5] to [1.25, 2.1]
#   no_mask                CAPO without the reference-PPL noise mask
#   grpo_mask              the noise mask applied to Dr. GRPO's advantages (estimator grpo_mask)
# Each is configs/ablation/<name>.yaml applied to configs/capo_qwen2.5_math_<size>.yaml, i.e.
#   bash scripts/run_capo_qwen2.5_math_<size>.sh ablation=<name> [overrides]
# and gets its own experiment name and checkpoint folder (capo_tau0.4_qwen2.5_math_1.5b, ...).
#
# usage: bash scripts/run_ablations.sh [--size 1.5b|7b] [--only a,b,...] [--dry-run] [HYDRA_OVERRIDE ...]
#   --size    model size (default 1.5b, as in the paper's ablation figures)
#   --only    comma list of ablations (default: all; for 1.5b tau0.6 is left out because it is the main
#             CAPO run, scripts/run_capo_qwen2.5_math_1.5b.sh; ask for it with --only to run it anyway)
#   --dry-run print each run's command and resolved config; start nothing
# Paths and cluster: the variables of scripts/_common.sh. A failed run stops the sweep.
set -euo pipefail

ALL_ABLATIONS=(tau0.4 tau0.6 tau1.0 mask_1.25_2.1 no_mask grpo_mask)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
size=1.5b
only=""
passthrough=()
while [ $# -gt 0 ]; do
    case "$1" in
        --size) size="${2:?--size needs 1.5b or 7b}"; shift 2 ;;
        --size=*) size="${1#--size=}"; shift ;;
        --only) only="${2:?--only needs a comma list}"; shift 2 ;;
        --only=*) only="${1#--only=}"; shift ;;
        -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) passthrough+=("$1"); shift ;;
    esac
done
case "$size" in
    1.5b | 7b) ;;
    *) echo "error: --size must be 1.5b or 7b, got '$size'" >&2; exit 2 ;;
esac

ablations=()
if [ -n "$only" ]; then
    IFS=, read -r -a ablations <<<"$only"
    for name in "${ablations[@]}"; do
        if [ ! -f "${here}/../configs/ablation/${name}.yaml" ]; then
            echo "error: unknown ablation '$name'; choose from: ${ALL_ABLATIONS[*]}" >&2
            exit 2
        fi
    done
else
    for name in "${ALL_ABLATIONS[@]}"; do
        if [ "$size" = 1.5b ] && [ "$name" = tau0.6 ]; then
            echo "# skipping tau0.6: for 1.5b it is the main CAPO run (scripts/run_capo_qwen2.5_math_1.5b.sh)"
            continue
        fi
        ablations+=("$name")
    done
fi

for name in "${ablations[@]}"; do
    echo "# ===== ablation ${name} (Qwen2.5-Math-${size}) ====="
    bash "${here}/run_capo_qwen2.5_math_${size}.sh" "ablation=${name}" "${passthrough[@]}"
done
