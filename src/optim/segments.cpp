#include "optim/segments.h"

#include <algorithm>

#include "core/error.h"

namespace mt::optim {

namespace {
void push(std::vector<Segment>& out, int64_t begin, int64_t end, bool decay) {
  if (begin == end) return;
  if (!out.empty() && out.back().end == begin && out.back().weight_decay == decay) {
    out.back().end = end;
    return;
  }
  out.push_back({begin, end, decay});
}
}  // namespace

SegmentGroups make_segment_groups(int64_t numel, std::vector<ParamSpan> spans) {
  MT_CHECK(numel >= 0, "numel {}", numel);
  std::sort(spans.begin(), spans.end(),
            [](const ParamSpan& a, const ParamSpan& b) { return a.offset < b.offset; });
  SegmentGroups out;
  int64_t pos = 0;
  for (const ParamSpan& s : spans) {
    MT_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= numel,
             "span [{}, {}) outside buffer of {}", s.offset, s.offset + s.numel, numel);
    MT_CHECK(s.offset >= pos, "span at {} overlaps the previous span ending at {}", s.offset, pos);
    push(out.main, pos, s.offset, true);
    push(s.decoupled_lr ? out.decoupled : out.main, s.offset, s.offset + s.numel, s.weight_decay);
    pos = s.offset + s.numel;
  }
  push(out.main, pos, numel, true);
  return out;
}

}  // namespace mt::optim
