// The fused softmax cross-entropy (forward and backward in one pass over the logits, a
// thread-block cluster per row) against the CPU reference forward + backward: fp32, bf16 and fp16
// logits, every cluster size (forced) and the automatic choice, vocabularies that are not a
// multiple of the 16-byte vector or leave a cluster's last slices short or empty, padded columns,
// a masked row (dloss 0), misaligned rows (the scalar path), the real 128256 vocabulary, in
// place against out of place, run-to-run bit identity, and the Tensor-level op.
#ifdef MT_HAVE_CUDA

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rel_l2;

// Host values on T's grid, so the reference sees what the GPU reads.
template <typename T>
std::vector<float> on_grid(std::vector<float> v) {
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, bf16>)
      x = round_bf16(x);
    else if constexpr (std::is_same_v<T, f16>)
      x = f16_to_f32(f32_to_f16(x));
  }
  return v;
}

// A device array of T (fp16 held as its bit patterns) from fp32 host values, starting `offset`
// elements into its allocation (offset 1: rows not 16-byte aligned, the kernels' scalar path).
template <typename T>
class Logits {
  using Store = std::conditional_t<std::is_same_v<T, f16>, uint16_t, T>;

 public:
  Logits(const std::vector<float>& v, int64_t offset) : off_(offset), b_(store(v, offset)) {}
  T* get() const { return reinterpret_cast<T*>(b_.get()) + off_; }
  std::vector<float> download() const {
    std::vector<float> out;
    if constexpr (std::is_same_v<T, f16>) {
      for (uint16_t h : b_.download()) out.push_back(f16_to_f32(h));
    } else {
      out = b_.download();
    }
    return std::vector<float>(out.begin() + off_, out.end());
  }
  std::vector<uint8_t> bytes() const {
    auto b = b_.bytes();
    return std::vector<uint8_t>(b.begin() + off_ * static_cast<int64_t>(sizeof(T)), b.end());
  }

 private:
  static auto store(const std::vector<float>& v, int64_t offset) {
    std::vector<float> padded(static_cast<size_t>(offset), 0.f);
    padded.insert(padded.end(), v.begin(), v.end());
    if constexpr (std::is_same_v<T, f16>) {
      std::vector<uint16_t> bits(padded.size());
      for (size_t i = 0; i < padded.size(); ++i) bits[i] = f32_to_f16(padded[i]);
      return bits;
    } else {
      return padded;
    }
  }
  int64_t off_;
  DeviceBuffer<Store> b_;
};

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bf16> ? "bf16" : "fp16";
}

struct Problem {
  int64_t N, V, valid_v;
  std::vector<float> logits, dloss;
  std::vector<int32_t> targets;
  std::vector<float> loss, lse, dlogits;  // the CPU reference
};

// Random logits on T's grid (padded columns hold large values: they must not count), targets on
// the first and last valid columns, mid-row and scattered, and one masked row (dloss 0) when N > 3.
template <typename T>
Problem make_problem(int64_t N, int64_t V, int64_t valid_v, uint64_t seed) {
  Problem p{N, V, valid_v, {}, {}, {}, {}, {}, {}};
  p.logits = random_vec<float>(N * V, seed, -8, 8);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = valid_v; j < V; ++j) p.logits[r * V + j] = 40.f;
  p.logits = on_grid<T>(p.logits);
  p.targets.resize(N);
  for (int64_t r = 0; r < N; ++r)
    p.targets[r] = static_cast<int32_t>((r * 104729 + static_cast<int64_t>(seed)) % valid_v);
  p.targets[0] = 0;
  if (N > 1) p.targets[1] = static_cast<int32_t>(valid_v - 1);
  if (N > 2) p.targets[2] = static_cast<int32_t>(valid_v / 2);
  p.dloss = random_vec<float>(N, seed + 1, 0.5, 1.5);
  if (N > 3) p.dloss[3] = 0.f;
  p.loss.resize(N), p.lse.resize(N), p.dlogits.resize(N * V);
  cpu::cross_entropy_forward(p.logits.data(), p.targets.data(), p.loss.data(), p.lse.data(), N, V, valid_v);
  cpu::cross_entropy_backward(p.logits.data(), p.targets.data(), p.lse.data(), p.dloss.data(), p.dlogits.data(), N, V,
                              valid_v);
  return p;
}

struct Result {
  int cluster = 0;
  std::vector<float> loss, lse, dlogits;
  std::vector<uint8_t> loss_bits, lse_bits, dlogits_bits;
};

// One fused call, out of place (in_place false) or over the logits.
template <typename T>
Result run_fused(const Problem& p, int cluster, bool in_place, int64_t offset = 0) {
  Logits<T> gl(p.logits, offset), gd(std::vector<float>(p.N * p.V, 7.f), offset);
  DeviceBuffer<int32_t> gt(p.targets);
  DeviceBuffer<float> gdl(p.dloss), gloss(p.N), glse(p.N);
  gloss.fill_bytes(0xff), glse.fill_bytes(0xff);  // NaN unless written
  Result r;
  r.cluster = cross_entropy_fused(gl.get(), gt.get(), gdl.get(), gloss.get(), glse.get(),
                                  in_place ? gl.get() : gd.get(), p.N, p.V, p.valid_v, nullptr, cluster);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const Logits<T>& out = in_place ? gl : gd;
  r.loss = gloss.download(), r.lse = glse.download(), r.dlogits = out.download();
  r.loss_bits = gloss.bytes(), r.lse_bits = glse.bytes(), r.dlogits_bits = out.bytes();
  return r;
}

template <typename T>
double dlogits_tol() {
  return std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, bf16> ? 1e-2 : 2e-3;
}

// The fused result against the reference; exact zeros on padded columns and on the masked row.
template <typename T>
void expect_matches(const Problem& p, const Result& r, const char* what) {
  const double el = rel_l2(r.loss, p.loss), es = rel_l2(r.lse, p.lse), ed = rel_l2(r.dlogits, p.dlogits);
  std::printf("fused cross entropy %s %s N=%lld V=%lld valid=%lld cluster=%d: loss %.2e lse %.2e dlogits %.2e\n",
              type_name<T>(), what, static_cast<long long>(p.N), static_cast<long long>(p.V),
              static_cast<long long>(p.valid_v), r.cluster, el, es, ed);
  EXPECT_LT(el, 1e-5) << what;
  EXPECT_LT(es, 1e-5) << what;
  EXPECT_LT(ed, dlogits_tol<T>()) << what;
  int64_t bad_pad = 0, bad_masked = 0;
  for (int64_t row = 0; row < p.N; ++row)
    for (int64_t j = 0; j < p.V; ++j) {
      const float d = r.dlogits[row * p.V + j];
      if (j >= p.valid_v && d != 0.f) ++bad_pad;
      if (p.dloss[row] == 0.f && d != 0.f) ++bad_masked;
    }
  EXPECT_EQ(bad_pad, 0) << what << ": padded columns with a gradient";
  EXPECT_EQ(bad_masked, 0) << what << ": masked row with a gradient";
}

// Every cluster size the shape allows and the automatic choice: each matches the reference, in
// place gives the same bits as out of place, and a second run the same bits as the first.
template <typename T>
void check_shape(int64_t N, int64_t V, int64_t valid_v, const std::vector<int>& clusters, int64_t offset = 0) {
  const Problem p = make_problem<T>(N, V, valid_v, 11);
  for (int c : clusters) {
    const Result a = run_fused<T>(p, c, false, offset);
    if (c != 0) {
      EXPECT_EQ(a.cluster, std::max(c, 0));  // a forced size is used; -1: the two kernels (0)
    }
    expect_matches<T>(p, a, offset ? "misaligned" : "aligned");
    const Result b = run_fused<T>(p, c, true, offset), again = run_fused<T>(p, c, false, offset);
    EXPECT_EQ(b.cluster, a.cluster);
    EXPECT_TRUE(a.dlogits_bits == b.dlogits_bits) << "in place differs, cluster " << c;
    EXPECT_TRUE(a.loss_bits == b.loss_bits && a.lse_bits == b.lse_bits) << "in place differs, cluster " << c;
    EXPECT_TRUE(a.dlogits_bits == again.dlogits_bits) << "run to run, cluster " << c;
    EXPECT_TRUE(a.loss_bits == again.loss_bits && a.lse_bits == again.lse_bits) << "run to run, cluster " << c;
  }
}

TEST(GpuCrossEntropyFused, Fp32EveryClusterSize) {
  check_shape<float>(6, 1000, 990, {0, 1, 2, 4, 8, -1});
  check_shape<float>(7, 333, 333, {0, 1, 2, 4, 8});  // V not a multiple of the vector: scalar path
  check_shape<float>(5, 20, 17, {8});                // 8 slices of 4 columns: the last three empty
  check_shape<float>(5, 1000, 990, {0, 4}, 1);       // rows not 16-byte aligned
}

TEST(GpuCrossEntropyFused, Bf16EveryClusterSize) {
  check_shape<bf16>(16, 1000, 990, {0, 1, 2, 4, 8, -1});
  check_shape<bf16>(9, 1003, 1003, {0, 2, 4, 8});  // V odd: scalar path, slices ending mid-vector
  check_shape<bf16>(6, 4096, 4000, {0, 4}, 1);     // misaligned
}

// More rows than clusters fit on the GPU at once (a few hundred): clusters launch in many waves.
TEST(GpuCrossEntropyFused, ManyRowsInManyWaves) {
  check_shape<bf16>(3000, 256, 250, {0, 1, 4});
  check_shape<float>(2500, 64, 64, {0, 2, 8});
}

TEST(GpuCrossEntropyFused, Fp16EveryClusterSize) {
  check_shape<f16>(8, 32000, 31999, {0, 1, 2, 4, 8, -1});  // automatic: 1 CTA of 62.5 KB (opt-in smem)
  check_shape<f16>(5, 777, 770, {0, 4});
}

// The llama vocabulary: the automatic choice is a cluster of 4 for 16-bit logits (62.6 KB per
// CTA) and 8 for fp32; one CTA cannot hold a 16-bit row.
TEST(GpuCrossEntropyFused, RealVocabulary) {
  const int64_t V = 128256;
  {
    const Problem p = make_problem<bf16>(24, V, 128000, 5);
    const Result r = run_fused<bf16>(p, 0, true);
    EXPECT_EQ(r.cluster, 4);
    expect_matches<bf16>(p, r, "128256");
    const Result two = run_fused<bf16>(p, -1, true);  // the two-kernel path, same tolerance
    expect_matches<bf16>(p, two, "128256 two kernels");
    EXPECT_THROW(run_fused<bf16>(p, 1, true), Error);  // 256.5 KB: above any CTA's shared memory
  }
  {
    const Problem p = make_problem<float>(4, V, V, 6);
    const Result r = run_fused<float>(p, 0, false);
    EXPECT_EQ(r.cluster, 8);
    expect_matches<float>(p, r, "128256");
  }
  {
    const Problem p = make_problem<f16>(6, V, 128000, 7);
    const Result r = run_fused<f16>(p, 0, true);
    EXPECT_EQ(r.cluster, 4);
    expect_matches<f16>(p, r, "128256");
  }
}

// Many rows (several waves of clusters), run twice, and in place: bit-identical.
TEST(GpuCrossEntropyFused, BitIdenticalRunToRun) {
  const Problem p = make_problem<bf16>(300, 128256, 128256, 9);
  const Result a = run_fused<bf16>(p, 0, true), b = run_fused<bf16>(p, 0, true), c = run_fused<bf16>(p, 0, false);
  EXPECT_TRUE(a.dlogits_bits == b.dlogits_bits);
  EXPECT_TRUE(a.loss_bits == b.loss_bits);
  EXPECT_TRUE(a.lse_bits == b.lse_bits);
  EXPECT_TRUE(a.dlogits_bits == c.dlogits_bits);
  expect_matches<bf16>(p, a, "300 rows");
}

// ops::cross_entropy_fused on CUDA tensors: the gradient comes back in the logits' storage, and
// matches the separate forward and backward ops (and the CPU op, which composes them).
TEST(GpuCrossEntropyFused, TensorOpMatchesSeparateOps) {
  if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  test::gpu();
  const int64_t N = 12, V = 128256;
  const Problem p = make_problem<bf16>(N, V, V, 3);
  auto up = [](const std::vector<float>& v, const Shape& s) {
    return Tensor::from_vector(v, s).to(DType::BF16).to_device(Device::CUDA);
  };
  const Tensor targets = Tensor::from_vector(p.targets, {N}).to_device(Device::CUDA);
  const Tensor dloss = Tensor::from_vector(p.dloss, {N}).to_device(Device::CUDA);
  const Tensor logits = up(p.logits, {N, V}), logits2 = up(p.logits, {N, V});
  Tensor losses, lse, losses2, lse2;
  const Tensor d = ops::cross_entropy_fused(logits, targets, dloss, losses, lse);
  EXPECT_EQ(d.raw(), logits.raw());
  ops::cross_entropy_forward(logits2, targets, losses2, lse2);
  const Tensor d2 = ops::cross_entropy_backward(logits2, targets, lse2, dloss);
  auto down = [](const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32).to_vector(); };
  EXPECT_LT(rel_l2(down(losses), down(losses2)), 1e-6);
  EXPECT_LT(rel_l2(down(lse), down(lse2)), 1e-6);
  EXPECT_LT(rel_l2(down(d), down(d2)), 1e-2);
  EXPECT_LT(rel_l2(down(d), p.dlogits), 1e-2);
  EXPECT_LT(rel_l2(down(losses), p.loss), 1e-5);
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
