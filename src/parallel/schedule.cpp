#include "parallel/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace mt::parallel {

namespace {
int64_t group_of(const ScheduleSpec& s) { return s.group > 0 ? s.group : s.pp; }
}  // namespace

std::vector<std::pair<int64_t, int>> schedule_table(int64_t microbatches, int vpp, int64_t group) {
  std::vector<std::pair<int64_t, int>> t;
  t.reserve(static_cast<size_t>(microbatches * vpp));
  for (int64_t lo = 0; lo < microbatches; lo += group) {
    // The last group takes whatever is left (Megatron's rules keep it >= PP).
    const int64_t hi = lo + group >= microbatches ? microbatches : lo + group;
    for (int c = 0; c < vpp; ++c)
      for (int64_t m = lo; m < hi; ++m) t.emplace_back(m, c);
    if (hi == microbatches) break;
  }
  return t;
}

int64_t warmup_passes(const ScheduleSpec& s) {
  const int64_t total = s.microbatches * s.vpp;
  if (s.forward_only) return total;
  const int64_t w =
      s.vpp == 1 ? s.pp - s.rank - 1 : static_cast<int64_t>(s.pp - s.rank - 1) * 2 + (s.vpp - 1) * group_of(s);
  return std::min(w, total);
}

std::vector<Action> build_schedule(const ScheduleSpec& s) {
  MT_CHECK(s.pp >= 1 && s.vpp >= 1 && s.rank >= 0 && s.rank < s.pp && s.microbatches >= 1, "bad schedule spec");
  MT_CHECK(s.vpp == 1 || s.pp > 1, "virtual pipeline stages need more than one pipeline rank");
  const int64_t total = s.microbatches * s.vpp;
  // k-th forward and k-th backward of this rank.
  std::vector<std::pair<int64_t, int>> table = s.vpp == 1 ? schedule_table(s.microbatches, 1, s.microbatches)
                                                          : schedule_table(s.microbatches, s.vpp, group_of(s));
  auto fwd = [&](int64_t k) {
    return Action{Action::Forward, table[static_cast<size_t>(k)].second, table[static_cast<size_t>(k)].first};
  };
  auto bwd = [&](int64_t k) {
    return Action{Action::Backward, s.vpp - 1 - table[static_cast<size_t>(k)].second,
                  table[static_cast<size_t>(k)].first};
  };
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(2 * total));
  const int64_t w = warmup_passes(s);
  for (int64_t k = 0; k < w; ++k) out.push_back(fwd(k));
  if (s.forward_only) return out;
  for (int64_t k = 0; k < total - w; ++k) {  // steady state: one forward, one backward
    out.push_back(fwd(w + k));
    out.push_back(bwd(k));
  }
  for (int64_t k = total - w; k < total; ++k) out.push_back(bwd(k));  // cool-down
  return out;
}

void check_interleaved_microbatches(int64_t microbatches, int pp, int64_t group) {
  if (group <= 0) group = pp;
  if (microbatches < pp)
    fail(
        "the interleaved pipeline schedule needs at least --pipeline-model-parallel-size ({}) micro-batches per "
        "global batch, got {} (= --global-batch-size / (--micro-batch-size x data-parallel size)); raise "
        "--global-batch-size or lower --micro-batch-size",
        pp, microbatches);
  if (group < pp || group > microbatches)
    fail(
        "--microbatch-group-size-per-virtual-pipeline-stage ({}) must lie between --pipeline-model-parallel-size "
        "({}) and the micro-batches per global batch ({})",
        group, pp, microbatches);
  const int64_t rest = microbatches % group;
  if (rest > 0 && rest < pp)
    fail(
        "the interleaved pipeline schedule needs the micro-batches per global batch ({}) to be a multiple of {} "
        "(--microbatch-group-size-per-virtual-pipeline-stage, default --pipeline-model-parallel-size) or to leave a "
        "remainder of at least --pipeline-model-parallel-size ({}); {} are left over, which would stall the pipeline; "
        "change --global-batch-size or --micro-batch-size",
        microbatches, group, pp, rest);
}

PassComm pass_comm(const Action& a, int pp, int vpp, int rank) {
  const int v = a.chunk * pp + rank, last = vpp * pp - 1;
  const int prev = (rank - 1 + pp) % pp, next = (rank + 1) % pp;
  if (a.kind == Action::Forward) return {v == 0 ? -1 : prev, v == last ? -1 : next};
  return {v == last ? -1 : next, v == 0 ? -1 : prev};
}

Action consumer_of(const Action& a, int pp, int rank) {
  Action c = a;
  if (a.kind == Action::Forward && rank == pp - 1) c.chunk += 1;  // wraps to rank 0's next chunk
  if (a.kind == Action::Backward && rank == 0) c.chunk -= 1;      // wraps to the last rank's previous chunk
  return c;
}

}  // namespace mt::parallel
