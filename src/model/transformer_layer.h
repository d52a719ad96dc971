#pragma once
// Pre-norm transformer layer (Megatron's default):
//   h = x + dropout(attn(norm1(x)));  y = h + dropout(mlp(norm2(h)))
#include "model/attention.h"
#include "model/mlp.h"

namespace mt::model {

struct TransformerLayer {
  TransformerConfig cfg;
  Norm input_norm, pre_mlp_norm;
  SelfAttention attn;
  MLP mlp;
  Dropout attn_drop, mlp_drop;
  struct Saved {
    Norm::Saved n1, n2;
    SelfAttention::Saved attn;
    MLP::Saved mlp;
    Dropout::Saved d1, d2;
  };
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, const RopeTables* rope,
             const TensorParallel* tp = nullptr);
  Tensor forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
  Tensor backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const;
};

}  // namespace mt::model
