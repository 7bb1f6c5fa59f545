#!/usr/bin/env bash
# Pack what the GPU device lacks into .device/ (git-ignored; carried by the device tool):
#
#   bash bench/peers/pack_device.sh          (needs `make bench-peers` for the Triton venv)
#   then, with a device:  run(command="bash bench/gpu_check.sh", carry=[".device"], timeout_s=590)
#
# The device has Python 3.12, torch, numpy 2, no package registry and a 64 MiB carry limit
# (the working tree counts too: all of this with Triton is 61 MB, the tree 4 MB).
#   .device/wheels/       cp312 wheels tensorgate needs there: httptools, hpack (our HTTP/2),
#                         orjson (JSON bodies), tritonclient (the protobuf schemas), the
#                         grpcio/protobuf its generated code asks for and python-rapidjson
#                         (its grpc module imports it); its HTTP client's geventhttpclient,
#                         gevent, greenlet, zope.event, zope.interface and brotli (the e2e
#                         tests' conftest imports it); py-spy (gpu_check.sh's profile step).
#                         ml_dtypes, packaging, certifi, urllib3, uvloop (the default loop,
#                         --loop auto), pytest and hypothesis are in the device's image
#                         already (the device tool's KINDS.md; carried, the call would
#                         exceed its 64 MiB with Triton)
#   .device/stub-wheels/  numpy 1.26 for Triton's Python-backend stub only (under numpy 2 it
#                         answers HTTP 200 with empty outputs)
#   .device/triton.tar.xz the nvidia-pytriton wheel's tritonserver: bin/, backends/, the 3.12
#                         stub and the bundled libraries minus the grafted libpython 3.13
#                         (25 MB with xz instead of the wheel's 53 MB). TRITON=no leaves it
#                         and the stub's wheels out (18 MB in all; no `compare` step then)
#   .device/baseline/src/ with BASELINE=REV, that commit's tensorgate package (1 MB): the
#                         profile step measures it beside this tree's, ratios in one run
#
# PY=3.11 DEVICE_DIR=/tmp/rehearsal/.device bash bench/peers/pack_device.sh packs for this
# machine's Python instead, to rehearse bench/gpu_check.sh here (see there) before spending
# device time.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${TENSORGATE_PEERS_DIR:-$root/bench/peers/.venvs}/triton"
out="${DEVICE_DIR:-$root/.device}"
py="${PY:-3.12}"
python="$root/.venv/bin/python"
[ -x "$python" ] || python=python3
site="$(echo "$venv"/lib/python3*/site-packages)"
triton="${TRITON:-yes}"
if [ "$triton" = yes ] && [ ! -x "$site/pytriton/tritonserver/bin/tritonserver" ]; then
  echo "no tritonserver in $venv: run bash bench/peers/install.sh triton first" >&2
  exit 1
fi
rm -rf "$out" && mkdir -p "$out/wheels" "$out/stub-wheels"
version() { "$root/.venv/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
download() {
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$@"
}
# the versions tensorgate is tested with here
download "$out/wheels" "httptools==$(version httptools)" "tritonclient==$(version tritonclient)" \
  "grpcio==$(version grpcio)" "protobuf==$(version protobuf)" \
  "python-rapidjson==$(version python-rapidjson)" "hpack==$(version hpack)" \
  "orjson==$(version orjson)" \
  "geventhttpclient==$(version geventhttpclient)" "gevent==$(version gevent)" \
  "greenlet==$(version greenlet)" "zope.event==$(version zope.event)" \
  "zope.interface==$(version zope.interface)" "brotli==$(version brotli)" py-spy==0.4.3
if [ -n "${BASELINE:-}" ]; then
  mkdir -p "$out/baseline" && git -C "$root" archive "$BASELINE" src/tensorgate \
    | tar -x -C "$out/baseline"
fi
[ "$triton" = yes ] || { du -shc "$out"/*; exit 0; }
download "$out/stub-wheels" numpy==1.26.4
(cd "$site" && tar --exclude='libpython3*' -cf - pytriton/tritonserver/bin \
   pytriton/tritonserver/backends "pytriton/tritonserver/python_backend_stubs/$py" \
   nvidia_pytriton.libs) | xz -T0 -9 > "$out/triton.tar.xz"
du -shc "$out"/*
