# Shared launcher of scripts/run_*.sh (sourced, not run). Builds one `python -m verl.trainer.main_ppo` command
# from a config of configs/, the paths below and the caller's extra Hydra overrides, then runs it (or, with
# --dry-run, prints it and the resolved, validated config without starting anything).
#
# Variables (set them once, e.g. in ~/.bashrc; all optional):
#   CAPO_DATA_DIR     folder written by `capo-verl prepare-data`          (default: $HOME/data/capo)
#   CAPO_CKPT_DIR     checkpoints: $CAPO_CKPT_DIR/<project>/<experiment>   (default: $HOME/checkpoints/capo)
#   CAPO_MODEL_1_5B   model for the 1.5B runs, HF id or local folder       (default: Qwen/Qwen2.5-Math-1.5B)
#   CAPO_MODEL_7B     model for the 7B runs                                 (default: Qwen/Qwen2.5-Math-7B)
#   (a leading ~ of these paths is expanded; a path with a comma, =, a quote or non-ASCII is quoted for Hydra)
#   CAPO_VAL_SETS     validation sets, names of parquet files in CAPO_DATA_DIR
#                     (default: "deepscaler_val aime24 aime25"; add math500 amc23 minerva_math olympiadbench)
#   NNODES            nodes of the Ray cluster used by the run              (default: 1)
#   N_GPUS_PER_NODE   GPUs per node                                         (default: 8)
#   PYTHON            Python of the environment with capo-verl installed (default: the active environment's,
#                     i.e. $VIRTUAL_ENV/bin/python, $CONDA_PREFIX/bin/python or python3 on PATH, the first that
#                     can import verl; else this repository's .venv/bin/python, the CPU environment made by
#                     scripts/setup.sh). The first output line names the Python and why. The launcher stops with
#                     a message when that Python has no verl, or, on a host where nvidia-smi runs, when its torch
#                     is a CPU build.
#   WANDB_API_KEY, a netrc entry for api.wandb.ai (`wandb login`), WANDB_MODE=offline: any of them turns the
#                     wandb logger on (trainer.logger=[console,wandb]); without them the runs log to
#                     [console,file] (verl's file logger: $VERL_FILE_LOGGER_PATH, else ./<project>/<experiment>.jsonl).
#                     A trainer.logger=... override typed on the command line is kept as it is.
#   RAY_ADDRESS       set it (e.g. "auto") to run on an existing Ray cluster; unset: a local Ray instance
#
# Multi-node: start Ray on every node first (head: `ray start --head --port=6379`; others:
# `ray start --address=<head-ip>:6379`), with this repository's environment and the same paths (shared
# file system for CAPO_DATA_DIR and CAPO_CKPT_DIR) everywhere, then on the head node:
#   NNODES=2 RAY_ADDRESS=auto bash scripts/run_capo_qwen2.5_math_7b.sh

_CAPO_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_CAPO_REPO_DIR="$(cd "${_CAPO_SCRIPTS_DIR}/.." && pwd)"
CAPO_CONFIG_DIR="${_CAPO_REPO_DIR}/configs"

_capo_usage() {
    local script="scripts/$(basename "$0")"
    cat <<EOF
usage: bash ${script} [--dry-run] [-h|--help] [HYDRA_OVERRIDE ...]

Runs: python -m verl.trainer.main_ppo --config-path=${CAPO_CONFIG_DIR} --config-name=$1
under capo_verl.cpu.launch, with the model, data and checkpoint paths below.

options:
  --dry-run    print the exact command and the resolved config after verl's validate_config with capo-verl's
               checks (docs/configuration.md); start nothing. A refused value: one 'error: ...' line naming the
               key, the value, what is allowed and a fix, and exit status 2
  -h, --help   print this help and exit

HYDRA_OVERRIDE  every other argument, before or after the options, goes to verl's trainer unchanged: KEY=VALUE for
                a key of the config, +KEY=VALUE only for a key it lacks; CAPO configs also take ablation=<name>
                (configs/ablation/)

examples (docs/reproducing.md):
  bash ${script} --dry-run                          # the command and the resolved config
  bash ${script} trainer.test_freq=10 trainer.logger=[console,tensorboard]
  bash scripts/run_capo_qwen2.5_math_1.5b.sh ablation=tau1.0       # a single ablation
  NNODES=2 RAY_ADDRESS=auto bash ${script}          # on node 0 of a Ray cluster started by hand

Stopping: Ctrl-C or SIGTERM stops all of the run's processes within ~30 s (a second Ctrl-C at once), keeps the
checkpoints written, and removes its /dev/shm segments and its own Ray folder. Resume a stopped run from its last
checkpoint with the override trainer.resume_mode=auto.

Paths and cluster size come from CAPO_DATA_DIR, CAPO_CKPT_DIR, CAPO_MODEL_1_5B, CAPO_MODEL_7B,
CAPO_VAL_SETS, NNODES, N_GPUS_PER_NODE, RAY_ADDRESS, PYTHON (see scripts/_common.sh). The Python: PYTHON, else the
active environment's (VIRTUAL_ENV, CONDA_PREFIX, python3) when it has verl, else this checkout's .venv. The logger:
[console,wandb] where wandb can log in (WANDB_API_KEY, \`wandb login\`'s netrc entry, or WANDB_MODE=offline), else
[console,file]; a trainer.logger=... you type wins.
EOF
}

# capo_expand_home PATH: PATH with a leading "~" or "~/" replaced by $HOME (a variable set to "~/x" in quotes, or
# read from a file, keeps its "~": bash expands it only in an unquoted word). Anything else is printed unchanged.
capo_expand_home() {
    case "$1" in
        "~" | "~/"*) [ -n "${HOME:-}" ] || { echo "error: $1: HOME is not set; set HOME, or give the path without ~" >&2; exit 2; } ;;
    esac
    case "$1" in
        "~") printf '%s' "$HOME" ;;
        "~/"*) printf '%s' "${HOME}/${1#"~/"}" ;;
        *) printf '%s' "$1" ;;
    esac
}

# capo_need_home VAR ...: the folders VAR default to ones under $HOME; with HOME unset (a cron job, a container) and
# one of them unset too, one error line naming both, and status 2.
capo_need_home() {
    [ -n "${HOME:-}" ] && return 0
    local var
    for var in "$@"; do
        if [ -z "${!var:-}" ]; then
            echo "error: HOME is not set, and ${var} (a folder under \$HOME by default) is not either; set HOME, or set each of: $*" >&2
            exit 2
        fi
    done
}

# capo_hydra_value VALUE [SUFFIX]: VALUE (a path the user chose) as the value of a Hydra override, followed by SUFFIX
# (the script's own text, e.g. an interpolation ${trainer.experiment_name}, passed on as it is). A VALUE of letters,
# digits and / . _ - + @ % only is printed as it is; anything else (a comma, =, a quote, a space, a bracket, $,
# non-ASCII ...), which Hydra's override grammar would split or reject, is single-quoted, with each ' and each
# backslash before a ' (or before the closing quote) escaped by a backslash, and "${" escaped as "\${" so that
# OmegaConf reads it as text, not as an interpolation.
capo_hydra_value() {
    local value="$1" suffix="${2:-}" LC_ALL=C
    if [[ "$value" =~ ^[A-Za-z0-9/._+@%-]*$ ]]; then
        printf '%s%s' "$value" "$suffix"
        return
    fi
    local out="" i c run=""
    value="${value//\$\{/\\\$\{}"
    for ((i = 0; i < ${#value}; i++)); do
        c="${value:i:1}"
        if [ "$c" = "\\" ]; then
            run+="$c"
            continue
        fi
        if [ "$c" = "'" ]; then
            out+="${run}${run}\\'"  # the backslashes before a quote doubled, then the quote escaped
        else
            out+="${run}${c}"
        fi
        run=""
    done
    if [ -z "$suffix" ]; then
        out+="${run}${run}"  # before the closing quote
    else
        out+="${run}"
    fi
    printf "'%s%s'" "$out" "$suffix"
}

# _capo_has_verl PYTHON: status 0 when PYTHON runs and can import verl (checked without importing it, which takes
# seconds).
_capo_has_verl() {
    "$1" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("verl") is None)' 2>/dev/null
}

# _capo_cuda_host: status 0 where verl takes this host for an NVIDIA one: VERL_PLATFORM unset (or nvidia) and
# nvidia-smi (on PATH, else in /usr/bin, /usr/local/bin or /usr/local/cuda/bin) exits 0 within 10 s, as verl's
# verl/plugin/platform/platform_cuda.py is_platform_available(use_smi_check=True) runs it.
_capo_cuda_host() {
    local platform smi dir
    platform="$(printf '%s' "${VERL_PLATFORM:-}" | tr -d '[:space:]' | tr '[:upper:]' '[:lower:]')"
    case "$platform" in "" | nvidia) ;; *) return 1 ;; esac
    smi="$(command -v nvidia-smi 2>/dev/null)" || smi=""
    if [ -z "$smi" ]; then
        for dir in /usr/bin /usr/local/bin /usr/local/cuda/bin; do
            if [ -f "$dir/nvidia-smi" ] && [ -x "$dir/nvidia-smi" ]; then smi="$dir/nvidia-smi" && break; fi
        done
    fi
    [ -n "$smi" ] || return 1
    if command -v timeout >/dev/null 2>&1; then
        timeout 10 "$smi" >/dev/null 2>&1
    else
        "$smi" >/dev/null 2>&1
    fi
}

# _capo_python: sets _CAPO_PY (the Python to run) and _CAPO_PY_WHY (why that one), in this order: PYTHON when set;
# else the active environment's (VIRTUAL_ENV's, CONDA_PREFIX's, python3 on PATH: the first that can import verl);
# else this checkout's .venv/bin/python (scripts/setup.sh's CPU environment) when it can. Returns 2 with one message
# naming the fix when none can import verl, or, on a host with NVIDIA GPUs (_capo_cuda_host), when the chosen
# Python's torch is a CPU build (torch.version.cuda None: verl would fail on its first CUDA call).
_capo_python() {
    _CAPO_PY="" _CAPO_PY_WHY=""
    local python="" why="" candidate tried=""
    local -a active=() reasons=()
    if [ -n "${PYTHON:-}" ]; then
        python="$PYTHON" why="PYTHON is set"
        if ! _capo_has_verl "$python"; then
            {
                echo "error: no Python with verl: PYTHON='${python}' $(command -v "$python" >/dev/null 2>&1 && echo "cannot import verl" || echo "was not found")"
                echo "       set PYTHON to the Python of an environment with capo-verl installed (pip install -e '.[gpu]'),"
                echo "       or unset it to use the active environment's, or run 'bash scripts/setup.sh' once (CPU machines)"
            } >&2
            return 2
        fi
    else
        if [ -n "${VIRTUAL_ENV:-}" ]; then
            active+=("${VIRTUAL_ENV}/bin/python") && reasons+=("the active virtual environment (VIRTUAL_ENV=${VIRTUAL_ENV})")
        fi
        if [ -n "${CONDA_PREFIX:-}" ]; then
            active+=("${CONDA_PREFIX}/bin/python") && reasons+=("the active conda environment (CONDA_PREFIX=${CONDA_PREFIX})")
        fi
        if candidate="$(command -v python3 2>/dev/null)"; then
            active+=("$candidate") && reasons+=("python3 on PATH")
        fi
        local i
        for i in "${!active[@]}"; do
            if _capo_has_verl "${active[$i]}"; then
                python="${active[$i]}" why="${reasons[$i]}"
                break
            fi
            tried+="${tried:+, }${active[$i]}"
        done
        if [ -z "$python" ] && _capo_has_verl "${_CAPO_REPO_DIR}/.venv/bin/python"; then
            python="${_CAPO_REPO_DIR}/.venv/bin/python"
            why="this checkout's .venv, scripts/setup.sh's CPU environment: no active environment can import verl; tried: ${tried:-none found}"
        fi
        if [ -z "$python" ]; then
            {
                echo "error: no Python with verl: the active environment's (${tried:-none found}) cannot import verl and ${_CAPO_REPO_DIR}/.venv/bin/python $([ -x "${_CAPO_REPO_DIR}/.venv/bin/python" ] && echo "cannot import verl" || echo "was not found")"
                echo "       activate the environment with capo-verl installed (pip install -e '.[gpu]'), or set PYTHON to its Python,"
                echo "       or run 'bash scripts/setup.sh' once (it creates ${_CAPO_REPO_DIR}/.venv, a CPU environment)"
            } >&2
            return 2
        fi
    fi
    if _capo_cuda_host; then
        local version="" cuda="" hip="" seen="" driver=""
        read -r version cuda hip seen < <("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None), torch.cuda.is_available())' 2>/dev/null)
        if [ -n "$version" ] && [ "$cuda" = None ] && [ "$hip" = None ]; then
            echo "error: ${python} (${why}) has torch ${version}, a CPU build (torch.version.cuda is None), and this host has NVIDIA GPUs (nvidia-smi runs): set PYTHON=<the python of your CUDA environment with capo-verl, pip install -e '.[gpu]'> (docs/quickstart.md)" >&2
            return 2
        fi
        # a CUDA build that sees no GPU where nvidia-smi runs (CUDA_VISIBLE_DEVICES not emptied on purpose): a torch
        # built for a newer CUDA than the driver runs (PyPI's torch 2.11.0 is CUDA 13.0: driver 580 or newer)
        if [ "$cuda" != None ] && [ "$seen" = False ] && [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ]; then
            driver="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n 1 | grep -o '[0-9.]*$')"
            echo "error: ${python} (${why}) has torch ${version} built for CUDA ${cuda}, and it sees no GPU, while nvidia-smi runs (its driver runs CUDA ${driver:-unknown}): install the torch build for this driver (docs/quickstart.md, '1. Install': CUDA 12 or 13), or update the driver" >&2
            return 2
        fi
    fi
    _CAPO_PY="$python" _CAPO_PY_WHY="$why"
}

# prints "netrc: <where>" when the netrc file wandb reads has a password (API key) for wandb's host
_CAPO_NETRC_PROBE='import netrc, os, pathlib, urllib.parse
path = os.environ.get("NETRC")
home = [pathlib.Path(n).expanduser() for n in ("~/.netrc", "~/_netrc")]
path = pathlib.Path(path).expanduser() if path else next((p for p in home if p.exists()), None)
host = urllib.parse.urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
creds = netrc.netrc(path).authenticators(host) if host and path is not None and path.is_file() else None
if creds and creds[2]:
    print(f"netrc: a netrc entry for {host} in {path}")'

# _capo_wandb_login PYTHON: status 0, and the reason printed, where wandb can log in: WANDB_MODE=offline, or
# WANDB_API_KEY set, or a netrc entry for wandb's host (WANDB_BASE_URL's, default api.wandb.ai) in the file wandb
# reads (NETRC, else ~/.netrc, else ~/_netrc; wandb/sdk/lib/wbauth/wbnetrc.py), read by PYTHON's netrc module.
_capo_wandb_login() {
    if [ "${WANDB_MODE:-}" = offline ]; then
        echo "WANDB_MODE=offline" && return 0
    fi
    if [ -n "${WANDB_API_KEY:-}" ]; then
        echo "WANDB_API_KEY is set" && return 0
    fi
    local found
    found="$("$1" -c "$_CAPO_NETRC_PROBE" 2>/dev/null)" || found=""
    case "$found" in "netrc: "*) echo "${found#netrc: }" && return 0 ;; esac
    return 1
}

# _capo_dry_run PYTHON [--script-file PATH ...] -- COMMAND: print the config of COMMAND (python -m
# verl.trainer.main_ppo ...) composed like verl.trainer.main_ppo, after verl's validate_config with capo-verl's checks
# (capo_verl.cpu.launch --dry-run); a refused value is one line on stderr and status 2. A --script-file is a data file
# the script writes, or says it lacks, before a real run: not refused as missing.
_capo_dry_run() {
    local python="$1"
    shift
    "$python" - "$@" <<'PY'
import sys

from capo_verl.cpu.launch import main

sys.exit(main(["--dry-run", *sys.argv[1:]]))
PY
}

# capo_launch CONFIG_NAME MODEL_PATH [--dry-run] [HYDRA_OVERRIDE ...]
capo_launch() {
    local config_name="$1" model_path="$2"
    shift 2
    local dry_run=0 arg ablation="" logger_typed=""
    local -a overrides=()
    for arg in "$@"; do
        case "$arg" in
            --dry-run) dry_run=1 ;;
            -h | --help) _capo_usage "$config_name"; return 0 ;;
            -*)
                echo "error: unknown option $arg (Hydra overrides have no leading -); see: bash scripts/$(basename "$0") --help" >&2
                return 2
                ;;
            ablation=* | +ablation=* | ++ablation=*)
                if ! [ -f "${CAPO_CONFIG_DIR}/ablation/${arg#*=}.yaml" ]; then
                    echo "error: $arg: no configs/ablation/${arg#*=}.yaml; choose one of:" \
                         "$(cd "${CAPO_CONFIG_DIR}/ablation" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
                    return 2
                fi
                if [ -n "$ablation" ]; then
                    echo "error: $ablation and $arg: a run takes one ablation (Hydra would keep the last);" \
                         "run them one after another: bash scripts/run_ablations.sh --only ${ablation#*=},${arg#*=}" >&2
                    return 2
                fi
                ablation="$arg"
                overrides+=("$arg")
                ;;
            trainer.logger=* | +trainer.logger=* | ++trainer.logger=* | "~trainer.logger" | "~trainer.logger="*)
                logger_typed="$arg"
                overrides+=("$arg")
                ;;
            *) overrides+=("$arg") ;;
        esac
    done

    _capo_python || return 2
    local python="$_CAPO_PY"
    echo "# python: ${python} (${_CAPO_PY_WHY})"
    # the logger: wandb only where it can log in (else verl's tracking fails at the start), unless one was typed
    local -a logger=()
    local login
    if [ -n "$logger_typed" ]; then
        echo "# logger: ${logger_typed} as typed"
    elif login="$(_capo_wandb_login "$python")"; then
        logger=("trainer.logger=[console,wandb]")
        echo "# logger: [console,wandb] (wandb can log in: ${login})"
    else
        logger=("trainer.logger=[console,file]")
        echo "# logger: [console,file], no wandb (no WANDB_API_KEY, no netrc entry for api.wandb.ai, no WANDB_MODE=offline);" \
            "for wandb run \`wandb login\` (or set WANDB_API_KEY, or WANDB_MODE=offline), or type trainer.logger=[console,wandb]"
    fi
    local data_dir ckpt_dir
    capo_need_home CAPO_DATA_DIR CAPO_CKPT_DIR
    data_dir="$(capo_expand_home "${CAPO_DATA_DIR:-$HOME/data/capo}")"
    ckpt_dir="$(capo_expand_home "${CAPO_CKPT_DIR:-$HOME/checkpoints/capo}")"
    model_path="$(capo_expand_home "$model_path")"
    local val_sets="${CAPO_VAL_SETS:-deepscaler_val aime24 aime25}"
    local nnodes="${NNODES:-1}" gpus="${N_GPUS_PER_NODE:-8}"

    local train_file="${data_dir}/deepscaler_train.parquet"
    local -a val_files=() missing=()
    local name
    for name in $val_sets; do val_files+=("${data_dir}/${name}.parquet"); done
    if [ "${#val_files[@]}" -eq 0 ]; then
        echo "error: CAPO_VAL_SETS is empty; name at least one parquet file of ${data_dir}" >&2
        return 2
    fi
    local val_list="" file
    for file in "${val_files[@]}"; do val_list+="${val_list:+,}$(capo_hydra_value "$file")"; done
    val_list="[${val_list}]"
    for name in "$train_file" "${val_files[@]}"; do [ -f "$name" ] || missing+=("$name"); done

    local -a cmd=(
        "$python" -m verl.trainer.main_ppo
        "--config-path=${CAPO_CONFIG_DIR}"
        "--config-name=${config_name}"
        "actor_rollout_ref.model.path=$(capo_hydra_value "$model_path")"
        "data.train_files=$(capo_hydra_value "$train_file")"
        "data.val_files=${val_list}"
        "trainer.default_local_dir=$(capo_hydra_value "$ckpt_dir" '/${trainer.project_name}/${trainer.experiment_name}')"
        "trainer.nnodes=${nnodes}"
        "trainer.n_gpus_per_node=${gpus}"
        ${logger[@]+"${logger[@]}"}
        "${overrides[@]}"
    )

    if [ "$dry_run" -eq 1 ]; then
        echo "# command (dry run: nothing started):"
        printf '%q ' "${cmd[@]}"
        echo
        echo "# run under capo_verl.cpu.launch (Ctrl-C / SIGTERM stop all of it): ${python} -m capo_verl.cpu.launch -- <command>"
        if [ -n "${RAY_ADDRESS:-}" ]; then echo "# Ray: existing cluster at RAY_ADDRESS=${RAY_ADDRESS}"; fi
        for name in "${missing[@]}"; do
            echo "# warning: ${name} does not exist yet: run \`capo-verl prepare-data --out-dir ${data_dir}\`"
        done
        local -a known=()
        for name in "${missing[@]}"; do known+=(--script-file "$name"); done
        case "$model_path" in
            /* | ./* | ../* | "~"*)  # a local model folder named by CAPO_MODEL_*: warned about here, refused by a run
                if ! [ -f "${model_path}/config.json" ]; then
                    echo "# warning: model folder ${model_path} has no config.json (yet): a real run stops at its start"
                    known+=(--script-file "$model_path")
                fi
                ;;
        esac
        _capo_dry_run "$python" ${known[@]+"${known[@]}"} -- "${cmd[@]}"
        return $?
    fi

    if [ "${#missing[@]}" -gt 0 ]; then
        echo "error: missing data file(s): ${missing[*]}" >&2
        echo "       run \`capo-verl prepare-data --out-dir ${data_dir}\` (or set CAPO_DATA_DIR / CAPO_VAL_SETS)" >&2
        return 2
    fi
    export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
    echo "+ $(printf '%q ' "${cmd[@]}")"
    # capo_verl.cpu.launch: Ctrl-C / SIGTERM stop every process of the run (Ray's, vLLM's) within ~30 s, keep the
    # checkpoints written, and remove the run's /dev/shm segments; a second Ctrl-C kills it at once
    exec "$python" -m capo_verl.cpu.launch -- "${cmd[@]}"
}
