// ops::decode_layer_stack on the GPU (ops.def): the whole-stack decode kernel (decode_stack.cu)
// where it applies, else the ops it fuses, one by one (op_backends.h), as the CPU runs them.
#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {
namespace {

bool same_half(const Tensor* t, DType dt) { return !t || (t->device() == Device::CUDA && t->dtype() == dt); }

// The kernel computes what the layer-by-layer path computes on the decode kernels (the GEMV with
// its fusions, the grouped-query decode attention with its fused merge): it runs only where that
// path would run them, so that which one ran never changes a bit.
bool kernel_matches_the_ops(const Tensor& x, const DecodeStackRef& s) {
  const DType dt = x.dtype();
  if ((dt != DType::BF16 && dt != DType::F16) || x.device() != Device::CUDA || s.layers.empty()) return false;
  if (!cuda::gemv_applies(1) || InferenceGemv::kernel() != InferenceGemv::Kernel::Wide || !DecodeKernels::active() ||
      !DecodeKernels::fusions())
    return false;
  if (s.rope.rot_dim != 0 && s.rope.rot_dim != s.D) return false;  // the QKV epilogue rotates whole heads
  if (!s.slot || !s.pos || s.slot->numel() != 1 || s.pos->numel() != 1 || s.slot->dtype() != DType::I32 ||
      s.pos->dtype() != DType::I32 || s.slot->device() != Device::CUDA || s.pos->device() != Device::CUDA)
    return false;
  const int64_t hidden = x.numel(), G = s.G, D = s.D, qkv_rows = G * (s.qpg + 2) * D;
  const int64_t F = s.layers[0].fc1_w->dim(0) / 2;
  for (const DecodeLayerRef& L : s.layers) {
    for (const Tensor* t : {L.input_norm, L.qkv_w, L.qkv_b, L.proj_w, L.mlp_norm, L.fc1_w, L.fc1_b, L.fc2_w,
                            static_cast<const Tensor*>(L.k_cache), static_cast<const Tensor*>(L.v_cache)})
      if (!same_half(t, dt)) return false;
    if (L.qkv_w->dim(0) != qkv_rows || L.qkv_w->dim(1) != hidden || L.proj_w->dim(0) != hidden ||
        L.proj_w->dim(1) != G * s.qpg * D || L.fc1_w->dim(0) != 2 * F || L.fc1_w->dim(1) != hidden ||
        L.fc2_w->dim(0) != hidden || L.fc2_w->dim(1) != F || L.input_norm->numel() != hidden ||
        L.mlp_norm->numel() != hidden || L.k_cache->ndim() != 4 || L.k_cache->dim(1) != G || L.k_cache->dim(3) != D ||
        L.v_cache->shape() != L.k_cache->shape() || L.k_cache->shape() != s.layers[0].k_cache->shape())
      return false;
  }
  return true;
}

}  // namespace

Tensor decode_layer_stack(const Tensor& x, const DecodeStackRef& s) {
  if (!kernel_matches_the_ops(x, s)) return decode_stack_composed(x, s);
  const Tensor& k0 = *s.layers[0].k_cache;
  cuda::DecodeStack d;
  d.hidden = x.numel();
  d.F = s.layers[0].fc1_w->dim(0) / 2;
  d.G = s.G;
  d.D = s.D;
  d.Hq = s.G * s.qpg;
  d.slots = k0.dim(0);
  d.L = k0.dim(2);
  d.splits = cuda::decode_stack_splits(d.G, d.L, d.D);
  d.per_split = (d.L + d.splits - 1) / d.splits;
  d.scale = s.scale;
  Tensor out = Tensor::empty({1, d.hidden}, x.dtype(), Device::CUDA);
  Tensor q = Tensor::empty({1, d.Hq, 1, d.D}, x.dtype(), Device::CUDA);
  Tensor attn = Tensor::empty({1, d.Hq * d.D}, x.dtype(), Device::CUDA);
  Tensor h = Tensor::empty({1, d.F}, x.dtype(), Device::CUDA);
  Tensor part = d.splits > 1 ? Tensor::empty({d.Hq * d.splits * (d.D + 2)}, DType::F32, Device::CUDA) : Tensor();
  d.x_in = x.raw();
  d.x = out.raw();
  d.q = q.raw();
  d.attn = attn.raw();
  d.h = h.raw();
  d.part = d.splits > 1 ? part.data<float>() : nullptr;
  d.slot = s.slot->data<int32_t>();
  d.pos = s.pos->data<int32_t>();
  if (s.rope.rot_dim) {
    MT_CHECK(s.rope.cos->numel() == d.D / 2 && s.rope.sin->numel() == d.D / 2 && s.rope.cos->dtype() == DType::F32,
             "decode_layer_stack: RoPE tables of {} fp32 values expected", d.D / 2);
    d.cos = s.rope.cos->data<float>();
    d.sin = s.rope.sin->data<float>();
  }
  for (const DecodeLayerRef& L : s.layers)
    d.layers.push_back({L.input_norm->raw(), L.qkv_w->raw(), L.qkv_b ? L.qkv_b->raw() : nullptr, L.proj_w->raw(),
                        L.mlp_norm->raw(), L.fc1_w->raw(), L.fc1_b ? L.fc1_b->raw() : nullptr, L.fc2_w->raw(),
                        L.k_cache->raw(), L.v_cache->raw(), L.input_eps, L.mlp_eps});
  const bool ran = x.dtype() == DType::F16 ? cuda::decode_stack_forward<cuda::f16>(d, cuda::compute_stream())
                                           : cuda::decode_stack_forward<cuda::bf16>(d, cuda::compute_stream());
  return ran ? out : decode_stack_composed(x, s);
}

}  // namespace mt::ops::gpu
