#pragma once
// What the FP8 GEMMs through cuBLASLt share (fp8_gemm.cpp: per-tensor scales; fp8_block_gemm.cpp:
// blockwise scales): one handle and workspace per process, a plan per GEMM shape (descriptors and
// the heuristic's candidates, autotuned as the bf16 Gemm's: lt_tune.h), and small conversions.
// Their own handle: the bf16 Gemm's plans are keyed for bf16 calls only.
//
// Tuning: on unless MT_FP8_GEMM_TUNE, or where that is unset MT_GEMM_TUNE, says 0 (verbose: a
// line per tuned shape, "fp8 gemm tune ..."). MT_FP8_GEMM_TUNE=0 with MT_GEMM_TUNE unset keeps
// the bf16 GEMMs tuned: the A/B switch of the FP8 tuning alone.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "kernels/cuda/lt_tune.h"

namespace mt::ops::gpu {

inline void check_lt(cublasStatus_t st, const char* what) {
  MT_CHECK(st == CUBLAS_STATUS_SUCCESS, "fp8_gemm: {} failed (cuBLAS status {})", what, static_cast<int>(st));
}

inline cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// The largest power of two (<= 256) dividing the address: what the heuristic may assume of a pointer.
inline uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

// RAII for the descriptors of one GEMM shape.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// One FP8 GEMM shape's state, made on its first call and kept for the process: the descriptors
// (each call sets its scale pointers, which change from call to call), the heuristic's
// candidates in its order ([0] its choice, the untuned default), and their tuning.
struct Fp8Plan {
  LtDescs x;
  std::vector<cublasLtMatmulAlgo_t> cands;  // each runs within the shared workspace
  cuda::lt_tune::State tune;
};

struct Fp8Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
  // A workspace per stream that runs FP8 GEMMs (the compute stream's is `workspace`; deferred
  // weight gradients run on side streams: ops::fp8_gemm_into_deferred), made on its first call.
  std::map<cudaStream_t, void*> stream_workspaces;
  void* workspace_for(cudaStream_t s);
  // Held for a whole call by both files: their plan maps, the tuner, the workspaces.
  std::mutex mu;
  cuda::lt_tune::Tuner tuner{cuda::lt_tune::Mode{}};
  int plans = 0;
  int64_t runs_off_default = 0;  // calls that ran a candidate other than the heuristic's first
};
// Made on first use; the compute stream orders every call.
Fp8Lt& fp8_lt();

// Points x at the GEMM's scale_invs (ours: a's and b's; cuBLASLt's A is our b, its B our a),
// read on the device when the GEMM runs.
inline void set_scale_pointers(LtDescs& x, const void* a_scale_inv, const void* b_scale_inv) {
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                          sizeof b_scale_inv),
           "A_SCALE_POINTER");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                          sizeof a_scale_inv),
           "B_SCALE_POINTER");
}

// Sets p.x.pref to the workspace and the four pointers' alignments (cuBLASLt's A, B, C, D), then
// keeps up to lt_tune::candidates() of the heuristic's algorithms in p.cands: false if it offers
// none, else counts the plan. The caller holds fp8_lt().mu.
bool fp8_lt_candidates(Fp8Plan& p, const uint32_t align[4]);

// One call, in our terms: row-major D [M, N] = a [M, K] . b [N, K]^T (+ beta C), which cuBLASLt
// runs as column-major D^T = b^T-as-stored x a (its A is our b, its B our a).
struct Fp8LtCall {
  const void* a;  // [M, K] codes
  const void* b;  // [N, K] codes
  const void* c;  // C: D itself (in-place accumulation), a separate read-only matrix, or D with beta 0
  void* d;
  int64_t M, N, K;
  float beta;
  int d_bytes;  // 2: bf16, 4: f32
};

// Runs the call on stream s with p's descriptors (scale pointers already set) and its chosen
// candidate, timing the candidates first on the plan's first call while tuning is on. The caller
// holds fp8_lt().mu.
void fp8_lt_matmul(Fp8Plan& p, const Fp8LtCall& call, const char* what, cudaStream_t s);

// ---- For tests and benchmarks (tests/kernels/fp8_gemm_tune_test.cpp, cuda_ops_bench).
struct Fp8TuneStats {
  int plans = 0, tuned = 0;
  int64_t runs_off_default = 0;
};
// Overrides the environment for every FP8 GEMM from now on. Off: each call runs the heuristic's
// first choice; plans tuned while on keep their choice for when it is on again.
void set_fp8_gemm_tuning(bool on);
Fp8TuneStats fp8_gemm_tune_stats();

}  // namespace mt::ops::gpu
