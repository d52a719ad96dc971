// ops::gpu::fp8_gemm: Hopper's FP8 tensor-core GEMM through cuBLASLt. Both operands K-major
// ("TN", the only FP8 layout Hopper's cuBLASLt runs), per-tensor scale_invs read from the device
// (A/B_SCALE_POINTER: no host sync), fp32 accumulation, bf16 or f32 output. Row-major D [M, N] =
// a [M, K] b[N, K]^T is column-major D^T [N, M] = b^T-as-stored x a, so cuBLASLt's A is b
// (transposed) and its B is a. A plan per shape, types and alignments (fp8_lt.h), its algorithm
// autotuned on the first call as the bf16 GEMMs' are (lt_tune.h). fp8_gemm_into_deferred
// (kernels/fp8_deferred.h): the same GEMM left running on a side stream.
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_lt.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/fp8_deferred.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {

namespace {

// A plan per GEMM shape and types, made once: the heuristic's query costs far more host time than
// the GEMM's launch, and a step runs the same few shapes over and over. The pointers' alignments
// are part of it: the heuristic assumes 256-byte aligned operands unless told otherwise, and views
// into the flat main-grad buffer or residual rows may be less aligned.
struct AlgoKey {
  int64_t m, n, k;
  int a_fmt, b_fmt, out, has_c;  // has_c: bit 0 a C operand, bit 1 fast accumulation
  uint32_t align[4];             // cuBLASLt's A, B, C, D
  bool operator<(const AlgoKey& o) const {
    return std::tie(m, n, k, a_fmt, b_fmt, out, has_c, align[0], align[1], align[2], align[3]) <
           std::tie(o.m, o.n, o.k, o.a_fmt, o.b_fmt, o.out, o.has_c, o.align[0], o.align[1], o.align[2], o.align[3]);
  }
};

// The descriptors of a per-tensor-scaled GEMM (the scale pointers are set per call).
void describe(LtDescs& x, int64_t M, int64_t N, int64_t K, Fp8Format a_format, Fp8Format b_format,
              cudaDataType_t dt, bool fast_accum) {
  check_lt(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "TRANSB");
  const int8_t fast = fast_accum ? 1 : 0;
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast), "FAST_ACCUM");
  // cuBLASLt's A is our b, its B our a.
  check_lt(cublasLtMatrixLayoutCreate(&x.a, fp8_type(b_format), static_cast<uint64_t>(K), static_cast<uint64_t>(N), K),
           "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&x.b, fp8_type(a_format), static_cast<uint64_t>(K), static_cast<uint64_t>(M), K),
           "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&x.d, dt, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N), "layout D");
}

}  // namespace

Tensor fp8_gemm(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b, Fp8Format b_format,
                const Tensor& b_scale_inv, DType out_dtype) {
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2, "fp8_gemm: [M, K] x [N, K], got {} and {}", a.shape_str(), b.shape_str());
  Tensor d = Tensor::empty({a.dim(0), b.dim(0)}, out_dtype, Device::CUDA);
  fp8_gemm_into(a, a_format, a_scale_inv, b, b_format, b_scale_inv, nullptr, d, false);
  return d;
}

namespace {

// fp8_gemm_into on stream s.
void gemm_on(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b, Fp8Format b_format,
             const Tensor& b_scale_inv, const Tensor* c, Tensor& d, bool fast_accum, cudaStream_t s) {
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
  const cudaDataType_t dt = out_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const void* cp = c ? c->raw() : d.raw();
  const int8_t fast = fast_accum ? 1 : 0;
  const AlgoKey key{M,
                    N,
                    K,
                    static_cast<int>(a_format),
                    static_cast<int>(b_format),
                    static_cast<int>(dt),
                    (c != nullptr) + 2 * fast,
                    {alignment_of(bp), alignment_of(ap), alignment_of(cp), alignment_of(d.raw())}};
  Fp8Lt& h = fp8_lt();
  std::lock_guard<std::mutex> lock(h.mu);
  // Never destroyed: the descriptors would outlive the dlopen'ed cuBLASLt at exit (cublaslt_loader.cpp).
  static auto* plans = new std::map<AlgoKey, std::unique_ptr<Fp8Plan>>;
  auto it = plans->find(key);
  if (it == plans->end()) {
    auto made = std::make_unique<Fp8Plan>();
    describe(made->x, M, N, K, a_format, b_format, dt, fast_accum);
    set_scale_pointers(made->x, asi, bsi);
    MT_CHECK(fp8_lt_candidates(*made, key.align), "fp8_gemm: cuBLASLt offers no FP8 algorithm for {} x {} x {}", M, N,
             K);
    it = plans->emplace(key, std::move(made)).first;
  }
  Fp8Plan& p = *it->second;
  set_scale_pointers(p.x, asi, bsi);
  fp8_lt_matmul(p, {ap, bp, c ? c->raw() : nullptr, d.raw(), M, N, K, c ? 1.f : 0.f, dt == CUDA_R_32F ? 4 : 2},
                "fp8 gemm", s);
}

}  // namespace

void fp8_gemm_into(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                   Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d, bool fast_accum) {
  gemm_on(a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, d, fast_accum, cuda::compute_stream());
}

// On a deferred side stream (cuda::SideStreams: it starts after the compute stream's work so far,
// and the compute stream waits for it at join_deferred_work), every operand kept allocated until
// then: the allocator orders reuse on the compute stream only.
void fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                            Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d) {
  {
    cuda::SideStreams side(cuda::compute_stream(), cuda::SideStreams::Join::Deferred);
    gemm_on(a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, d, false, side.next());
  }
  for (const Tensor* t : {&a, &a_scale_inv, &b, &b_scale_inv, c, static_cast<const Tensor*>(&d)})
    if (t) cuda::keep_until_joined(std::make_shared<const Tensor>(*t));
}

}  // namespace mt::ops::gpu
