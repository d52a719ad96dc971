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

#include "core/tensor.h"
#include "kernels/attention_shape.h"
#include "kernels/moe_routing.h"

namespace mt::ops {

// Rotary embedding applied inside the QKV split (q and k) and merge (their gradients rotated
// back), which the GPU fuses into the copy: rotate-half over rot_dim, tables [S, rot_dim/2].
struct RopeRef {
  const Tensor* cos = nullptr;
  const Tensor* sin = nullptr;
  int64_t rot_dim = 0;
};

// An in-place all-reduce over the ranks that hold the other shards of a vocabulary-parallel op,
// which the caller supplies (the model: its tensor-parallel communicator): `count` values of
// `type` at `data`, on the op's device. Empty when there are no other ranks.
enum class ReduceOp : uint8_t { Sum, Max };
enum class ReduceType : uint8_t { F32, F64 };
using ShardReduce = std::function<void(void* data, size_t count, ReduceType type, ReduceOp op)>;

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
