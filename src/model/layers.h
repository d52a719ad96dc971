#pragma once
// Basic layers: Linear, Norm (LayerNorm/RMSNorm), Dropout. Activations are [rows, features]
// fp32 tensors with rows = seq * batch (Megatron's [s, b, h] order flattened).
#include <string>

#include "core/tensor.h"
#include "model/config.h"
#include "model/context.h"
#include "model/params.h"

namespace mt::model {

struct Linear {
  Param* weight = nullptr;  // [out, in]
  Param* bias = nullptr;    // [out] or null
  int64_t in = 0, out = 0;
  void build(ParamStore& ps, const std::string& prefix, int64_t in, int64_t out, bool bias, Init init);
  Tensor forward(const Tensor& x, PassContext& ctx) const;                 // x saved by caller
  Tensor backward(const Tensor& dy, const Tensor& x, PassContext& ctx) const;  // returns dx
};

struct Norm {
  Param* weight = nullptr;
  Param* bias = nullptr;  // LayerNorm only
  bool rms = false;
  float eps = 1e-5f;
  struct Saved {
    Tensor x, mean, rstd;
  };
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& cfg);
  Tensor forward(const Tensor& x, Saved& s, PassContext& ctx) const;
  Tensor backward(const Tensor& dy, Saved& s, PassContext& ctx) const;
};

// Dropout whose mask is a pure function of (seed, offset): nothing is stored but the offset.
struct Dropout {
  float p = 0.f;
  struct Saved {
    uint64_t seed = 0, offset = 0;
    bool active = false;
  };
  Tensor forward(const Tensor& x, Saved& s, PassContext& ctx) const;  // may return x itself
  Tensor backward(const Tensor& dy, const Saved& s) const;
};

// Rounds activations to bf16 precision in place when the model runs in bf16.
void round_to_bf16_inplace(Tensor& t);

}  // namespace mt::model
