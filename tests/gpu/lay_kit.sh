#!/usr/bin/env bash
# The kit stage of tests/gpu/run_on_device.sh: lays verl's kit into a target folder that then goes first on
# PYTHONPATH, for a GPU machine without verl and without a package index (tests/gpu/README.md, "The kit").
#
#   bash tests/gpu/lay_kit.sh KIT SITE [PYTHON]        (default: $PYTHON, else python3)
#
# - pip install --no-index --no-deps --target SITE of KIT/whl/*.whl (made by tests/gpu/prepare_kit.sh);
# - a stand-in for Ray (tests/gpu/ray_standin.py, not Ray) in SITE/ray where the Python has no Ray;
# - a capo_verl dist-info in SITE with pyproject.toml's entry points, so that `import verl` loads the plugin through
#   its verl.plugins entry point as an install does (the checkout itself goes on PYTHONPATH).
# Prints the dist-infos laid; exit status 2 with one line when KIT/whl holds no wheel.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT=$1
SITE=$2
PY=${3:-${PYTHON:-python3}}

shopt -s nullglob
wheels=("$KIT"/whl/*.whl)
if [ ${#wheels[@]} = 0 ]; then
    echo "lay_kit.sh: no wheel in $KIT/whl: make the kit with tests/gpu/prepare_kit.sh (and carry it), or run with" \
        "KIT=none where verl 0.9.1 and capo-verl are installed" >&2
    exit 2
fi
printf '%s\n' "${wheels[@]}"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}"
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
