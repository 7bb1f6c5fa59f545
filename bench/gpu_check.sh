#!/usr/bin/env bash
# One call on the GPU device: the CUDA tests, then the engine benchmark on cuda, as a short table.
#
# The device lacks tritonclient (config.pbtxt's schema) and may have an older protobuf; carry
# them as wheels for Python 3.12 in .whl/ (see the device README), e.g. here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl tritonclient==2.73.0 protobuf==6.33.6
# then: run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD/src:$PWD"
else
  export PYTHONPATH="$PWD/src:$PWD"
fi
OUT="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "== CUDA tests"
timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tail -15
echo "== engine benchmark (cuda)"
timeout 240 python3 bench/engine_bench.py --device cuda --placement none ${QUICK:+--quick} 2>&1 | tail -16
cp bench/results/engine_bench_cuda.json "$OUT/" 2>/dev/null || true
