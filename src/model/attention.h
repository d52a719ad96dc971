#pragma once
// Self-attention as Megatron lays it out: linear_qkv packs, per query group, that group's q
// heads, then its k head, then its v head; RoPE (rotate-half) on q and k; causal flash-style
// core attention with GQA; linear_proj back to hidden.
#include "kernels/ops.h"
#include "model/layers.h"
#include "model/sequence_layout.h"

namespace mt::model {

struct RopeTables {
  Tensor cos, sin;  // [seq, rot_dim/2]
  int64_t rot_dim = 0;
  void build(int64_t seq, int64_t rot_dim, double base);
  // With the config's RoPE scaling (Llama 3.1's), when it is on.
  void build(int64_t seq, int64_t rot_dim, const TransformerConfig& c);
};

// Megatron's rules for splitting attention over TP: with TP <= groups each rank holds whole
// query groups (groups % TP == 0); with TP > groups the groups are replicated (TP % groups ==
// 0, and each group's query heads split evenly over the TP / groups ranks that share it).
// Fails naming the flags otherwise.
void check_query_groups_tp(const TransformerConfig& c, int64_t tp);

// This TP rank's part of the attention (SelfAttention::cfg is the whole model's shape).
struct AttentionShard {
  int64_t local_heads = 0;         // query heads: heads / TP
  int64_t local_query_groups = 0;  // key/value groups: groups / TP, or 1 when replicated
  // TP > query groups (Megatron's KV replication): the TP / groups ranks that share each
  // key/value group. 1: whole groups per rank.
  int64_t kv_replicas = 1;
  int64_t local_q_per_group() const { return local_heads / local_query_groups; }
};

struct SelfAttention {
  TransformerConfig cfg;  // the whole model's shape
  AttentionShard shard;   // this rank's heads and groups
  Linear qkv, proj;
  // Under KV replication linear_qkv stays an ordinary column split of the group-interleaved
  // weight: its output's columns leave the TP region gathered (TPMapping::Features), forward
  // keeps this rank's KV group and its own query heads of them, and backward's reduce-scatter
  // of the gradient sums the K/V gradients of the ranks sharing the group. Else the identity.
  TPRegion qkv_gather;
  const TensorParallel* tp = nullptr;
  Norm q_norm, k_norm;  // --qk-layernorm: over each head's channels, before RoPE
  const RopeTables* rope = nullptr;
  // Selective recomputation (--recompute-granularity selective): forward keeps q, k, v but not
  // the core's output (out and lse); backward re-runs the core.
  // Megatron's selective recompute drops the S x S softmax; flash-style attention never stores
  // it, so the output is what is left to drop: [S*B, heads*head_dim] per layer.
  bool recompute_core = false;
  struct Saved {
    // q, k, v: [B, heads, S, head_dim]. out: the core's output in row layout [S*B, heads*head_dim]
    // (linear_proj's input too, ops::attention_forward_rows).
    Tensor x, q, k, v, out, lse;
    Norm::Saved qn, kn;
    float dropout_p = 0.f;  // attention dropout this pass used (0: eval or off)
    uint64_t seed = 0, offset = 0;
    std::shared_ptr<const SequenceLayout> seq;  // the forward's token layout (null: plain)
  };
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, const RopeTables* r,
             const TensorParallel* tp = nullptr);
  // x: [S*B, H] with rows in (s, b) order. residual (optional, shaped as the output): added to
  // linear_proj's output, inside its GEMM where Linear::fuses_residual. x_amax: max |x| from x's
  // producer, for linear_qkv's FP8 cast (Linear::wants_input_amax).
  Tensor forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx, const Tensor* residual = nullptr,
                 const Tensor* x_amax = nullptr) const;
  Tensor backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
  // RoPE done inside the QKV split and merge (one pass over q and k instead of three) where
  // nothing runs between them and the rotation: no --qk-layernorm, whole groups per rank.
  // Empty otherwise, and RoPE runs as its own op.
  ops::RopeRef fused_rope(const SequenceLayout* seq = nullptr) const;

 private:
  // The steps of forward and backward, each charged to its OpTimes category.
  // linear_qkv's output -> this rank's q, k, v ([B, heads, S, head_dim]), and back.
  void split_qkv(Tensor packed, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
  Tensor merge_qkv(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t S, int64_t B,
                   const SequenceLayout* seq, PassContext& ctx) const;
  // RoPE run as its own op (where not fused into the split and merge); backward: the inverse.
  void rotate(Tensor& q, Tensor& k, bool backward, const SequenceLayout* seq, PassContext& ctx) const;
  // The core (local, or over the context-parallel group) in linear_proj's row layout.
  void core_forward(const ops::AttentionShape& p, const Saved& s, Tensor& out_rows, Tensor& lse,
                    PassContext& ctx) const;
  void core_backward(const ops::AttentionShape& p, const Saved& s, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                     Tensor& dv) const;
};

}  // namespace mt::model
