// The ragged cuDNN graph's per-call inputs for packed documents (attention_cudnn.h):
// document lengths and element offsets derived on the device from cu_seqlens (no host copy,
// stream order kept), and the Tokens layout's transposes.
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

// One thread per document slot. Documents never cross sample borders (AttentionShape), so
// document i of the batch starts in sample b = cu[i] / S at local row cu[i] - b*S. Heads: its
// rows of head h sit at ((b*H + h)*S + local)*D, which the graph reaches as offset + h*(S*D).
// Tokens: at (cu[i]*H + h)*D, offset + h*D.
__global__ void varlen_descriptors_kernel(const int32_t* __restrict__ cu, int nseg, int docs, int S, int Hq, int Hkv,
                                          int D, int B, bool tokens, int32_t* __restrict__ out) {
  int32_t* len = out;
  int32_t* q_off = out + docs;
  int32_t* k_off = q_off + docs + 1;
  int32_t* st_off = k_off + docs + 1;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= docs; i += gridDim.x * blockDim.x) {
    // Slots past the real documents (and the closing entry) point at the end with length 0.
    int64_t b = B, local = 0, n = 0;
    if (i < nseg) {
      const int64_t start = cu[i];
      b = start / S;
      local = start - b * S;
      n = cu[i + 1] - start;
    }
    if (i < docs) len[i] = static_cast<int32_t>(n);
    const int64_t tok = b * S + local;
    q_off[i] = static_cast<int32_t>(tokens ? tok * Hq * D : (b * Hq * S + local) * D);
    k_off[i] = static_cast<int32_t>(tokens ? tok * Hkv * D : (b * Hkv * S + local) * D);
    st_off[i] = static_cast<int32_t>(tokens ? tok * Hq : b * Hq * S + local);
  }
}

// [B, H, S, X] <-> [B, S, H, X] in units U (X units per row); i walks the source.
template <typename U>
__global__ void transpose_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t B, int64_t H, int64_t S,
                                 int64_t X, bool to_tokens) {
  const int64_t n = B * H * S * X;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = i % X;
    int64_t r = i / X;
    if (to_tokens) {  // src (b, h, s)
      const int64_t s = r % S;
      r /= S;
      const int64_t h = r % H, b = r / H;
      dst[((b * S + s) * H + h) * X + x] = src[i];
    } else {  // src (b, s, h)
      const int64_t h = r % H;
      r /= H;
      const int64_t s = r % S, b = r / S;
      dst[((b * H + h) * S + s) * X + x] = src[i];
    }
  }
}

}  // namespace

void varlen_descriptors(const ops::AttentionShape& p, int64_t docs, VarlenLayout layout, int32_t* out, cudaStream_t s) {
  MT_CHECK(p.cu_seqlens && p.num_segments <= docs && p.B * std::max(p.Hq, p.Hkv) * p.S * p.D < (int64_t{1} << 31),
           "varlen_descriptors: {} documents in {} slots, B*Hq*S*D = {}", p.num_segments, docs,
           p.B * p.Hq * p.S * p.D);
  const int threads = 256, blocks = static_cast<int>((docs + threads) / threads);
  varlen_descriptors_kernel<<<blocks, threads, 0, s>>>(
      p.cu_seqlens, static_cast<int>(p.num_segments), static_cast<int>(docs), static_cast<int>(p.S),
      static_cast<int>(p.Hq), static_cast<int>(p.Hkv), static_cast<int>(p.D), static_cast<int>(p.B),
      layout == VarlenLayout::Tokens, out);
  MT_CUDA_LAUNCH_CHECK();
}

void varlen_transpose(const void* src, void* dst, int64_t B, int64_t H, int64_t S, int64_t row_bytes, bool to_tokens,
                      cudaStream_t s) {
  MT_CHECK(row_bytes > 0 && row_bytes % 4 == 0, "varlen_transpose: rows of {} bytes", row_bytes);
  const int threads = 256;
  auto launch = [&](auto unit) {
    using U = decltype(unit);
    const int64_t X = row_bytes / static_cast<int64_t>(sizeof(U)), n = B * H * S * X;
    if (n == 0) return;
    const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65536));
    transpose_kernel<U><<<blocks, threads, 0, s>>>(static_cast<const U*>(src), static_cast<U*>(dst), B, H, S, X,
                                                   to_tokens);
  };
  // 16-byte units where the rows allow (bf16 heads of D % 8 == 0), else 4-byte ones.
  if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    launch(uint4{});
  else
    launch(uint32_t{});
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
