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
# ccache, where installed, makes rebuilds after a clean or a branch switch cheap (MT_CCACHE=0:
# without). The precompiled headers (cmake/Precompile.cmake) stay cacheable with this sloppiness,
# set in the launcher so that a plain `ninja -C build` gets it too.
LAUNCHER=""
if [ "${MT_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  LAUNCHER="env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;ccache"
fi
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime  # for MT_CMAKE_ARGS' own launcher
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMT_CUDA="$CUDA" \
  -DMT_WERROR="${MT_WERROR:-OFF}" -DCMAKE_CXX_COMPILER_LAUNCHER="$LAUNCHER" \
  -DCMAKE_CUDA_COMPILER_LAUNCHER="$LAUNCHER" ${MT_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" ${MT_BUILD_TARGETS:+--target $MT_BUILD_TARGETS}
