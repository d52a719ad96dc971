#pragma once
// The weight-decay layout of a flat buffer as sorted, non-overlapping segments that cover
// [0, numel) exactly once: what the update ops walk (ops::DecaySegment) instead of a
// per-element mask, which would cost a byte per parameter.
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "optim/optimizer.h"

namespace mt::optim {

using Segment = ops::DecaySegment;

// Elements no span covers get weight decay (Megatron decays everything except the params
// it explicitly exempts). Adjacent segments with the same flag are merged. Overlapping or
// out-of-range spans are a caller bug (MT_CHECK).
std::vector<Segment> make_segments(int64_t numel, std::vector<ParamSpan> spans);

}  // namespace mt::optim
