// Inference's decode fusions on the CPU (ops.def: fused_linear_forward, qkv_split_to_cache,
// fused_qkv_forward, decode_layer_stack): the compositions of the ops they fuse (op_backends.h), which are the
// references the GPU's fused kernels (kernels/cuda/gemv.cu, layout.cu) are tested against.
// Forward only: inference has no backward.
#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

Tensor fused_linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, const LinearFusion& f) {
  return fused_linear_composed(x, w, b, f);
}

Tensor qkv_split_to_cache(const Tensor& packed, Tensor& k_cache, Tensor& v_cache, const Tensor& slot,
                          const Tensor& pos, int64_t G, int64_t qpg, int64_t D, const RopeRef& rope) {
  const int64_t N = packed.numel() / (G * (qpg + 2) * D);
  Tensor q, k, v;
  host::qkv_split(packed, q, k, v, N, 1, G, qpg, D, rope);
  host::kv_cache_write(k_cache, v_cache, k, v, slot, pos);
  return q;
}

Tensor fused_qkv_forward(const Tensor& x, const Tensor& w, const Tensor* b, const LinearFusion& f, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot, const Tensor& pos, int64_t G, int64_t qpg, int64_t D,
                         const RopeRef& rope) {
  return fused_qkv_composed(x, w, b, f, k_cache, v_cache, slot, pos, G, qpg, D, rope);
}

Tensor decode_layer_stack(const Tensor& x, const DecodeStackRef& s) { return decode_stack_composed(x, s); }

}  // namespace mt::ops::host
