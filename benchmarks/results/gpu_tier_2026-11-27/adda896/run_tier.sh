#!/bin/bash
# capo-verl's CUDA tier on a lent GPU machine without verl/Ray/vLLM (see prepare_src.py, stubs/ray)
set -u
export PYTHONUNBUFFERED=1
KIT=$PWD/.device-kit SRC=/tmp/capo-verl
T0=$(date +%s)
{ date -u; uname -a; nvidia-smi; nproc; free -g; python3 -c "import sys, torch, transformers, numpy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('transformers', transformers.__version__, 'numpy', numpy.__version__)"; } > $OUT/env.txt 2>&1
python3 -m pip list > $OUT/pip_list_before.txt 2>&1
python3 $KIT/prepare_src.py $SRC > $OUT/source_check.txt 2>&1 || { cat $OUT/source_check.txt; echo "source check failed"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $KIT/whl/*.whl > $OUT/pip_install.txt 2>&1 || { cat $OUT/pip_install.txt; exit 3; }
python3 -c "import importlib.metadata as m, sys; sys.exit(0 if tuple(map(int, m.version('typing_extensions').split('.')[:2])) >= (4, 16) else 1)" 2>/dev/null || { echo "typing_extensions too old for pydantic: installing 4.16.0" >> $OUT/pip_install.txt; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $KIT/whl_cond/*.whl >> $OUT/pip_install.txt 2>&1; }
ls /tmp/site >> $OUT/pip_install.txt
export PYTHONPATH=/tmp/site:$KIT/stubs:$KIT/dist:$SRC
cd $SRC
echo "+ preflight" >> $OUT/pip_install.txt
python3 $KIT/preflight.py >> $OUT/pip_install.txt 2>&1 || { echo "preflight failed"; tail -30 $OUT/pip_install.txt; }
echo "setup $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
set -o pipefail
echo "+ python3 -m pytest -m gpu tests/gpu -v -rA --durations=0 -p no:cacheprovider" > $OUT/pytest_gpu.log
timeout 300 python3 -m pytest -m gpu tests/gpu -v -rA --durations=0 -p no:cacheprovider 2>&1 | tee -a $OUT/pytest_gpu.log
echo "pytest exit status: $?" | tee -a $OUT/pytest_gpu.log
echo "+ python3 benchmarks/gpu_tier.py --json \$OUT/gpu_tier.json" > $OUT/gpu_tier.log
timeout 90 python3 benchmarks/gpu_tier.py --json $OUT/gpu_tier.json 2>&1 | tee -a $OUT/gpu_tier.log
echo "gpu_tier.py exit status: $?" | tee -a $OUT/gpu_tier.log
echo "total $(( $(date +%s) - T0 )) s" >> $OUT/env.txt
