#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything (the CUDA kernels too when nvcc
# is installed, so a broken kernel never lands, even on machines without a GPU), and runs the
# CPU test suite with ctest. On a GPU machine, `ctest --test-dir build -L gpu` runs the GPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
CUDA=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then CUDA=ON; fi
export MT_CUDA=${MT_CUDA:-$CUDA}
export MT_WERROR=${MT_WERROR:-ON}
./scripts/build.sh
# On a fresh build CTest has no timings and starts the tests in declaration order, which can leave
# a 40 s test for the end of CI's 2-core run; tests/ctest_costs.txt (the slower tests' seconds,
# CTest's own cost-data format) makes it start the longest first. A local run's own timings win.
mkdir -p build/Testing/Temporary
[ -f build/Testing/Temporary/CTestCostData.txt ] || cp tests/ctest_costs.txt build/Testing/Temporary/CTestCostData.txt
# OMP_WAIT_POLICY=PASSIVE: ctest -j runs several tests at once and the parallel tests fork 2-4
# ranks of 2 OpenMP threads each, so on CI's 2 cores OpenMP's default spinning between regions
# burns the other processes' time slices (a TP=4 and a PP2xTP2 test: 20.4 s, 7.4 s passive). The
# policy changes no result; `megatron launch` sets it for ranks that share cores likewise
# (src/training/launch_env.h).
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} ctest --test-dir build -L cpu --output-on-failure -j"$(nproc)" --timeout 600
