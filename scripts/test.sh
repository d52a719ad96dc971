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
ctest --test-dir build -L cpu --output-on-failure -j"$(nproc)" --timeout 600
