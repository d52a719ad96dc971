// ops::gpu::fp8_block_gemm_into: Hopper's FP8 GEMM with DeepSeek-V3's block scaling through
// cuBLASLt (CUDA 12.9+): the A/B_SCALE_MODEs VEC128_32F (a scale per 1x128 run along K) and
// BLK128x128_32F (per 128x128 block), the scale tensors in the layouts of kernels/fp8_blocks.h,
// read from the device. As fp8_gemm.cpp: both operands K-major ("TN"), row-major D [M, N] =
// a [M, K] b [N, K]^T computed as column-major D^T = b^T-as-stored x a, so cuBLASLt's A is our b.
// The scales are applied per 128-wide K block inside the kernel, with fp32 accumulation; cuBLASLt
// offers no fast accumulation here (Hopper's block-scaled kernels promote every K block).
// A plan per GEMM and alignments (fp8_lt.h), autotuned on its first call (lt_tune.h).
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_lt.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {

namespace {

int32_t scale_mode(Fp8Tiles t) {
  return t == Fp8Tiles::Rows1x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                  : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

cudaDataType_t out_type(DType d) { return d == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// The descriptors of g, scale pointers included (the heuristic may look at them being set).
void describe(LtDescs& x, const Fp8BlockGemm& g, const void* a_scale_inv, const void* b_scale_inv) {
  check_lt(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "TRANSB");
  // cuBLASLt's A is our b, its B our a.
  const int32_t am = scale_mode(g.b_tiles), bm = scale_mode(g.a_tiles);
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am), "A_SCALE_MODE");
  check_lt(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm), "B_SCALE_MODE");
  set_scale_pointers(x, a_scale_inv, b_scale_inv);
  const auto K = static_cast<uint64_t>(g.k), M = static_cast<uint64_t>(g.m), N = static_cast<uint64_t>(g.n);
  check_lt(cublasLtMatrixLayoutCreate(&x.a, fp8_type(g.b_format), K, N, g.k), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&x.b, fp8_type(g.a_format), K, M, g.k), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&x.d, out_type(g.out), N, M, g.n), "layout D");
}

// The plan per GEMM and pointer alignments (cuBLASLt's A, B, C, D), made once (see fp8_gemm.cpp);
// null: cuBLASLt runs no such GEMM here (remembered too). The caller holds fp8_lt().mu.
struct Key {
  int64_t m, n, k;
  int a_fmt, b_fmt, a_tiles, b_tiles, out, has_c;
  uint32_t align[4];
  bool operator<(const Key& o) const {
    return std::tie(m, n, k, a_fmt, b_fmt, a_tiles, b_tiles, out, has_c, align[0], align[1], align[2], align[3]) <
           std::tie(o.m, o.n, o.k, o.a_fmt, o.b_fmt, o.a_tiles, o.b_tiles, o.out, o.has_c, o.align[0], o.align[1],
                    o.align[2], o.align[3]);
  }
};

Fp8Plan* plan_for(const Fp8BlockGemm& g, const uint32_t align[4], const void* a_scale_inv, const void* b_scale_inv) {
  const Key key{g.m,
                g.n,
                g.k,
                static_cast<int>(g.a_format),
                static_cast<int>(g.b_format),
                static_cast<int>(g.a_tiles),
                static_cast<int>(g.b_tiles),
                static_cast<int>(g.out),
                g.has_c,
                {align[0], align[1], align[2], align[3]}};
  // Never destroyed: the descriptors would outlive the dlopen'ed cuBLASLt at exit (cublaslt_loader.cpp).
  static auto* plans = new std::map<Key, std::unique_ptr<Fp8Plan>>;
  auto it = plans->find(key);
  if (it == plans->end()) {
    auto made = std::make_unique<Fp8Plan>();
    describe(made->x, g, a_scale_inv, b_scale_inv);
    if (!fp8_lt_candidates(*made, key.align)) made.reset();
    it = plans->emplace(key, std::move(made)).first;
  }
  return it->second.get();
}

// Stand-ins for the scale pointers of a query without tensors (aligned as any allocation).
const void* placeholder_scales() {
  static void* p = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { MT_CUDA_CHECK(cudaMalloc(&p, 256)); });
  return p;
}

// What cuBLASLt's block-scaled FP8 GEMMs take at all: not two 128x128-tiled operands, bf16 or f32
// out, whole 128-wide K blocks, 16-byte multiples elsewhere.
bool takes(const Fp8BlockGemm& g) {
  return !(g.a_tiles == Fp8Tiles::Blocks128x128 && g.b_tiles == Fp8Tiles::Blocks128x128) &&
         (g.out == DType::BF16 || g.out == DType::F32) && g.k % fp8::kBlockTile == 0 && g.n % 16 == 0 &&
         g.m % 16 == 0;
}

}  // namespace

bool fp8_block_gemm_supported(Device /*device*/, const Fp8BlockGemm& g) {
  if (!takes(g)) return false;
  const uint32_t aligned[4] = {256, 256, 256, 256};  // fresh allocations
  const void* scales = placeholder_scales();
  std::lock_guard<std::mutex> lock(fp8_lt().mu);
  return plan_for(g, aligned, scales, scales) != nullptr;
}

void fp8_block_gemm_into(const Tensor& a, Fp8Format a_format, Fp8Tiles a_tiles, const Tensor& a_scale_inv,
                         const Tensor& b, Fp8Format b_format, Fp8Tiles b_tiles, const Tensor& b_scale_inv,
                         const Tensor* c, Tensor& d) {
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(1), "fp8_block_gemm: [M, K] x [N, K], got {} and {}",
           a.shape_str(), b.shape_str());
  const Fp8BlockGemm g{a.dim(0), b.dim(0), a.dim(1), a_format, b_format, a_tiles, b_tiles, d.dtype(), c != nullptr};
  const void* ap = cuda_data<uint8_t>(a, DType::U8, g.m * g.k, "fp8_block_gemm (a)");
  const void* bp = cuda_data<uint8_t>(b, DType::U8, g.n * g.k, "fp8_block_gemm (b)");
  const float* asi =
      cuda_data<float>(a_scale_inv, DType::F32, fp8::tile_scales(a_tiles, g.m, g.k), "fp8_block_gemm (a_scale_inv)");
  const float* bsi =
      cuda_data<float>(b_scale_inv, DType::F32, fp8::tile_scales(b_tiles, g.n, g.k), "fp8_block_gemm (b_scale_inv)");
  check_cuda_tensor(d, g.out, "fp8_block_gemm (d)");
  MT_CHECK(d.numel() == g.m * g.n, "fp8_block_gemm: d of {} elements for a {} x {} product", d.numel(), g.m, g.n);
  if (c) {
    check_cuda_tensor(*c, g.out, "fp8_block_gemm (c)");
    MT_CHECK(c->numel() == g.m * g.n, "fp8_block_gemm: c of {} elements for a {} x {} product", c->numel(), g.m, g.n);
  }
  if (g.m == 0 || g.n == 0) return;
  const void* cp = c ? c->raw() : d.raw();
  const uint32_t align[4] = {alignment_of(bp), alignment_of(ap), alignment_of(cp), alignment_of(d.raw())};
  std::lock_guard<std::mutex> lock(fp8_lt().mu);
  Fp8Plan* p = takes(g) ? plan_for(g, align, asi, bsi) : nullptr;
  MT_CHECK(p != nullptr,
           "fp8_block_gemm: cuBLASLt offers no block-scaled FP8 algorithm for {} x {} x {} ({} x {}, {} tiles x {} "
           "tiles, {} out{}; alignments {}/{}/{}/{}): this needs Hopper and CUDA 12.9 or newer",
           g.m, g.n, g.k, fp8_format_name(a_format), fp8_format_name(b_format),
           a_tiles == Fp8Tiles::Rows1x128 ? "1x128" : "128x128", b_tiles == Fp8Tiles::Rows1x128 ? "1x128" : "128x128",
           dtype_name(g.out), c ? " + C" : "", align[0], align[1], align[2], align[3]);
  set_scale_pointers(p->x, asi, bsi);
  fp8_lt_matmul(*p, {ap, bp, c ? c->raw() : nullptr, d.raw(), g.m, g.n, g.k, c ? 1.f : 0.f, g.out == DType::F32 ? 4 : 2},
                "fp8 block gemm", cuda::compute_stream());
}

}  // namespace mt::ops::gpu
