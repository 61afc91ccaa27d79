#!/usr/bin/env bash
# Assembles the kit that tests/gpu/run_on_device.sh lays on a GPU machine without verl or a package index:
# DEST/whl/ (default .device-kit/, which git ignores) with
#   - the wheels of ../shared/gpu/whl (verl 0.9.1, omegaconf, hydra-core, antlr4, codetiming, cloudpickle, pyvers,
#     orjson, python-dateutil, tensordict; CPython 3.12), less pandas unless KIT_WITH_PANDAS=1 (the machine has
#     pandas, and its 12 MB would crowd the 64 MiB a device call carries);
#   - the 12 packages that verl.trainer.ppo.ray_trainer (where compute_advantage lives) and verl's rollout config
#     import and that machine lacks, downloaded for CPython 3.12 manylinux x86-64 at the versions tested here.
# Run it here (the package index and ../shared are reachable), then send DEST along with the checkout
# (tests/gpu/README.md).
#
#   bash tests/gpu/prepare_kit.sh [DEST]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARED=${SHARED:-$REPO/../shared/gpu/whl}
DEST=${1:-$REPO/.device-kit}
PY=${PYTHON:-$REPO/.venv/bin/python}
EXTRA=(torchdata==0.11.0 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 pydantic==2.14.4 pydantic-core==2.50.5
       typing-inspection==0.4.5 annotated-types==0.8.0 cachetools==8.0.2 uvicorn==0.55.0 fastapi==0.136.3
       starlette==1.10.0)

[ -d "$SHARED" ] || { echo "prepare_kit.sh: $SHARED is missing (the shared kit of verl's wheels)" >&2; exit 2; }
mkdir -p "$DEST/whl"
for wheel in "$SHARED"/*.whl; do
    case $(basename "$wheel") in
        pandas-*) [ "${KIT_WITH_PANDAS:-0}" = 1 ] || continue ;;
    esac
    cp "$wheel" "$DEST/whl/"
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" "${EXTRA[@]}"
chmod -R u+w "$DEST"
echo "kit: $(ls "$DEST"/whl/*.whl | wc -l) wheels, $(du -sh "$DEST/whl" | cut -f1), in $DEST/whl"
