#!/usr/bin/env bash
# capo-verl's GPU checks in one command, for a GPU machine like the one lent to this project: one GPU; Python 3.12
# with a CUDA build of torch and transformers; no verl, no Ray, no vLLM, no package index (tests/gpu/README.md).
#
#   bash tests/gpu/run_on_device.sh [OUT_DIR]          (default: $OUT)
#   KIT=none bash tests/gpu/run_on_device.sh OUT_DIR   (verl 0.9.1 and capo-verl installed already: no kit stage)
#   bash tests/gpu/run_on_device.sh --plan             (prints each stage's time limit and command; runs nothing)
#
# cuda_check: without CUDA it stops at once (one line naming CUDA, exit status 3, nothing written);
# 0. env: the source files' blob hashes and the machine (tests/gpu/device_record.py env);
# 1. kit: lays verl's kit ($KIT/whl/*.whl, made by tests/gpu/prepare_kit.sh; default $REPO/.device-kit) into a
#    target folder put first on PYTHONPATH (tests/gpu/lay_kit.sh), so `import verl` loads the plugin through its
#    verl.plugins entry point as an install does. KIT=none: no kit stage; verl 0.9.1 and capo-verl (its entry
#    point) come from the Python's own environment (`pip install -e '.[gpu,dev]'`). The checkout goes on PYTHONPATH
#    either way; preflight checks that verl loads the plugin;
# 2. pytest_gpu: the CUDA tier, pytest -m gpu tests/gpu (junit xml with each test's measured differences);
# 3. actor_update_cpu / _cuda / _compare: one actor update of verl's FSDP engine on the CPU (VERL_PLATFORM=cpu,
#    CUDA hidden), then the same on CUDA, then the two compared (tests/gpu/actor_update_check.py);
# 4. gpu_tier: the estimators' times (benchmarks/gpu_tier.py);
# 5. record: record.json and summary.txt (tests/gpu/device_record.py build); exit status 0 only if every stage
#    exited 0.
#
# Each stage runs under its own time limit (timeout; KILL_AFTER_S later, SIGKILL). The limits with the kill grace
# add up to at most 540 s (tests/test_gpu_check_stages.py reads them from --plan): under the 600 s a GPU machine
# gives one command, so a stage that hangs still leaves record.json. Sized for about 3 minutes on an H100/H200.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
KIT=${KIT:-$REPO/.device-kit}
KILL_AFTER_S=3  # a stage that ignores timeout's SIGTERM is killed this many seconds later
PLAN=0
if [ "${1:-}" = --plan ]; then
    PLAN=1
    PLAN_TOTAL=0
    shift
fi
OUT_DIR=${1:-${OUT:-}}

# limited NAME LIMIT_S COMMAND...: runs COMMAND in the checkout under LIMIT_S seconds (then SIGTERM, and SIGKILL
# KILL_AFTER_S later), its output in OUT_DIR/NAME.log; returns its exit status (124 or 137: the time limit). With
# --plan it prints one line instead: NAME, LIMIT_S, KILL_AFTER_S and COMMAND, tab-separated.
limited() {
    local name=$1 limit=$2 command
    shift 2
    if [ "$PLAN" = 1 ]; then
        command="$*"
        printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$KILL_AFTER_S" "${command//$'\n'/ }"
        PLAN_TOTAL=$(( PLAN_TOTAL + limit + KILL_AFTER_S ))
        return 0
    fi
    say "+ $name (at most $limit s): $*"
    (cd "$REPO" && timeout -k "$KILL_AFTER_S" "$limit" "$@") > "$OUT_DIR/$name.log" 2>&1
}

# --- CUDA first: one line and exit status 3 without it (nothing written)
CUDA_CHECK='
import sys
try:
    import torch
except Exception as e:
    print(f"{sys.executable} cannot import torch ({type(e).__name__})")
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} (CUDA build {torch.version.cuda}) finds no CUDA device")
    sys.exit(1)
'
if [ "$PLAN" = 1 ]; then
    limited cuda_check 30 "$PY" -c "$CUDA_CHECK"
else
    why=$(timeout -k "$KILL_AFTER_S" 30 "$PY" -c "$CUDA_CHECK" 2> /dev/null)
    case $? in
        0) ;;
        124 | 137) why="$PY gave no answer within 30 s" ;;
        *) why=${why:-$PY did not run} ;;
    esac
    if [ -n "$why" ]; then
        echo "run_on_device.sh needs CUDA: $why; run it on a GPU machine (on a CPU: pytest -m 'not slow')" >&2
        exit 3
    fi
fi

if [ "$PLAN" = 1 ]; then
    OUT_DIR=${OUT_DIR:-OUT_DIR}
    WORK=WORK
else
    if [ -z "$OUT_DIR" ]; then
        echo "usage: bash tests/gpu/run_on_device.sh OUT_DIR (or set OUT); --plan lists the stages" >&2
        exit 2
    fi
    mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
    WORK=$(mktemp -d /tmp/capo-verl-device.XXXXXX)
    : > "$OUT_DIR/stages.tsv"
fi
SITE=$WORK/site
T0=$(date +%s)
export PYTHONUNBUFFERED=1

say() { [ "$PLAN" = 1 ] || echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT_DIR/run.log"; }

# done_stage NAME STATUS START: one line of stages.tsv (name, exit status, seconds)
done_stage() {
    [ "$PLAN" = 0 ] || return 0
    printf '%s\t%s\t%s\n' "$1" "$2" "$(( $(date +%s) - $3 ))" >> "$OUT_DIR/stages.tsv"
    say "  $1: exit status $2 ($(( $(date +%s) - $3 )) s)$([ "$2" = 124 ] || [ "$2" = 137 ] && echo ": its time limit")"
}

# stage NAME LIMIT_S COMMAND...: limited, then its line of stages.tsv
stage() {
    local start
    start=$(date +%s)
    limited "$@"
    done_stage "$1" $? "$start"
}

# --- 0. the source and the machine
stage env 20 "$PY" tests/gpu/device_record.py env "$OUT_DIR" --repo "$REPO"

# --- 1. the kit
if [ "$KIT" = none ]; then
    [ "$PLAN" = 1 ] || echo "none: verl and capo-verl from $PY's environment (KIT=none)" > "$OUT_DIR/kit.txt"
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
    stage kit 60 bash tests/gpu/lay_kit.sh "$KIT" "$SITE" "$PY"
    [ "$PLAN" = 1 ] || ls "$SITE" 2> /dev/null | sed -n 's/\.dist-info$//p' > "$OUT_DIR/kit.txt"
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi

stage preflight 45 "$PY" -c "
try:
    import verl
except ImportError as e:
    raise SystemExit(f'preflight: verl is not importable ({e}): lay the kit (KIT), or install verl 0.9.1 (KIT=none)')
from verl.trainer.ppo import ray_trainer
from capo_verl.compat import patching
print('verl', verl.__version__, 'from', verl.__file__)
print('capo-verl install error:', patching.INSTALL_ERROR)
assert patching.INSTALL_ERROR is None
assert getattr(ray_trainer.compute_advantage, '__wrapped_by_capo_verl__', False), (
    'the plugin did not load: with KIT=none install capo-verl (pip install -e .) for its verl.plugins entry point')
"

# --- 2. the CUDA tier
stage pytest_gpu 100 "$PY" -m pytest -m gpu tests/gpu -v -rA --durations=0 -p no:cacheprovider \
    --junitxml="$OUT_DIR/pytest_gpu.xml"

# --- 3. the actor update: the CPU reference (actor_update_check.py sets VERL_PLATFORM=cpu and hides CUDA), then
# CUDA on the same inputs, then the comparison
stage actor_update_cpu 75 "$PY" tests/gpu/actor_update_check.py run --device cpu --inputs "$WORK/actor_inputs" \
    --json "$OUT_DIR/actor_update_cpu.json"
stage actor_update_cuda 75 "$PY" tests/gpu/actor_update_check.py run --device cuda --inputs "$WORK/actor_inputs" \
    --json "$OUT_DIR/actor_update_cuda.json"
stage actor_update_compare 15 "$PY" tests/gpu/actor_update_check.py compare "$OUT_DIR/actor_update_cpu.json" \
    "$OUT_DIR/actor_update_cuda.json" --json "$OUT_DIR/actor_update_compare.json"

# --- 4. the estimators' times
stage gpu_tier 70 "$PY" benchmarks/gpu_tier.py --json "$OUT_DIR/gpu_tier.json"

# --- 5. the record (no line of stages.tsv: it is built from them); its summary also goes to summary.txt
say "total $(( $(date +%s) - T0 )) s before the record"
limited record 15 "$PY" tests/gpu/device_record.py build "$OUT_DIR" --repo "$REPO"
status=$?
if [ "$PLAN" = 1 ]; then
    echo "# at most $PLAN_TOTAL s in all: each stage's limit and its kill grace"
    exit 0
fi
cp "$OUT_DIR/record.log" "$OUT_DIR/summary.txt"
cat "$OUT_DIR/summary.txt"
rm -rf "$WORK"
exit "$status"
