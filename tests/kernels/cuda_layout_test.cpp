// CUDA layout kernels against a plain host reference: packed QKV rows <-> per-head tensors with
// RoPE fused in (both the 16-byte fast path and the per-element fallback), and heads <-> rows.
// Copies must be exact; rotated values within a bf16 rounding of the fp32 CPU rotation.
#ifdef MT_HAVE_CUDA

#include <array>
#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/layout.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rounded;

struct Shape5 {
  int64_t S, B, G, qpg, D, rot;
};

// Index of packed[row = s*B + b][(g*(qpg+2) + j)*D + d] and of the head tensors.
struct QkvIndex {
  Shape5 c;
  int64_t packed(int64_t s, int64_t b, int64_t g, int64_t j, int64_t d) const {
    return (s * c.B + b) * c.G * (c.qpg + 2) * c.D + (g * (c.qpg + 2) + j) * c.D + d;
  }
  int64_t q(int64_t s, int64_t b, int64_t h, int64_t d) const { return ((b * c.G * c.qpg + h) * c.S + s) * c.D + d; }
  int64_t kv(int64_t s, int64_t b, int64_t g, int64_t d) const { return ((b * c.G + g) * c.S + s) * c.D + d; }
};

void ref_split(const Shape5& c, const std::vector<float>& packed, std::vector<float>& q, std::vector<float>& k,
               std::vector<float>& v) {
  QkvIndex ix{c};
  for (int64_t s = 0; s < c.S; ++s)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t g = 0; g < c.G; ++g)
        for (int64_t j = 0; j < c.qpg + 2; ++j)
          for (int64_t d = 0; d < c.D; ++d) {
            const float x = packed[ix.packed(s, b, g, j, d)];
            if (j < c.qpg) q[ix.q(s, b, g * c.qpg + j, d)] = x;
            else (j == c.qpg ? k : v)[ix.kv(s, b, g, d)] = x;
          }
}

void ref_merge(const Shape5& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
               std::vector<float>& packed) {
  QkvIndex ix{c};
  for (int64_t s = 0; s < c.S; ++s)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t g = 0; g < c.G; ++g)
        for (int64_t j = 0; j < c.qpg + 2; ++j)
          for (int64_t d = 0; d < c.D; ++d)
            packed[ix.packed(s, b, g, j, d)] = j < c.qpg ? q[ix.q(s, b, g * c.qpg + j, d)]
                                                         : (j == c.qpg ? k : v)[ix.kv(s, b, g, d)];
}

// Every element within one bf16 rounding step of the fp32 reference (the kernel rounds once).
void expect_bf16_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (std::fabs(got[i] - want[i]) > std::ldexp(std::fabs(want[i]), -7) + 1e-6f) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
      ++bad;
    }
}

void check_qkv(const Shape5& c) {
  SCOPED_TRACE(testing::Message() << "S" << c.S << " B" << c.B << " G" << c.G << " qpg" << c.qpg << " D" << c.D
                                  << " rot" << c.rot);
  const int64_t nq = c.B * c.G * c.qpg * c.S * c.D, nkv = c.B * c.G * c.S * c.D, half = c.rot / 2;
  const auto packed = rounded(random_vec<float>(c.S * c.B * c.G * (c.qpg + 2) * c.D, 11));
  std::vector<float> cs(static_cast<size_t>(c.S * std::max<int64_t>(half, 1))), sn(cs.size());
  if (c.rot > 0) cpu::rope_tables(c.S, c.rot, 10000.0, cs.data(), sn.data());
  DeviceBuffer<float> gcs(cs), gsn(sn);
  const RopeArgs rope{c.rot > 0 ? gcs.get() : nullptr, c.rot > 0 ? gsn.get() : nullptr, c.rot};

  // Split: the copy, then the CPU rotation of q and k in fp32.
  std::vector<float> q(nq), k(nkv), v(nkv);
  ref_split(c, packed, q, k, v);
  const std::vector<float> v_exact = v;
  if (c.rot > 0) {
    cpu::rope_forward(q.data(), cs.data(), sn.data(), c.B, c.G * c.qpg, c.S, c.D, c.rot);
    cpu::rope_forward(k.data(), cs.data(), sn.data(), c.B, c.G, c.S, c.D, c.rot);
  }
  DeviceBuffer<bf16> gp(packed), gq(nq), gk(nkv), gv(nkv);
  qkv_split(gp.get(), gq.get(), gk.get(), gv.get(), c.S, c.B, c.G, c.qpg, c.D, rope, nullptr);
  EXPECT_EQ(gv.download(), v_exact);
  if (c.rot == 0) {
    EXPECT_EQ(gq.download(), q);
    EXPECT_EQ(gk.download(), k);
  } else {
    expect_bf16_close(gq.download(), q, "q");
    expect_bf16_close(gk.download(), k, "k");
  }

  // Merge of gradients: rotated back in fp32 on the CPU, then packed.
  auto dq = rounded(random_vec<float>(nq, 12)), dk = rounded(random_vec<float>(nkv, 13));
  const auto dv = rounded(random_vec<float>(nkv, 14));
  DeviceBuffer<bf16> gdq(dq), gdk(dk), gdv(dv), gdp(packed.size());
  if (c.rot > 0) {
    cpu::rope_backward(dq.data(), cs.data(), sn.data(), c.B, c.G * c.qpg, c.S, c.D, c.rot);
    cpu::rope_backward(dk.data(), cs.data(), sn.data(), c.B, c.G, c.S, c.D, c.rot);
  }
  std::vector<float> want(packed.size());
  ref_merge(c, dq, dk, dv, want);
  qkv_merge(gdq.get(), gdk.get(), gdv.get(), gdp.get(), c.S, c.B, c.G, c.qpg, c.D, rope, nullptr);
  if (c.rot == 0) EXPECT_EQ(gdp.download(), want);
  else expect_bf16_close(gdp.download(), want, "packed gradient");
}

TEST(GpuLayout, QkvSplitAndMergeWithFusedRopeMatchReference) {
  check_qkv({37, 3, 2, 3, 64, 64});   // 16-byte path, full rotation (Llama)
  check_qkv({37, 3, 2, 3, 64, 32});   // 16-byte path, partial rotation (--rotary-percent 0.5)
  check_qkv({37, 3, 2, 3, 64, 0});    // 16-byte path, no RoPE: exact copies
  check_qkv({19, 2, 1, 4, 128, 128}); // one group (MHA-like row), head dim 128
  check_qkv({21, 2, 2, 2, 6, 4});     // head dim not a multiple of 8: per-element fallback
  check_qkv({21, 2, 2, 2, 16, 8});    // RoPE half not a multiple of 8: fallback
}

TEST(GpuLayout, HeadsRowsRoundTripIsExact) {
  for (auto [S, B, H, D] : {std::array<int64_t, 4>{33, 3, 5, 64}, {17, 2, 3, 6}, {9, 4, 2, 128}}) {
    SCOPED_TRACE(testing::Message() << "S" << S << " B" << B << " H" << H << " D" << D);
    const auto heads = rounded(random_vec<float>(B * H * S * D, 21));
    std::vector<float> rows(heads.size());
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) rows[((s * B + b) * H + h) * D + d] = heads[((b * H + h) * S + s) * D + d];
    DeviceBuffer<bf16> gh(heads), gr(rows.size()), gh2(heads.size());
    heads_to_rows(gh.get(), gr.get(), S, B, H, D, nullptr);
    EXPECT_EQ(gr.download(), rows);
    rows_to_heads(gr.get(), gh2.get(), S, B, H, D, nullptr);
    EXPECT_EQ(gh2.download(), heads);
  }
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
