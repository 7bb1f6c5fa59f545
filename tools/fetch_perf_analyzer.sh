#!/usr/bin/env bash
# perf_analyzer, Triton's load generator (and Model Analyzer's), for the compatibility tests
# (tests/e2e/test_perf_analyzer.py) and for users who load-test with it: the binary from the
# tritonclient wheel that still ships it, the CUDA runtime library it links (from its PyPI
# wheel; no GPU is needed to run it) and libb64 (Debian's package, unpacked, no root). All
# under DEST (default .venv/perf_analyzer), with DEST/perf_analyzer a wrapper that finds
# the libraries. Nothing is installed system-wide; a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.venv/perf_analyzer}
PYTHON=${PYTHON:-.venv/bin/python}
TRITONCLIENT=2.50.0   # the last release whose wheel carries bin/perf_analyzer here
CUDART=12.9.79
if [ -x "$DEST/perf_analyzer" ] && "$DEST/perf_analyzer" --version >/dev/null 2>&1; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$DEST/bin" "$DEST/lib"
"$PYTHON" -m pip download -q --no-deps -d "$work" "tritonclient==$TRITONCLIENT" \
    "nvidia-cuda-runtime-cu12==$CUDART" 2>&1 | grep -v "is ignored" || true
"$PYTHON" -m zipfile -e "$work"/tritonclient-*.whl "$work/client" >/dev/null
"$PYTHON" -m zipfile -e "$work"/nvidia_cuda_runtime_cu12-*.whl "$work/cudart" >/dev/null
cp "$work"/client/tritonclient-*.data/data/bin/perf_analyzer "$DEST/bin/"
cp "$work"/cudart/nvidia/cuda_runtime/lib/libcudart.so.12 "$DEST/lib/"
fetch_b64() { (cd "$work" && apt-get download -q libb64-0d >/dev/null 2>&1); }
# a fresh machine may have no package lists yet: read them (as root) and try again
fetch_b64 || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null && fetch_b64; }
dpkg -x "$work"/libb64-0d_*.deb "$work/b64"
cp -L "$work"/b64/usr/lib/x86_64-linux-gnu/libb64.so.0d "$DEST/lib/"
chmod +x "$DEST/bin/perf_analyzer"
cat > "$DEST/perf_analyzer" <<'WRAP'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"
WRAP
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version
