#pragma once
// The weight-decay layout of a flat buffer as sorted, non-overlapping segments that cover
// [0, numel) exactly once. Optimizers walk these instead of a per-element mask, which would
// cost a byte per parameter.
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim {

struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
  bool weight_decay = true;
};

// Elements no span covers get weight decay (Megatron decays everything except the params
// it explicitly exempts). Adjacent segments with the same flag are merged. Overlapping or
// out-of-range spans are a caller bug (MT_CHECK).
std::vector<Segment> make_segments(int64_t numel, std::vector<ParamSpan> spans);

// Threads run elementwise loops only above this size; below it, fork/join costs more than
// the work. Elementwise updates give the same bits for any split, so this is free to tune.
constexpr int64_t kParallelThreshold = 1 << 15;

}  // namespace mt::optim
