#pragma once
// What the FP8 GEMMs through cuBLASLt share (fp8_gemm.cpp: per-tensor scales; fp8_block_gemm.cpp:
// blockwise scales): one handle and workspace per process, the descriptors of one call, and the
// small conversions. Their own handle: the bf16 Gemm's tuning cache is keyed for bf16 calls only.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/fp8.h"

namespace mt::ops::gpu {

struct Fp8Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
};
// Made on first use; the compute stream orders every call.
Fp8Lt& fp8_lt();

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

// RAII for the descriptors of one call.
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

// Sets the preference handle of `x` to the workspace and the four pointers' alignments (cuBLASLt's
// A, B, C, D), then asks the heuristic for its best algorithm: false if it offers none.
bool fp8_lt_heuristic(LtDescs& x, const uint32_t align[4], cublasLtMatmulAlgo_t& algo);

}  // namespace mt::ops::gpu
