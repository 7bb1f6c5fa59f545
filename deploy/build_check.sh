#!/usr/bin/env bash
# Build deploy/Dockerfile and check that the image serves as a Kubernetes pod would run it
# (deploy/kserve/servingruntime.yaml): as its unprivileged user, no capabilities, the root
# file system read-only and only /tmp writable. deploy/serve_check.py then waits for ready
# and checks answers over HTTP and gRPC; then, where this machine can compile one, an
# AOTInductor package served from a read-only /mnt (KServe's place for a model); then the
# SageMaker image (deploy/sagemaker/Dockerfile, built on it) started as SageMaker starts it
# (`serve`, a model in a read-only /opt/ml/model, SAGEMAKER_BIND_TO_PORT), its /ping and
# /invocations checked. Prints the images' sizes and their start-up times.
#
#   bash deploy/build_check.sh [build options ...]     # e.g. --build-arg TORCH_SOURCE=...
#   SKIP_BUILD=1 bash deploy/build_check.sh             # the image already built
#
# TOOL=docker|podman|buildah, default the first of them that works. buildah (no daemon)
# runs the image's root file system read-only in a chroot that this script mounts, so it
# needs root; docker and podman run the image itself (--read-only --tmpfs /tmp:exec). Ports:
# PORT (HTTP, default 18500), PORT+1 (gRPC) on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/tensorgate:check}
SAGEMAKER_IMAGE=${SAGEMAKER_IMAGE:-$IMAGE-sagemaker}
PORT=${PORT:-18500}
PYTHON=${PYTHON:-.venv/bin/python}

works() {
  case "$1" in
    docker|podman) command -v "$1" > /dev/null && "$1" info > /dev/null 2>&1 ;;
    buildah) command -v buildah > /dev/null ;;
    *) return 1 ;;
  esac
}
if [ -z "${TOOL:-}" ]; then
  for TOOL in docker podman buildah ""; do
    if [ -n "$TOOL" ] && works "$TOOL"; then break; fi
  done
fi
if [ -z "$TOOL" ] || ! works "$TOOL"; then
  echo "build_check: none of docker (with its daemon), podman, buildah works here" >&2
  exit 2
fi

if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: check the image IMAGE names as it is
  began=$(date +%s)
  if [ "$TOOL" = buildah ]; then
    buildah build -f deploy/Dockerfile -t "$IMAGE" "$@" .
  else
    "$TOOL" build -f deploy/Dockerfile -t "$IMAGE" "$@" .
  fi
  echo "built $IMAGE with $TOOL in $(( $(date +%s) - began )) s"
  if [ "$TOOL" = buildah ]; then
    buildah build -f deploy/sagemaker/Dockerfile --build-arg IMAGE="$IMAGE" \
      -t "$SAGEMAKER_IMAGE" deploy/sagemaker
  else
    "$TOOL" build -f deploy/sagemaker/Dockerfile --build-arg IMAGE="$IMAGE" \
      -t "$SAGEMAKER_IMAGE" deploy/sagemaker
  fi
fi
"$TOOL" images "$IMAGE"
"$TOOL" images "$SAGEMAKER_IMAGE"

cleanup=()
finish() {
  local i
  for (( i=${#cleanup[@]}-1; i>=0; i-- )); do eval "${cleanup[i]}" || true; done
}
trap finish EXIT

now() { python3 -c 'import time; print(time.time())'; }
# open_image IMAGE: with buildah, the image's root, read-only, with what a pod adds, in
# $root, and its user, environment, entrypoint and command
open_image() {
  image=$1
  opened_at=${#cleanup[@]}  # close_image undoes what comes after
  [ "$TOOL" = buildah ] || return 0
  container=$(buildah from "$image")
  cleanup+=("buildah rm $container > /dev/null")
  layers=$(buildah mount "$container")
  cleanup+=("buildah umount $container > /dev/null")
  root=$(mktemp -d)
  cleanup+=("rmdir $root")
  mount --bind "$layers" "$root"
  cleanup+=("umount $root")
  mount -o remount,bind,ro "$root"
  if touch "$root/.writable" 2> /dev/null; then
    echo "build_check: the image's root could not be made read-only" >&2
    exit 1
  fi
  mount -t tmpfs -o size=2g tmpfs "$root/tmp"
  cleanup+=("umount $root/tmp")
  mount --rbind /dev "$root/dev"
  cleanup+=("umount -R $root/dev")
  mount --bind /proc "$root/proc"
  cleanup+=("umount $root/proc")
  user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$image")
  mapfile -t environment < <(buildah inspect --format \
    '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d')
  mapfile -t entrypoint < <(buildah inspect --format \
    '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$image" | sed '/^$/d')
  mapfile -t command < <(buildah inspect --format \
    '{{range .OCIv1.Config.Cmd}}{{println .}}{{end}}' "$image" | sed '/^$/d')
}
close_image() {  # undo what came after open_image, before opening another
  local i
  for (( i=${#cleanup[@]}-1; i>=opened_at; i-- )); do eval "${cleanup[i]}" || true; done
  cleanup=("${cleanup[@]:0:opened_at}")
}

# start_image MODELS [ARG ...]: the open image's server, as a pod runs it, on PORT; MODELS (a
# host folder, or "") mounted read-only at MOUNT (/mnt, where KServe puts a model); ARGs
# replace its CMD. A SageMaker image (SAGEMAKER=1) listens on PORT for SageMaker's routes.
start_image() {
  local models=$1 mount_at=${MOUNT:-/mnt}
  shift
  started=$(now)
  if [ "$TOOL" = buildah ]; then
    if [ -n "$models" ]; then
      mount --bind "$models" "$root$mount_at"
      mount -o remount,bind,ro "$root$mount_at"
    fi
    # this host's network, so the loopback address and ports of our choosing
    env -i "${environment[@]}" HOME=/home/tensorgate TENSORGATE_HOST=127.0.0.1 \
      TENSORGATE_HTTP_PORT="$PORT" TENSORGATE_GRPC_PORT=$((PORT + 1)) \
      TENSORGATE_METRICS_PORT=$((PORT + 2)) SAGEMAKER_BIND_TO_PORT="$PORT" \
      chroot --userspec="$user" "$root" "${entrypoint[@]}" "${@:-${command[@]}}" &
    server=$!
    stop_now=("kill $server; wait $server" ${models:+"umount $root$mount_at"})
  else
    local name="tensorgate-check-$$-$RANDOM" ports
    if [ -n "${SAGEMAKER:-}" ]; then
      ports=(-p "127.0.0.1:$PORT:8080")
    else
      ports=(-p "127.0.0.1:$PORT:8000" -p "127.0.0.1:$((PORT + 1)):8001")
    fi
    # (a tmpfs is noexec unless told: AOTInductor packages run their code from /tmp)
    "$TOOL" run -d --name "$name" --read-only --tmpfs /tmp:exec --cap-drop ALL \
      --security-opt no-new-privileges "${ports[@]}" \
      ${models:+-v "$models:$mount_at:ro"} "$image" "$@" > /dev/null
    stop_now=("$TOOL rm -f $name > /dev/null")
  fi
  cleanup+=("${stop_now[@]}")
}

stop_image() {
  local i
  for i in "${stop_now[@]}"; do eval "$i" || true; done
  cleanup=("${cleanup[@]:0:${#cleanup[@]}-${#stop_now[@]}}")
}

open_image "$IMAGE"
start_image ""
"$PYTHON" deploy/serve_check.py --http-port "$PORT" --grpc-port $((PORT + 1)) \
  --started "$started"
stop_image

# An AOTInductor package from a read-only /mnt, as KServe mounts a model: it loads in the
# image, which has no C++ compiler. Making the package needs one here.
if command -v g++ > /dev/null || command -v c++ > /dev/null; then
  models=$(mktemp -d)
  cleanup+=("rm -rf $models")
  "$PYTHON" deploy/serve_check.py --make-package "$models" 2> /dev/null
  chmod -R a+rX "$models"
  start_image "$models" serve --model-repository /mnt
  "$PYTHON" deploy/serve_check.py --http-port "$PORT" --started "$started" \
    --package "$models"
  stop_image
else
  echo "build_check: no C++ compiler here to make an AOTInductor package: not checked"
fi

# The SageMaker image as SageMaker starts it: `docker run IMAGE serve`, the model unpacked
# into a read-only /opt/ml/model (here the built-in identity alone), the port in
# SAGEMAKER_BIND_TO_PORT (8080 unless an inference pipeline says otherwise)
close_image
open_image "$SAGEMAKER_IMAGE"
model=$(mktemp -d)
cleanup+=("rm -rf $model")
"$PYTHON" deploy/serve_check.py --make-sagemaker-model "$model"
chmod -R a+rX "$model"
SAGEMAKER=1 MOUNT=/opt/ml/model start_image "$model" serve
"$PYTHON" deploy/serve_check.py --sagemaker-port "$PORT" --started "$started"
stop_image
