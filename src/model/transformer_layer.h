#pragma once
// Pre-norm transformer layer (Megatron's default):
//   h = x + dropout(attn(norm1(x)));  y = h + dropout(mlp(norm2(h)))
#include <memory>

#include "model/attention.h"
#include "model/mlp.h"
#include "model/moe/moe_layer.h"

namespace mt::model {

struct TransformerLayer {
  TransformerConfig cfg;
  Norm input_norm, pre_mlp_norm;
  SelfAttention attn;
  MLP mlp;         // a dense layer's MLP
  MoELayer moe;    // an MoE layer's (--num-experts, per --moe-layer-freq)
  bool is_moe = false;
  int64_t number = 0;  // the layer's global index (decoder.layers.N), for profiler ranges
  Dropout attn_drop, mlp_drop;

  // Full activation recomputation (configure_recompute sets these per model chunk): the layers
  // of a group keep nothing in forward but the group's input (held by a RecomputeGroup shared
  // by their Saved); the first backward to reach the group re-runs the group's forward from
  // that input, replaying the dropout offsets the first forward drew, and hands every layer
  // its rebuilt Saved.
  bool recompute = false;
  bool recompute_group_start = false, recompute_group_end = false;

  struct Saved {
    Norm::Saved n1, n2;
    SelfAttention::Saved attn;
    MLP::Saved mlp;
    MoELayer::Saved moe;
    Tensor moe_input;  // --recompute-modules moe: the MoE layer's input, all it keeps
    Dropout::Saved d1, d2;
    std::shared_ptr<RecomputeGroup> group;  // full recomputation: everything else is empty
    size_t group_index = 0;                 // this layer's place in the group
  };
  // `index`: the layer's global number (0-based), which picks dense or MoE.
  // `ep`: where an MoE layer's experts live (null: all here).
  void build(ParamStore& ps, int64_t index, const TransformerConfig& c, const RopeTables* rope,
             const TensorParallel* tp = nullptr, const ExpertParallel* ep = nullptr);
  Tensor forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
  Tensor backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;

  // Bytes of activation memory a layer's Saved holds between its forward and backward (tensors
  // counted once per storage; a recompute group's input counted by its first layer).
  static size_t saved_bytes(const Saved& s);

  // The forward and backward proper, without recomputation.
  Tensor forward_layer(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
  Tensor backward_layer(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
};

// Sets the recomputation flags of one model chunk's `n` consecutive layers from the config:
// full + uniform groups the chunk's layers in runs of recompute_num_layers (the last run may be
// shorter), full + block recomputes the chunk's first recompute_num_layers layers one by one.
// Selective recomputation is the attention's own flag (SelfAttention::recompute_core).
void configure_recompute(TransformerLayer* layers, size_t n, const TransformerConfig& c);

}  // namespace mt::model
