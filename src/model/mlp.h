#pragma once
// MLP: linear_fc1 (-> [gate | up] for SwiGLU), activation, linear_fc2.
#include "model/layers.h"

namespace mt::model {

struct MLP {
  TransformerConfig cfg;  // the whole model's shape
  int64_t local_ffn = 0;  // this rank's ffn_hidden_size / TP columns, where the activation runs
  Linear fc1, fc2;
  struct Saved {
    Tensor x, h, a;  // input, fc1 output, activation output
  };
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, const TensorParallel* tp = nullptr);
  // residual (optional, shaped as the output): added to linear_fc2's output, inside its GEMM where
  // Linear::fuses_residual. x_amax: max |x| from x's producer, for linear_fc1's FP8 cast
  // (Linear::wants_input_amax).
  Tensor forward(const Tensor& x, Saved& s, PassContext& ctx, const Tensor* residual = nullptr,
                 const Tensor* x_amax = nullptr) const;
  Tensor backward(const Tensor& dy, Saved& s, PassContext& ctx) const;
};

}  // namespace mt::model
