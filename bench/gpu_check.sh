#!/usr/bin/env bash
# One call on the GPU device, in steps (GPU_CHECK_STEPS, all by default):
#   tests    the CUDA tests (pipeline, pool, CUDA shared memory, GPU metrics)
#   engine   the engine benchmark on cuda
#   compare  issue 5's comparison on the GPU: tensorgate and Triton's Python backend over
#            HTTP, the CUDA-graph floor in process (needs .device/triton.tar.xz)
#   aoti     AOTInductor packages compiled for CUDA (tests/e2e/test_aoti_cuda.py)
#   startup  where a TorchScript model's start-up goes on the device, step by step and per
#            graph size, with TorchScript's fuser and optimiser on and off (gpu_startup.py)
#   profile  py-spy stacks of the server under load, with its per-batch statistics
#            (bench/gpu_profile.py; the stacks come back as $OUT/profiles.tar.gz), and the
#            same tree with two instances a model on the GPU; beside an earlier commit's,
#            in turn, when packed with BASELINE=REV (about 2 min)
# each as a short table; the whole log is $OUT/gpu_check.log. On an H200: tests 30 s, engine
# 60 s, compare 220 s, aoti 120 s, profile 50 s a server (three with a baseline: 150 s; the
# two-instance server is new since), startup (new) perhaps 40 s, plus 20 s to unpack:
# with a baseline, more than one call's 10 minutes, so two calls ('tests aoti startup
# profile', then 'engine compare').
#
# Here, first:  bash bench/peers/pack_device.sh     (fills .device/, about 63 MB;
#               TRITON=no leaves Triton out, 21 MB, for a run without `compare`)
# Then:         run(command="bash bench/gpu_check.sh", carry=[".device"], timeout_s=590)
#               or run(command="GPU_CHECK_STEPS='tests aoti' bash bench/gpu_check.sh", ...)
# Back here:    cp the returned compare-cuda.json to bench/results/, then
#               .venv/bin/python bench/compare.py --render-only --device cuda
#               (writes the GPU block of bench/RESULTS.md and the plots)
#
# Rehearsal on a CPU machine, on an interpreter holding, of what these steps import, only what
# the device's image holds (the device tool's KINDS.md, read 2026-12-05: torch, numpy, grpcio,
# protobuf, uvloop, ml_dtypes, packaging, urllib3, certifi, pytest, pluggy, iniconfig,
# pygments, hypothesis, sortedcontainers; with torch and numpy alone every step fails):
#   python3 -m venv /tmp/rehearsal/venv && /tmp/rehearsal/venv/bin/pip install \
#     --find-links /opt/wheels torch==2.13.0 numpy grpcio protobuf uvloop ml_dtypes packaging \
#     urllib3 certifi pytest pluggy iniconfig pygments hypothesis sortedcontainers
#   PY=3.11 BASELINE=7b7b517 DEVICE_DIR=/tmp/rehearsal/.device bash bench/peers/pack_device.sh
#   PATH=/tmp/rehearsal/venv/bin:$PATH GPU_CHECK_DEVICE=cpu DEVICE_DIR=/tmp/rehearsal/.device \
#     GPU_CHECK_STEPS='tests aoti startup profile' bash bench/gpu_check.sh
#   (and the same with GPU_CHECK_STEPS='engine compare'; 2026-12-05: both ran, ~90 s each)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/tg-gpu-check}"
device="${GPU_CHECK_DEVICE:-cuda}"
carried="${DEVICE_DIR:-.device}"
steps=" ${GPU_CHECK_STEPS:-tests engine compare aoti startup profile} "
step() { [[ "$steps" == *" $1 "* ]]; }
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
pip_target() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                 --upgrade --target "$1" "${@:2}"; }
if compgen -G "$carried/wheels/*.whl" > /dev/null; then
  pip_target /tmp/site "$carried"/wheels/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD/src:$PWD" PATH="/tmp/site/bin:$PATH"
else
  export PYTHONPATH="$PWD/src:$PWD"
fi
if [ -f "$carried/triton.tar.xz" ] && step compare; then
  mkdir -p /tmp/triton && tar -xJf "$carried/triton.tar.xz" -C /tmp/triton || exit 1
  pip_target /tmp/triton/site "$carried"/stub-wheels/*.whl || exit 1
  export TENSORGATE_TRITON_BUNDLE=/tmp/triton
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, numpy, grpc, uvloop; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'grpcio', grpc.__version__, 'uvloop', uvloop.__version__)"
if step tests; then
  echo "== CUDA tests"
  timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider -p no:logging tests/pipeline \
    tests/tensor tests/repository/test_weights.py tests/e2e/test_cuda_shared_memory.py \
    tests/e2e/test_gpu_metrics.py 2>&1 \
    | tee "$OUT/cuda_tests.log" | tail -15
fi
if step engine; then
  echo "== engine benchmark ($device)"
  timeout 90 python3 bench/engine_bench.py --device "$device" --placement none --quick 2>&1 \
    | tail -22
  cp "bench/results/engine_bench_$device.json" "$OUT/" 2>/dev/null || true
fi
if step compare; then
  echo "== compare ($device): tensorgate and Triton over HTTP"
  timeout 300 python3 bench/compare.py --device "$device" --servers tensorgate,triton \
    --no-results-md ${GPU_CHECK_DEVICE:+--quick} --json "$OUT/compare-$device.json" 2>&1 \
    | grep -v "^plot:"
fi
if step aoti; then
  echo "== AOTInductor packages compiled for $device"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging tests/e2e/test_aoti_cuda.py \
    2>&1 | tee "$OUT/aoti_cuda.log" | tail -15
fi
if step startup; then
  echo "== where a model's start-up goes ($device)"
  timeout 240 python3 bench/gpu_startup.py --device "$device" ${GPU_CHECK_DEVICE:+--model identity} \
    2>&1 | tail -14
fi
if step profile; then
  echo "== where the server's time goes ($device), py-spy"
  baseline=()  # BASELINE=REV pack_device.sh: that commit's server too, before and after
  [ -d "$carried/baseline/src" ] && baseline=(--baseline-src "$carried/baseline/src")
  # and this tree with two instances of identity and resnet50 on the GPU, beside one
  timeout 240 python3 bench/gpu_profile.py --out /tmp/tg-profiles --seconds 5 --instances 2 \
    "${baseline[@]}" 2>&1 | tail -40
  tar -czf "$OUT/profiles.tar.gz" -C /tmp tg-profiles 2>/dev/null || true
fi
ls "$OUT"
