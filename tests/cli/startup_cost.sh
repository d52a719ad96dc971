#!/usr/bin/env bash
# Start-up stays cheap: the binary does not load cuBLASLt until a GPU GEMM needs it
# (src/kernels/cuda/cublaslt_loader.cpp). Linked directly, its load-time initialisation cost every
# process ~0.4 s: every CPU run, test and launched rank. The check is on what the dynamic loader
# maps, not on a timing.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
check "megatron does not link libcublasLt (it is opened on first use)" \
  bash -c "! readelf -d '$MEGATRON' | grep -q 'NEEDED.*libcublasLt'"
check "megatron --version maps no cuBLASLt" \
  bash -c "! LD_DEBUG=files '$MEGATRON' --version 2>&1 | grep -q 'libcublasLt'"
finish
