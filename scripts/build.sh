#!/usr/bin/env bash
# Configures and builds into ./build. The CUDA backend is built only when nvcc is present and
# MT_CUDA is not 0 (the quickstart builds it only when a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=${MT_CUDA:-auto}
if [ "$CUDA" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then CUDA=ON; else CUDA=OFF; fi
fi
[ "$CUDA" = 1 ] && CUDA=ON
[ "$CUDA" = 0 ] && CUDA=OFF
BUILD_DIR=${MT_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMT_CUDA="$CUDA" \
  -DMT_WERROR="${MT_WERROR:-OFF}" ${MT_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" ${MT_BUILD_TARGETS:+--target $MT_BUILD_TARGETS}
