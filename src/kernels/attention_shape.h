#pragma once
// The shape of one attention call, shared by the CPU and CUDA kernels and the model: q
// [B, Hq, S, D], k/v [B, Hkv, S, D] (Hq = Hkv * group: GQA), the score scale, causal masking and
// attention dropout (p > 0: the normalised probabilities are dropped with Philox keyed by
// (seed, offset, (b*Hq+h)*S*S + i*S + j), regenerated identically in backward).
#include <cstdint>

namespace mt::ops {

struct AttentionShape {
  int64_t B, Hq, Hkv, S, D;
  float scale;  // usually 1/sqrt(D)
  bool causal = true;
  float dropout_p = 0.f;
  uint64_t seed = 0, offset = 0;
};

}  // namespace mt::ops
