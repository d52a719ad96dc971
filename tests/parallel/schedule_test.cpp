// Pipeline schedules: the per-rank order of forward and backward passes matches the 1F1B and
// interleaved 1F1B definitions (written out by hand here), and a simulation of every rank of
// many layouts, with the runner's message rules, finishes without deadlock and within the
// activation-memory bound.
#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace mt::parallel {
namespace {

// "F3" / "B3" (one chunk) or "F3.1" (micro-batch 3 of chunk 1).
std::string order(const ScheduleSpec& s) {
  std::ostringstream o;
  for (const Action& a : build_schedule(s)) {
    o << (o.tellp() > 0 ? " " : "") << (a.kind == Action::Forward ? "F" : "B") << a.microbatch;
    if (s.vpp > 1) o << "." << a.chunk;
  }
  return o.str();
}

TEST(Schedule, NoPipeliningIsGradientAccumulation) {
  EXPECT_EQ(order({.pp = 1, .microbatches = 3}), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(order({.pp = 1, .microbatches = 3, .forward_only = true}), "F0 F1 F2");
}

TEST(Schedule, OneFOneBWarmupSteadyCooldown) {
  // PP - rank - 1 warm-up forwards, then one forward / one backward, then the backwards left.
  EXPECT_EQ(order({.pp = 4, .rank = 0, .microbatches = 8}), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(order({.pp = 4, .rank = 1, .microbatches = 8}), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(order({.pp = 4, .rank = 2, .microbatches = 8}), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(order({.pp = 4, .rank = 3, .microbatches = 8}), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than stages: warm-up is capped at M.
  EXPECT_EQ(order({.pp = 4, .rank = 0, .microbatches = 2}), "F0 F1 B0 B1");
  EXPECT_EQ(order({.pp = 4, .rank = 2, .microbatches = 2}), "F0 F1 B0 B1");  // one warm-up forward
  EXPECT_EQ(order({.pp = 4, .rank = 3, .microbatches = 2}), "F0 B0 F1 B1");
}

TEST(Schedule, MegatronScheduleTable) {
  // The table from Megatron's interleaved schedule for PP 2, N 3, M 5, VP 2.
  auto t = schedule_table(5, 2, 3);
  std::vector<int64_t> mb;
  std::vector<int> chunk;
  for (auto [m, c] : t) mb.push_back(m), chunk.push_back(c);
  EXPECT_EQ(mb, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunk, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(order({.pp = 2, .vpp = 2, .microbatches = 5, .group = 3, .forward_only = true}),
            "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 F3.0 F4.0 F3.1 F4.1");
}

TEST(Schedule, Interleaved) {
  // PP 2, VP 2, M 4 (groups of PP = 2): rank 0 warms up with (PP-1)*2 + (VP-1)*2 = 4 forwards,
  // rank 1 with 2; backwards walk the table with the chunks reversed.
  EXPECT_EQ(order({.pp = 2, .vpp = 2, .rank = 0, .microbatches = 4}),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order({.pp = 2, .vpp = 2, .rank = 1, .microbatches = 4}),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // PP 4, VP 2, M 4: the first rank holds everything in warm-up ((4-1)*2 + 4 = 10 > 8).
  EXPECT_EQ(warmup_passes({.pp = 4, .vpp = 2, .rank = 0, .microbatches = 4}), 8);
  EXPECT_EQ(warmup_passes({.pp = 4, .vpp = 2, .rank = 3, .microbatches = 4}), 4);
}

TEST(Schedule, InterleavedMicrobatchRules) {
  EXPECT_NO_THROW(check_interleaved_microbatches(8, 4, 0));
  EXPECT_NO_THROW(check_interleaved_microbatches(10, 2, 4));     // groups 4, 4, then 2 >= PP
  EXPECT_THROW(check_interleaved_microbatches(2, 4, 0), Error);  // M < PP
  EXPECT_THROW(check_interleaved_microbatches(6, 4, 0), Error);  // 6 % 4 = 2 < PP
  EXPECT_THROW(check_interleaved_microbatches(8, 4, 2), Error);  // group < PP
  EXPECT_THROW(check_interleaved_microbatches(8, 4, 9), Error);  // group > M
  try {
    check_interleaved_microbatches(6, 4, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch-size"), std::string::npos) << e.what();
  }
}

// Runs every rank's schedule with the runner's rules: a pass waits for its input message; sends
// do not block, except in forward-only chains without virtual stages, where a rank waits for its
// previous send to be consumed before it sends again. Fails on a deadlock, on a message nobody
// consumes, and checks each rank's activation bound.
void simulate(const ScheduleSpec& base) {
  const int P = base.pp;
  std::vector<std::vector<Action>> passes(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    ScheduleSpec s = base;
    s.rank = r;
    passes[static_cast<size_t>(r)] = build_schedule(s);
    // Every (chunk, micro-batch) runs forward once and, when training, backward once after it.
    std::map<std::pair<int, int64_t>, int> seen;
    for (const Action& a : passes[static_cast<size_t>(r)]) {
      int& st = seen[{a.chunk, a.microbatch}];
      if (a.kind == Action::Forward) {
        ASSERT_EQ(st, 0);
        st = 1;
      } else {
        ASSERT_EQ(st, 1);
        st = 2;
      }
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), base.microbatches * base.vpp);
  }
  std::set<std::tuple<int, int, Action>> sent;                  // (from, to, consuming pass)
  std::map<std::pair<int, int>, std::pair<Action, bool>> last;  // (from, to) -> last send, consumed?
  std::vector<size_t> pos(static_cast<size_t>(P), 0);
  std::vector<int64_t> live(static_cast<size_t>(P), 0), peak(static_cast<size_t>(P), 0);
  const bool chain = base.forward_only && base.vpp == 1;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      auto& i = pos[static_cast<size_t>(r)];
      if (i == passes[static_cast<size_t>(r)].size()) continue;
      const Action& a = passes[static_cast<size_t>(r)][i];
      const PassComm c = pass_comm(a, P, base.vpp, r);
      if (c.recv_from >= 0 && !sent.count({c.recv_from, r, a})) continue;
      if (chain && c.send_to >= 0) {
        auto it = last.find({r, c.send_to});
        if (it != last.end() && !it->second.second) continue;
      }
      if (c.recv_from >= 0) {
        sent.erase({c.recv_from, r, a});
        auto it = last.find({c.recv_from, r});
        if (it != last.end() && it->second.first == a) it->second.second = true;
      }
      if (c.send_to >= 0) {
        const Action to = consumer_of(a, P, r);
        sent.insert({r, c.send_to, to});
        last[{r, c.send_to}] = {to, false};
      }
      int64_t& l = live[static_cast<size_t>(r)];
      l += a.kind == Action::Forward && !base.forward_only ? 1 : (a.kind == Action::Backward ? -1 : 0);
      peak[static_cast<size_t>(r)] = std::max(peak[static_cast<size_t>(r)], l);
      ++i;
      progress = true;
    }
  }
  for (int r = 0; r < P; ++r)
    ASSERT_EQ(pos[static_cast<size_t>(r)], passes[static_cast<size_t>(r)].size())
        << "deadlock: pp " << P << " vpp " << base.vpp << " M " << base.microbatches << " rank " << r;
  ASSERT_TRUE(sent.empty());
  if (base.forward_only) return;
  for (int r = 0; r < P; ++r) {
    ScheduleSpec s = base;
    s.rank = r;
    const int64_t bound = base.vpp == 1 ? std::min<int64_t>(P - r, base.microbatches)  // 1F1B: PP - rank
                                        : std::min(warmup_passes(s) + 1, base.microbatches * base.vpp);
    EXPECT_LE(peak[static_cast<size_t>(r)], bound) << "pp " << P << " vpp " << base.vpp << " rank " << r;
  }
}

TEST(Schedule, EveryLayoutRunsWithoutDeadlock) {
  int layouts = 0;
  for (int P = 1; P <= 6; ++P)
    for (int V = 1; V <= 3; ++V)
      for (int64_t M = 1; M <= 13; ++M)
        for (int64_t N = 0; N <= M; ++N)
          for (bool fwd : {false, true}) {
            if (V > 1 && P == 1) continue;
            if (V == 1 && N > 0) continue;
            if (V > 1) {
              try {
                check_interleaved_microbatches(M, P, N);
              } catch (const Error&) {
                continue;
              }
            }
            simulate({.pp = P, .vpp = V, .microbatches = M, .group = N, .forward_only = fwd});
            if (HasFatalFailure()) return;
            ++layouts;
          }
  EXPECT_GT(layouts, 500);
}

TEST(Schedule, PassCommunication) {
  // PP 2, VP 2: chunk 0 on rank 1 feeds chunk 1 on rank 0 (virtual stage 1 -> 2).
  EXPECT_EQ(pass_comm({Action::Forward, 0, 0}, 2, 2, 1).send_to, 0);
  EXPECT_EQ(consumer_of({Action::Forward, 0, 5}, 2, 1), (Action{Action::Forward, 1, 5}));
  EXPECT_EQ(pass_comm({Action::Forward, 0, 0}, 2, 2, 0).recv_from, -1);  // embedding
  EXPECT_EQ(pass_comm({Action::Forward, 1, 0}, 2, 2, 1).send_to, -1);    // loss
  EXPECT_EQ(pass_comm({Action::Backward, 1, 0}, 2, 2, 0).send_to, 1);    // back to chunk 0 of rank 1
  EXPECT_EQ(consumer_of({Action::Backward, 1, 3}, 2, 0), (Action{Action::Backward, 0, 3}));
}

}  // namespace
}  // namespace mt::parallel
