#!/usr/bin/env bash
# Install the peers that bench/compare.py measures, each into its own virtual environment under
# bench/peers/.venvs/ (ignored by git; never a dependency of tensorgate), plus wrk and h2load
# for the load.
#
#   bash bench/peers/install.sh [triton] [mlserver] [litserve] [fastapi]    (default: all four)
#
# Every peer gets the same torch (2.13.0, CPU build, from the local wheel directory when the
# machine has one) so that the model and its kernels are the same for everyone.
#   triton    nvidia-pytriton: its wheel carries a real `tritonserver` binary and the Python
#             backend; we serve a Python-backend model repository with that binary, not
#             PyTriton's own Python API. numpy < 2: the backend's stub answers with empty
#             outputs under numpy 2 (seen on the GPU device, 2026-11-30).
#   mlserver  MLServer with a custom runtime (bench/peers/mlserver_runtime.py).
#   litserve  LitServe (bench/peers/litserve_app.py).
#   fastapi   FastAPI + uvicorn[standard], a hand-written baseline (bench/peers/fastapi_app.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venvs="${TENSORGATE_PEERS_DIR:-$here/.venvs}"
python="${PYTHON:-python3}"
if [ -d /opt/wheels ]; then
  torch_source=(--find-links /opt/wheels)
else
  torch_source=(--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple)
fi
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(triton mlserver litserve fastapi)

# wrk drives HTTP; h2load (nghttp2-client) drives gRPC for the servers that speak it
if ! command -v wrk >/dev/null || ! command -v h2load >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q wrk nghttp2-client >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q wrk nghttp2-client >/dev/null; }) \
      || echo "wrk/h2load: not installed (apt-get failed); compare.py falls back to its socket" \
              "client and skips the gRPC points"
  else
    echo "wrk/h2load: not installed (needs root and apt-get); compare.py falls back to its" \
         "socket client and skips the gRPC points"
  fi
fi

for peer in "${peers[@]}"; do
  case "$peer" in
    triton)   packages=(nvidia-pytriton==0.7.0 'numpy<2') ;;
    mlserver) packages=(mlserver 'uvloop<0.22') ;;  # uvloop 0.22 breaks MLServer 1.7's workers
    litserve) packages=(litserve numpy) ;;
    fastapi)  packages=(fastapi "uvicorn[standard]" numpy) ;;
    *) echo "unknown peer: $peer (triton, mlserver, litserve, fastapi)" >&2; exit 2 ;;
  esac
  target="$venvs/$peer"
  echo "== $peer → $target"
  [ -x "$target/bin/python" ] || "$python" -m venv "$target"
  "$target/bin/python" -m pip install -q --upgrade pip
  "$target/bin/python" -m pip install -q "${torch_source[@]}" torch==2.13.0
  "$target/bin/python" -m pip install -q "${torch_source[@]}" torch==2.13.0 "${packages[@]}"
  if [ "$peer" = triton ]; then  # the wheel's binaries lose their execute bit in some installers
    chmod +x "$target"/lib/python3*/site-packages/pytriton/tritonserver/bin/tritonserver \
             "$target"/lib/python3*/site-packages/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
  fi
  "$target/bin/python" -m pip freeze | grep -iE '^(torch|numpy|nvidia-pytriton|mlserver|litserve|fastapi|uvicorn)==' \
    | tr '\n' ' '; echo
  touch "$target/.installed"
done
