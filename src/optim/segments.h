#pragma once
// The weight-decay layout of a flat buffer as sorted, non-overlapping segments that cover
// [0, numel) exactly once (both learning-rate groups together): what the update ops walk
// (ops::DecaySegment) instead of a per-element mask, which would cost a byte per parameter.
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "optim/optimizer.h"

namespace mt::optim {

using Segment = ops::DecaySegment;

// Split by learning-rate group (ParamSpan::decoupled_lr): an update steps each group with its own
// rate, one op call per group (the ops touch only the segments they are given). Elements no span
// covers get weight decay (Megatron decays everything except the params it explicitly exempts)
// and the default group. Adjacent segments with the same flag are merged. Overlapping or
// out-of-range spans are a caller bug (MT_CHECK).
struct SegmentGroups {
  std::vector<Segment> main, decoupled;
};
SegmentGroups make_segment_groups(int64_t numel, std::vector<ParamSpan> spans);

}  // namespace mt::optim
