#pragma once
// Tensor-level ops used by the model, one device-neutral entry point each. Each call dispatches
// on the device of one input (ops.cpp): CPU tensors go to the fp32 reference implementation in
// kernels/cpu (ops::host), CUDA tensors (bf16 or fp16 activations, fp32 main grads and
// statistics) to kernels/cuda (ops::gpu). Outputs are allocated with the input's device and
// dtype. Activations are [rows, features] with rows = S*B in Megatron's [s, b] order; per-head
// tensors are [B, H, S, D].
//
// The ops, with their contracts, are listed once in kernels/ops.def; this header declares them
// from that list.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "core/tensor.h"
#include "kernels/attention_shape.h"
#include "kernels/fp8_blocks.h"
#include "kernels/moe_routing.h"

namespace mt::ops {

// Rotary embedding applied inside the QKV split (q and k) and merge (their gradients rotated
// back), which the GPU fuses into the copy: rotate-half over rot_dim, tables [S, rot_dim/2] (the
// CPU also takes [B, S, rot_dim/2]: a table per sample, for packed documents).
struct RopeRef {
  const Tensor* cos = nullptr;
  const Tensor* sin = nullptr;
  int64_t rot_dim = 0;
};

// What ops::fused_linear_forward fuses around a linear layer (inference's decode steps, issue
// #22): the RMSNorm before it, SwiGLU after it, a residual added.
struct LinearFusion {
  const Tensor* norm_weight = nullptr;  // RMSNorm's scale [in] in x's dtype: the linear reads rmsnorm(x)
  float norm_eps = 0.f;
  bool swiglu = false;               // w is [gate; up] (2F rows): the result is swiglu of the [rows, 2F] product
  const Tensor* residual = nullptr;  // [rows, out], added to the product (not with swiglu)
};

// One decoder layer of ops::decode_layer_stack (inference's batch-1 decode, issue #22): a
// Llama-family layer's tensors, in the model's half type on the GPU (fp32 on the CPU).
struct DecodeLayerRef {
  const Tensor* input_norm = nullptr;  // RMSNorm scale [hidden]
  float input_eps = 0.f;
  const Tensor* qkv_w = nullptr;  // linear_qkv [G * (qpg + 2) * D, hidden]
  const Tensor* qkv_b = nullptr;  // or null
  const Tensor* proj_w = nullptr;  // linear_proj [hidden, Hq * D], no bias
  const Tensor* mlp_norm = nullptr;
  float mlp_eps = 0.f;
  const Tensor* fc1_w = nullptr;  // linear_fc1 [2F, hidden]: gate, then up
  const Tensor* fc1_b = nullptr;  // or null
  const Tensor* fc2_w = nullptr;  // linear_fc2 [hidden, F], no bias
  Tensor* k_cache = nullptr;
  Tensor* v_cache = nullptr;  // [slots, G, L, D]
};
// The stack and the step's row: its cache slot and position (I32 [1]) and RoPE tables.
struct DecodeStackRef {
  std::vector<DecodeLayerRef> layers;
  int64_t G = 0, qpg = 0, D = 0;
  RopeRef rope;
  const Tensor* slot = nullptr;
  const Tensor* pos = nullptr;
  float scale = 0.f;  // the attention's softmax scale
};

// An in-place all-reduce over the ranks that hold the other shards of a vocabulary-parallel op,
// which the caller supplies (the model: its tensor-parallel communicator): `count` values of
// `type` at `data`, on the op's device. Empty when there are no other ranks.
enum class ReduceOp : uint8_t { Sum, Max };
enum class ReduceType : uint8_t { F32, F64 };
using ShardReduce = std::function<void(void* data, size_t count, ReduceType type, ReduceOp op)>;

// ---- What the optimizer ops of ops.def take.
// [begin, end) ranges of a flat fp32 buffer (the part of the model's grad buffer a rank steps on).
using FlatRanges = std::vector<std::pair<int64_t, int64_t>>;

// A flat range of an optimizer's buffer and whether its elements take weight decay;
// optim::make_segment_groups builds them sorted, disjoint and covering the buffer.
struct DecaySegment {
  int64_t begin = 0, end = 0;
  bool weight_decay = true;
};

// One AdamW update's scalars as torch holds them (Python floats): lr and weight decay from the
// schedule; the betas and eps as the decimals the flags gave (optim/hyper.h); step counts updates,
// this one included (1 on the first).
struct AdamWStep {
  double lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;
  // Gradient clipping folded into the update: each grad is read as fp32(g * grad_scale), the
  // product clip_grads would have written (clip_coefficient), without a pass over the grads of its
  // own. 1 (no clipping) multiplies exactly.
  float grad_scale = 1.f;
};

// One SGD update (torch.optim.SGD as Megatron sets it up): `first` makes the momentum buffer a
// copy of this step's direction (torch creates it lazily on the first step).
struct SGDStep {
  double lr = 0, weight_decay = 0, momentum = 0;
  bool first = false;
  float grad_scale = 1.f;  // as AdamWStep's
};

// Megatron's clip_grad_norm coefficient as fp32 grads take it: max_norm / (total_norm + 1e-6) in
// double where that is below 1, else 1 (also for a NaN norm, as Megatron's "if clip_coeff < 1.0").
inline float clip_coefficient(double total_norm, double max_norm) {
  const double c = max_norm / (total_norm + 1.0e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.f;
}

// The compute copy of the parameters (--bf16, --fp16) that an update refreshes in the same pass:
// `out` (numel of the parameters) receives the updated values rounded to `half` (BF16 or F16),
// stored in that type (the GPU's copy) or as fp32 numbers (`out` of dtype F32: the CPU's
// emulation of half storage). `out` undefined: there is no copy to write.
struct HalfCopy {
  Tensor out;
  DType half = DType::BF16;
  bool defined() const { return out.defined(); }
  // The copy of parameters [start, start + n), for an update of part of the buffer.
  HalfCopy part(int64_t start, int64_t n) const { return defined() ? HalfCopy{out.flat_range(start, {n}), half} : HalfCopy{}; }
};

// One block-scaled FP8 GEMM as cuBLASLt is asked for it (fp8_block_gemm_supported):
// D [m, n] (+ C) = a [m, k] . b [n, k]^T, both operands K-major in the tilings of kernels/fp8_blocks.h.
struct Fp8BlockGemm {
  int64_t m = 0, n = 0, k = 0;
  Fp8Format a_format = Fp8Format::E4M3, b_format = Fp8Format::E4M3;
  Fp8Tiles a_tiles = Fp8Tiles::Rows1x128, b_tiles = Fp8Tiles::Blocks128x128;
  DType out = DType::BF16;  // D's type, and C's when has_c
  bool has_c = false;
};

#define MT_DEFAULT(v) = v
#define MT_OP(result, name, on, params, args) result name params;
#include "kernels/ops.def"
#undef MT_OP
#undef MT_DEFAULT

// Rounds an f32 through IEEE fp16 and back: nearest-even, subnormals, overflow to inf.
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// The attention core with its output in the rows layout that linear_proj consumes: out_rows
// [S*B, Hq*D], rows in Megatron's (s, b) order, instead of heads [B, Hq, S, D]; exactly
// attention_forward + heads_to_rows (and rows_to_heads + attention_backward). Where the direct
// path of ops.def serves the call (cuDNN with strided O and dO), that saves a read and a write of
// the output per direction and keeps one copy of it instead of two; elsewhere (the CPU, fp16,
// dropout, --attention-backend flash, a rows graph that does not build) these are that
// composition, copies included. q [B,Hq,S,D], k/v [B,Hkv,S,D]; lse fp32 [B,Hq,S]; dq, dk, dv in
// the heads layout of q, k, v.
void attention_forward_rows(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            Tensor& out_rows, Tensor& lse);
void attention_backward_rows(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                             Tensor& dv);

}  // namespace mt::ops
