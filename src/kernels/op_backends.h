#pragma once
// The two implementations of every op of ops.def, declared from that list: ops::host (the fp32
// CPU reference, kernels/cpu/tensor_ops.cpp and its neighbours) and ops::gpu (the CUDA backend,
// kernels/cuda/tensor_ops.cpp and its neighbours; in a build without CUDA, cuda_absent.cpp).
// Only ops.cpp and the implementations include this: everyone else calls ops::<name>.
#include "core/error.h"
#include "kernels/ops.h"

namespace mt::ops {

#define MT_DEFAULT(v)
#define MT_OP(result, name, on, params, args) result name params;
namespace host {
#include "kernels/ops.def"
}  // namespace host
namespace gpu {
#include "kernels/ops.def"
}  // namespace gpu
#undef MT_OP
#undef MT_DEFAULT

// The decode fusions (ops.def) as the compositions of the ops they fuse, through the dispatching
// ops: the CPU's implementations, and the GPU's where its fused kernels do not apply.
inline Tensor fused_linear_composed(const Tensor& x, const Tensor& w, const Tensor* b, const LinearFusion& f) {
  MT_CHECK(!(f.swiglu && f.residual), "fused_linear_forward: a residual is not added after SwiGLU");
  Tensor xn = x;
  if (f.norm_weight) {
    Tensor rstd;
    xn = ops::rmsnorm_forward(x, *f.norm_weight, f.norm_eps, rstd);
  }
  Tensor y = f.residual ? ops::linear_forward_residual(xn, w, b, *f.residual) : ops::linear_forward(xn, w, b);
  return f.swiglu ? ops::swiglu_forward(y) : y;
}
inline Tensor fused_qkv_composed(const Tensor& x, const Tensor& w, const Tensor* b, const LinearFusion& f,
                                 Tensor& k_cache, Tensor& v_cache, const Tensor& slot, const Tensor& pos, int64_t G,
                                 int64_t qpg, int64_t D, const RopeRef& rope) {
  return ops::qkv_split_to_cache(ops::fused_linear_forward(x, w, b, f), k_cache, v_cache, slot, pos, G, qpg, D, rope);
}

// decode_layer_stack as the ops it runs, layer by layer.
inline Tensor decode_stack_composed(const Tensor& x, const DecodeStackRef& s) {
  Tensor h = x;
  for (const DecodeLayerRef& L : s.layers) {
    const Tensor q = ops::fused_qkv_forward(h, *L.qkv_w, L.qkv_b, {L.input_norm, L.input_eps}, *L.k_cache, *L.v_cache,
                                            *s.slot, *s.pos, s.G, s.qpg, s.D, s.rope);
    const Tensor core = ops::cached_attention(q, *L.k_cache, *L.v_cache, *s.slot, *s.pos, s.scale);
    const Tensor a = ops::linear_forward_residual(core, *L.proj_w, nullptr, h);
    const Tensor f = ops::fused_linear_forward(a, *L.fc1_w, L.fc1_b, {L.mlp_norm, L.mlp_eps, true});
    h = ops::linear_forward_residual(f, *L.fc2_w, nullptr, a);
  }
  return h;
}

// Argument checks both implementations make (internal invariants: the callers pass these right).
inline void check_vector(const Tensor& t, Device device, DType dtype, int64_t n, const char* what) {
  MT_CHECK(t.device() == device && t.dtype() == dtype && t.numel() == n,
           "{}: expected a {} {} tensor of {} elements, got {} {} on the {}", what,
           device == Device::CPU ? "CPU" : "CUDA", dtype_name(dtype), n, dtype_name(t.dtype()), t.shape_str(),
           t.device() == Device::CPU ? "CPU" : "GPU");
}
// accumulate_masked_loss: losses and mask f32 [n], acc one 8-byte cell, all on `device`.
inline void check_masked_loss(const Tensor& losses, const Tensor& mask, const Tensor& acc, Device device) {
  check_vector(losses, device, DType::F32, losses.numel(), "accumulate_masked_loss (losses)");
  check_vector(mask, device, DType::F32, losses.numel(), "accumulate_masked_loss (mask)");
  MT_CHECK(acc.device() == device && acc.nbytes() == sizeof(double),
           "accumulate_masked_loss: the accumulator must be one 8-byte cell on the same device, got {} {}",
           dtype_name(acc.dtype()), acc.shape_str());
}

}  // namespace mt::ops
