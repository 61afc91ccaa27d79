#!/usr/bin/env bash
# capo-verl's GPU checks in one command, for a GPU machine like the one lent to this project: one GPU; Python 3.12
# with a CUDA build of torch and transformers; no verl, no Ray, no vLLM, no package index (tests/gpu/README.md).
#
#   bash tests/gpu/run_on_device.sh [OUT_DIR]          (default: $OUT)
#
# 1. lays verl's kit ($KIT/whl/*.whl, made by tests/gpu/prepare_kit.sh; default $REPO/.device-kit) into a target
#    folder with pip --no-index --no-deps, a stand-in for Ray (tests/gpu/ray_standin.py) where no Ray is installed,
#    and a capo_verl dist-info whose entry points are pyproject.toml's, so `import verl` loads the plugin through its
#    verl.plugins entry point as an install does; the checkout itself goes on PYTHONPATH;
# 2. runs the CUDA tier: pytest -m gpu tests/gpu (junit xml with each test's measured differences);
# 3. runs one actor update of verl's FSDP engine on the CPU, then the same on CUDA, and compares them
#    (tests/gpu/actor_update_check.py);
# 4. times the estimators (benchmarks/gpu_tier.py);
# 5. writes record.json (tests/gpu/device_record.py) next to every log, and exits 0 only if every stage did.
#
# Sized for about 3 minutes on an H100/H200; each stage has its own time limit (10 minutes in all at the very
# most). Without CUDA it stops at once: one line naming CUDA, exit status 3.
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}

# --- 0. CUDA first: one line and exit status 3 without it
if ! why=$("$PY" - 2>/dev/null <<'EOF'
import sys
try:
    import torch
except Exception as e:
    print(f"{sys.executable} cannot import torch ({type(e).__name__})")
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} (CUDA build {torch.version.cuda}) finds no CUDA device")
    sys.exit(1)
EOF
); then
    echo "run_on_device.sh needs CUDA: ${why:-$PY did not run}; run it on a GPU machine (on a CPU: pytest -m 'not slow')" >&2
    exit 3
fi

OUT_DIR=${1:-${OUT:-}}
if [ -z "$OUT_DIR" ]; then
    echo "usage: bash tests/gpu/run_on_device.sh OUT_DIR (or set OUT)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
KIT=${KIT:-$REPO/.device-kit}
WORK=$(mktemp -d /tmp/capo-verl-device.XXXXXX)
SITE=$WORK/site
T0=$(date +%s)
: > "$OUT_DIR/stages.tsv"
export PYTHONUNBUFFERED=1

say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT_DIR/run.log"; }

# done_stage NAME STATUS START: one line of stages.tsv (name, exit status, seconds)
done_stage() {
    printf '%s\t%s\t%s\n' "$1" "$2" "$(( $(date +%s) - $3 ))" >> "$OUT_DIR/stages.tsv"
    say "  $1: exit status $2 ($(( $(date +%s) - $3 )) s)$([ "$2" = 124 ] && echo ": its time limit")"
}

# stage NAME LIMIT_S COMMAND...: runs COMMAND in the checkout, its output in OUT_DIR/NAME.log
stage() {
    local name=$1 limit=$2 start
    shift 2
    start=$(date +%s)
    say "+ $name (at most $limit s): $*"
    (cd "$REPO" && timeout "$limit" "$@") > "$OUT_DIR/$name.log" 2>&1
    done_stage "$name" $? "$start"
}

# --- 1. the machine, the source, the kit
"$PY" - > "$OUT_DIR/env.json" 2>> "$OUT_DIR/run.log" <<'EOF'
import json, os, platform, subprocess, sys
import torch
def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        return f"{cmd[0]}: {e!r}"
info = {"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
        "cpus": os.cpu_count(), "nvidia_smi_query": sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
        "--format=csv,noheader"), "uname": platform.platform()}
for name in ("transformers", "numpy", "pandas", "pytest", "safetensors", "tokenizers"):
    try:
        info[name] = __import__(name).__version__
    except Exception as e:
        info[name] = f"missing ({type(e).__name__})"
try:
    info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
except (ValueError, OSError):
    pass
print(json.dumps(info, indent=1))
EOF
{ date -u; nvidia-smi; "$PY" -m pip list 2>/dev/null; } > "$OUT_DIR/env.txt" 2>&1
"$PY" "$REPO/tests/gpu/device_record.py" blobs "$OUT_DIR" --repo "$REPO" 2>> "$OUT_DIR/run.log"

lay_kit() {
    set -e
    ls "$KIT"/whl/*.whl
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$KIT"/whl/*.whl
    if ! "$PY" -c "import ray" 2> /dev/null; then
        mkdir -p "$SITE/ray" && cp "$REPO/tests/gpu/ray_standin.py" "$SITE/ray/__init__.py"
        echo "ray: capo-verl's stand-in (tests/gpu/ray_standin.py), not Ray"
    fi
    "$PY" - "$REPO/pyproject.toml" "$SITE" <<'EOF'
import sys, tomllib
from pathlib import Path
project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
info = Path(sys.argv[2]) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
groups = project.get("entry-points", {})
(info / "entry_points.txt").write_text(
    "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items()))
(info / "top_level.txt").write_text("capo_verl\n")
print(f"{info.name}: entry points {sorted(groups)}, source on PYTHONPATH")
EOF
}
start=$(date +%s)
say "+ kit: $KIT/whl/*.whl into $SITE"
(lay_kit) > "$OUT_DIR/kit.log" 2>&1
done_stage kit $? "$start"
ls "$SITE" 2> /dev/null | sed -n 's/\.dist-info$//p' > "$OUT_DIR/kit.txt"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

stage preflight 60 "$PY" -c "
import verl
from verl.trainer.ppo import ray_trainer
from capo_verl.compat import patching
print('verl', verl.__version__, 'from', verl.__file__)
print('capo-verl install error:', patching.INSTALL_ERROR)
assert patching.INSTALL_ERROR is None
assert getattr(ray_trainer.compute_advantage, '__wrapped_by_capo_verl__', False), 'the plugin did not load'
"

# --- 2. the CUDA tier
stage pytest_gpu 150 "$PY" -m pytest -m gpu tests/gpu -v -rA --durations=0 -p no:cacheprovider \
    --junitxml="$OUT_DIR/pytest_gpu.xml"

# --- 3. the actor update: CPU reference, then CUDA, then the comparison
stage actor_update_cpu 75 "$PY" tests/gpu/actor_update_check.py run --device cpu --inputs "$WORK/actor_inputs" \
    --json "$OUT_DIR/actor_update_cpu.json"
stage actor_update_cuda 75 "$PY" tests/gpu/actor_update_check.py run --device cuda --inputs "$WORK/actor_inputs" \
    --json "$OUT_DIR/actor_update_cuda.json"
stage actor_update_compare 30 "$PY" tests/gpu/actor_update_check.py compare "$OUT_DIR/actor_update_cpu.json" \
    "$OUT_DIR/actor_update_cuda.json" --json "$OUT_DIR/actor_update_compare.json"

# --- 4. the estimators' times
stage gpu_tier 90 "$PY" benchmarks/gpu_tier.py --json "$OUT_DIR/gpu_tier.json"

# --- 5. the record
say "total $(( $(date +%s) - T0 )) s"
"$PY" "$REPO/tests/gpu/device_record.py" build "$OUT_DIR" --repo "$REPO" | tee "$OUT_DIR/summary.txt"
status=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$status"
