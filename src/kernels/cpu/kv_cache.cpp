// The KV cache ops on the CPU (ops.def: kv_cache_write, cached_attention): the fp32 reference
// the GPU's kernels (kernels/cuda/kv_cache.cu) are tested against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {
namespace {

struct CacheShape {
  int64_t slots, G, L, D;
};

CacheShape cache_shape(const Tensor& c, const char* what) {
  MT_CHECK(c.device() == Device::CPU && c.dtype() == DType::F32 && c.ndim() == 4,
           "{}: expected a CPU f32 cache [slots, G, L, D], got {} {}", what, dtype_name(c.dtype()), c.shape_str());
  return {c.dim(0), c.dim(1), c.dim(2), c.dim(3)};
}

// Row i's slot and position, checked against the cache.
std::pair<int64_t, int64_t> row_place(const Tensor& slot, const Tensor& pos, int64_t i, const CacheShape& c) {
  const int64_t s = slot.data<int32_t>()[i], p = pos.data<int32_t>()[i];
  MT_CHECK(s >= 0 && s < c.slots && p >= 0 && p < c.L, "KV cache row {}: slot {} position {} outside [{}, {}]", i, s,
           p, c.slots, c.L);
  return {s, p};
}

}  // namespace

void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& slot,
                    const Tensor& pos) {
  const CacheShape c = cache_shape(k_cache, "kv_cache_write");
  MT_CHECK(v_cache.shape() == k_cache.shape(), "kv_cache_write: caches {} and {} differ", k_cache.shape_str(),
           v_cache.shape_str());
  const int64_t N = k.ndim() == 4 ? k.dim(2) : -1;
  MT_CHECK(k.ndim() == 4 && k.dim(0) == 1 && k.dim(1) == c.G && k.dim(3) == c.D && v.shape() == k.shape(),
           "kv_cache_write: k {} / v {} must be [1, {}, N, {}]", k.shape_str(), v.shape_str(), c.G, c.D);
  check_vector(slot, Device::CPU, DType::I32, N, "kv_cache_write (slot)");
  check_vector(pos, Device::CPU, DType::I32, N, "kv_cache_write (pos)");
  for (int64_t i = 0; i < N; ++i) {
    const auto [s, p] = row_place(slot, pos, i, c);
    for (int64_t g = 0; g < c.G; ++g) {
      const int64_t dst = ((s * c.G + g) * c.L + p) * c.D, src = (g * N + i) * c.D;
      std::memcpy(k_cache.data<float>() + dst, k.data<float>() + src, static_cast<size_t>(c.D) * 4);
      std::memcpy(v_cache.data<float>() + dst, v.data<float>() + src, static_cast<size_t>(c.D) * 4);
    }
  }
}

Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& slot,
                        const Tensor& pos, float scale) {
  const CacheShape c = cache_shape(k_cache, "cached_attention");
  MT_CHECK(q.ndim() == 4 && q.dim(0) == 1 && q.dim(3) == c.D && q.dim(1) % c.G == 0 && q.dtype() == DType::F32,
           "cached_attention: q {} must be f32 [1, Hq, N, {}] with Hq a multiple of {} groups", q.shape_str(), c.D,
           c.G);
  const int64_t Hq = q.dim(1), N = q.dim(2), D = c.D, per_group = Hq / c.G;
  check_vector(slot, Device::CPU, DType::I32, N, "cached_attention (slot)");
  check_vector(pos, Device::CPU, DType::I32, N, "cached_attention (pos)");
  Tensor out = Tensor::empty({N, Hq * D});
  const float* qd = q.data<float>();
  const float* kd = k_cache.data<float>();
  const float* vd = v_cache.data<float>();
  float* od = out.data<float>();
#pragma omp parallel for collapse(2) schedule(static) if (N * Hq > 8)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const auto [s, p] = row_place(slot, pos, i, c);
      const int64_t g = h / per_group;
      const float* qi = qd + (h * N + i) * D;
      const float* kb = kd + (s * c.G + g) * c.L * D;
      const float* vb = vd + (s * c.G + g) * c.L * D;
      std::vector<float> w(static_cast<size_t>(p + 1));
      float mx = -INFINITY;
      for (int64_t j = 0; j <= p; ++j) {
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kb[j * D + d];
        w[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, w[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (float& x : w) sum += x = std::exp(x - mx);
      float* o = od + i * Hq * D + h * D;
      std::fill(o, o + D, 0.f);
      for (int64_t j = 0; j <= p; ++j) {
        const float wj = static_cast<float>(w[static_cast<size_t>(j)] / sum);
        for (int64_t d = 0; d < D; ++d) o[d] += wj * vb[j * D + d];
      }
    }
  return out;
}

}  // namespace mt::ops::host
