// ops::gpu::fp8_gemm: Hopper's FP8 tensor-core GEMM through cuBLASLt. Both operands K-major
// ("TN", the only FP8 layout Hopper's cuBLASLt runs), per-tensor scale_invs read from the device
// (A/B_SCALE_POINTER: no host sync), fp32 accumulation, bf16 or f32 output. Row-major D [M, N] =
// a [M, K] b[N, K]^T is column-major D^T [N, M] = b^T-as-stored x a, so cuBLASLt's A is b
// (transposed) and its B is a. Its own handle and workspace: the bf16 Gemm's tuning cache is
// keyed for bf16 calls only.
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_lt.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {

namespace {

// The heuristic's algorithm per GEMM shape and types, asked for once: the query costs far more
// host time than the GEMM's launch, and a step runs the same few shapes over and over.
// The pointers' alignments are part of it: the heuristic assumes 256-byte aligned operands unless
// told otherwise, and views into the flat main-grad buffer or residual rows may be less aligned.
struct AlgoKey {
  int64_t m, n, k;
  int a_fmt, b_fmt, out, has_c;  // has_c: bit 0 a C operand, bit 1 fast accumulation
  uint32_t align[4];             // cuBLASLt's A, B, C, D
  bool operator<(const AlgoKey& o) const {
    return std::tie(m, n, k, a_fmt, b_fmt, out, has_c, align[0], align[1], align[2], align[3]) <
           std::tie(o.m, o.n, o.k, o.a_fmt, o.b_fmt, o.out, o.has_c, o.align[0], o.align[1], o.align[2], o.align[3]);
  }
};

}  // namespace

Fp8Lt& fp8_lt() {
  static Fp8Lt s;
  static std::once_flag once;
  std::call_once(once, [] {
    check_lt(cublasLtCreate(&s.handle), "cublasLtCreate");
    MT_CUDA_CHECK(cudaMalloc(&s.workspace, s.workspace_bytes));
  });
  return s;
}

bool fp8_lt_heuristic(LtDescs& x, const uint32_t align[4], cublasLtMatmulAlgo_t& algo) {
  Fp8Lt& h = fp8_lt();
  check_lt(cublasLtMatmulPreferenceCreate(&x.pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &h.workspace_bytes,
                                                sizeof h.workspace_bytes),
           "workspace preference");
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    check_lt(cublasLtMatmulPreferenceSetAttribute(x.pref, which[i], &align[i], sizeof align[i]), "alignment preference");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  // A refusal of the whole problem (an unsupported scale mode, type or shape) comes back as a status
  // or as no result; either way there is no algorithm.
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h.handle, x.op, x.a, x.b, x.d, x.d, x.pref, 1, &heur, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  algo = heur.algo;
  return true;
}

Tensor fp8_gemm(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b, Fp8Format b_format,
                const Tensor& b_scale_inv, DType out_dtype) {
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2, "fp8_gemm: [M, K] x [N, K], got {} and {}", a.shape_str(), b.shape_str());
  Tensor d = Tensor::empty({a.dim(0), b.dim(0)}, out_dtype, Device::CUDA);
  fp8_gemm_into(a, a_format, a_scale_inv, b, b_format, b_scale_inv, nullptr, d, false);
  return d;
}

void fp8_gemm_into(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                   Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d, bool fast_accum) {
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(1), "fp8_gemm: [M, K] x [N, K], got {} and {}",
           a.shape_str(), b.shape_str());
  MT_CHECK(a_format == Fp8Format::E4M3 || b_format == Fp8Format::E4M3, "fp8_gemm: cuBLASLt has no E5M2 x E5M2 GEMM");
  const DType out_dtype = d.dtype();
  MT_CHECK(out_dtype == DType::BF16 || out_dtype == DType::F32, "fp8_gemm: bf16 or f32 output, asked for {}",
           dtype_name(out_dtype));
  const int64_t M = a.dim(0), N = b.dim(0), K = a.dim(1);
  const void* ap = cuda_data<uint8_t>(a, DType::U8, M * K, "fp8_gemm (a)");
  const void* bp = cuda_data<uint8_t>(b, DType::U8, N * K, "fp8_gemm (b)");
  const float* asi = cuda_data<float>(a_scale_inv, DType::F32, 1, "fp8_gemm (a_scale_inv)");
  const float* bsi = cuda_data<float>(b_scale_inv, DType::F32, 1, "fp8_gemm (b_scale_inv)");
  check_cuda_tensor(d, out_dtype, "fp8_gemm (d)");
  MT_CHECK(d.numel() == M * N, "fp8_gemm: d of {} elements for a {} x {} product", d.numel(), M, N);
  if (c) {
    check_cuda_tensor(*c, out_dtype, "fp8_gemm (c)");
    MT_CHECK(c->numel() == M * N, "fp8_gemm: c of {} elements for a {} x {} product", c->numel(), M, N);
  }
  if (M == 0 || N == 0) return;
  MT_CHECK(K % 16 == 0 && N % 16 == 0, "fp8_gemm: cuBLASLt's FP8 GEMM needs K and N multiples of 16, got {} x {} x {}",
           M, N, K);
  Fp8Lt& h = fp8_lt();
  LtDescs x;
  check_lt(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "TRANSB");
  // cuBLASLt's A is our b, its B our a.
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &bsi, sizeof bsi), "A_SCALE");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &asi, sizeof asi), "B_SCALE");
  const int8_t fast = fast_accum ? 1 : 0;
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), "FAST_ACCUM");
  const cudaDataType_t dt = out_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  check_lt(cublasLtMatrixLayoutCreate(&x.a, fp8_type(b_format), static_cast<uint64_t>(K), static_cast<uint64_t>(N), K),
           "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&x.b, fp8_type(a_format), static_cast<uint64_t>(K), static_cast<uint64_t>(M), K),
           "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&x.d, dt, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N), "layout D");
  const void* cp = c ? c->raw() : d.raw();
  const AlgoKey key{M,
                    N,
                    K,
                    static_cast<int>(a_format),
                    static_cast<int>(b_format),
                    static_cast<int>(dt),
                    (c != nullptr) + 2 * fast,
                    {alignment_of(bp), alignment_of(ap), alignment_of(cp), alignment_of(d.raw())}};
  cublasLtMatmulAlgo_t algo;
  {
    static std::mutex mu;
    static std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
    std::lock_guard<std::mutex> lock(mu);
    auto it = algos.find(key);
    if (it == algos.end()) {
      cublasLtMatmulAlgo_t found;
      MT_CHECK(fp8_lt_heuristic(x, key.align, found), "fp8_gemm: cuBLASLt offers no FP8 algorithm for {} x {} x {}", M,
               N, K);
      it = algos.emplace(key, found).first;
    }
    algo = it->second;
  }
  const float alpha = 1.f, beta = c ? 1.f : 0.f;
  check_lt(cublasLtMatmul(h.handle, x.op, &alpha, bp, x.a, ap, x.b, &beta, cp, x.d, d.raw(), x.d, &algo, h.workspace,
                          h.workspace_bytes, cuda::compute_stream()),
           "cublasLtMatmul");
}

}  // namespace mt::ops::gpu
