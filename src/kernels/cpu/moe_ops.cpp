// The CPU implementation of the mixture-of-experts ops of ops.def: fp32 tensors around the
// reference kernels of kernels/cpu/moe.h, and the token permutation (a gather and its sums).
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/moe.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {
namespace {

void require_cpu(const Tensor& t, DType d, const char* op) {
  MT_CHECK(t.device() == Device::CPU && t.dtype() == d, "{}: expected a CPU {} tensor, got {}", op, dtype_name(d),
           dtype_name(t.dtype()));
}
float* f(const Tensor& t) { return t.data<float>(); }
int32_t* i32(const Tensor& t) { return t.data<int32_t>(); }

}  // namespace

void moe_route(const Tensor& logits, const Tensor* expert_bias, const RouterSpec& spec, Tensor& probs,
               Tensor& selected) {
  require_cpu(logits, DType::F32, "moe_route");
  const int64_t n = logits.dim(0), E = logits.dim(1);
  MT_CHECK(E == spec.num_experts, "moe_route: logits of {} experts, spec {}", E, spec.num_experts);
  probs = Tensor::empty({n, E});
  selected = Tensor::empty({n, E}, DType::I32);
  cpu::moe_route(f(logits), expert_bias ? f(*expert_bias) : nullptr, spec, n, f(probs), i32(selected));
}

Tensor moe_route_backward(const Tensor& logits, const Tensor& selected, const Tensor& dprobs, const RouterSpec& spec) {
  require_cpu(dprobs, DType::F32, "moe_route_backward");
  Tensor dl = Tensor::empty(logits.shape());
  cpu::moe_route_backward(f(logits), i32(selected), f(dprobs), spec, logits.dim(0), f(dl));
  return dl;
}

void moe_aux_stats(const Tensor& logits, const RouterSpec& spec, int64_t B, Tensor& score_sums, Tensor& counts,
                   Tensor& z_sum) {
  require_cpu(logits, DType::F32, "moe_aux_stats");
  const int64_t E = spec.num_experts;
  score_sums = Tensor::empty({B, E});
  counts = Tensor::empty({B, E});
  z_sum = Tensor::empty({1});
  cpu::moe_aux_stats(f(logits), spec, logits.dim(0), B, f(score_sums), f(counts), f(z_sum));
}

void moe_aux_backward(const Tensor& logits, const RouterSpec& spec, int64_t B, const Tensor& coef, float z_coef,
                      Tensor& dlogits) {
  require_cpu(dlogits, DType::F32, "moe_aux_backward");
  cpu::moe_aux_backward(f(logits), spec, logits.dim(0), B, f(coef), z_coef, f(dlogits));
}

void moe_expert_bias_update(Tensor& bias, const Tensor& counts, float rate) {
  require_cpu(bias, DType::F32, "moe_expert_bias_update");
  require_cpu(counts, DType::F32, "moe_expert_bias_update");
  const int64_t E = bias.numel();
  MT_CHECK(counts.numel() == E, "moe_expert_bias_update: {} counts for {} experts", counts.numel(), E);
  const float* c = counts.data<float>();
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += c[e];
  mean /= static_cast<double>(E);
  float* b = bias.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    const double off = mean - c[e];
    b[e] += static_cast<float>((off > 0) - (off < 0)) * rate;
  }
}

Tensor moe_capacity(Tensor& probs, const Tensor& selected, int64_t capacity, bool by_position, bool pad) {
  require_cpu(probs, DType::F32, "moe_capacity");
  Tensor map = Tensor::empty(probs.shape(), DType::I32);
  cpu::moe_capacity(f(probs), i32(selected), probs.dim(0), probs.dim(1), capacity, by_position, pad, i32(map));
  return map;
}

Tensor moe_dispatch_plan(const Tensor& map, Tensor& counts) {
  require_cpu(map, DType::I32, "moe_dispatch_plan");
  const int64_t n = map.dim(0), E = map.dim(1);
  Tensor rows = Tensor::empty({n, E}, DType::I32);
  counts = Tensor::empty({E}, DType::I32);
  cpu::moe_dispatch_plan(i32(map), n, E, i32(rows), i32(counts));
  return rows;
}

Tensor moe_permute(const Tensor& x, const Tensor& token_rows, int64_t rows) {
  require_cpu(x, DType::F32, "moe_permute");
  const int64_t n = x.dim(0), h = x.dim(1), E = token_rows.dim(1);
  Tensor xp = Tensor::empty({rows, h});
  const int32_t* r = i32(token_rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e)
      if (r[t * E + e] >= 0) std::copy_n(f(x) + t * h, h, f(xp) + int64_t{r[t * E + e]} * h);
  return xp;
}

namespace {
// y[t] = sum over e ascending of w[t, e] * rows[token_rows[t, e]] (w null: 1), in fp32.
Tensor sum_token_rows(const Tensor& rows_in, const Tensor& token_rows, const Tensor* w) {
  const int64_t n = token_rows.dim(0), E = token_rows.dim(1), h = rows_in.dim(1);
  Tensor y = Tensor::zeros({n, h});
  const int32_t* r = i32(token_rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e) {
      if (r[t * E + e] < 0) continue;
      const float p = w ? f(*w)[t * E + e] : 1.f;
      const float* src = f(rows_in) + int64_t{r[t * E + e]} * h;
      float* dst = f(y) + t * h;
      for (int64_t j = 0; j < h; ++j) dst[j] += p * src[j];
    }
  return y;
}
}  // namespace

Tensor moe_permute_backward(const Tensor& dxp, const Tensor& token_rows) {
  require_cpu(dxp, DType::F32, "moe_permute_backward");
  return sum_token_rows(dxp, token_rows, nullptr);
}

Tensor moe_unpermute(const Tensor& yp, const Tensor& token_rows, const Tensor& probs) {
  require_cpu(yp, DType::F32, "moe_unpermute");
  return sum_token_rows(yp, token_rows, &probs);
}

Tensor moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& token_rows, const Tensor& probs,
                              Tensor& dprobs) {
  require_cpu(dy, DType::F32, "moe_unpermute_backward");
  const int64_t n = token_rows.dim(0), E = token_rows.dim(1), h = yp.dim(1);
  Tensor dyp = Tensor::empty(yp.shape());
  dprobs = Tensor::zeros({n, E});
  const int32_t* r = i32(token_rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e) {
      if (r[t * E + e] < 0) continue;
      const float p = f(probs)[t * E + e];
      const float* g = f(dy) + t * h;
      const float* y = f(yp) + int64_t{r[t * E + e]} * h;
      float* d = f(dyp) + int64_t{r[t * E + e]} * h;
      double dot = 0;
      for (int64_t j = 0; j < h; ++j) {
        d[j] = p * g[j];
        dot += static_cast<double>(g[j]) * y[j];
      }
      f(dprobs)[t * E + e] = static_cast<float>(dot);
    }
  return dyp;
}

Tensor sigmoid_gate_rows(const Tensor& x, const Tensor& gate) {
  require_cpu(x, DType::F32, "sigmoid_gate_rows");
  const int64_t n = x.dim(0), h = x.dim(1);
  Tensor y = Tensor::empty(x.shape());
  for (int64_t t = 0; t < n; ++t) {
    const float s = 1.f / (1.f + std::exp(-f(gate)[t]));
    for (int64_t j = 0; j < h; ++j) f(y)[t * h + j] = f(x)[t * h + j] * s;
  }
  return y;
}

Tensor sigmoid_gate_rows_backward(const Tensor& dy, const Tensor& x, const Tensor& gate, Tensor& dgate) {
  require_cpu(dy, DType::F32, "sigmoid_gate_rows_backward");
  const int64_t n = x.dim(0), h = x.dim(1);
  Tensor dx = Tensor::empty(x.shape());
  dgate = Tensor::empty({n, 1});
  for (int64_t t = 0; t < n; ++t) {
    const float s = 1.f / (1.f + std::exp(-f(gate)[t]));
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      f(dx)[t * h + j] = f(dy)[t * h + j] * s;
      dot += static_cast<double>(f(dy)[t * h + j]) * f(x)[t * h + j];
    }
    f(dgate)[t] = static_cast<float>(dot * s * (1.0 - s));
  }
  return dx;
}

}  // namespace mt::ops::host
