// Collectives over Gloo between forked processes: results, sub-groups, async overlap, and what
// happens when a rank dies or hangs.
#include <gtest/gtest.h>

#include <numeric>

#include "comm/multiprocess.h"

namespace mt::comm {
namespace {

using mt::testing::RankOptions;
using mt::testing::run_ranks;

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("check failed: " + what);
}

void expect_all_ok(const std::vector<mt::testing::RankResult>& res) {
  ASSERT_FALSE(res.empty());
  for (size_t r = 0; r < res.size(); ++r)
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

void collectives(World& w) {
  auto& c = *w.world();
  const int n = c.size(), r = c.rank();
  // all_reduce: sum and max in f32, f64, i64.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + 1) * static_cast<float>(i);
  c.all_reduce(f.data(), f.size());
  const float tri = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < f.size(); ++i) check(f[i] == tri * static_cast<float>(i), "f32 sum");
  double d = c.all_reduce_value(static_cast<double>(r) + 0.5, ReduceOp::Max);
  check(d == n - 0.5, "f64 max");
  check(c.all_reduce_value<int64_t>(r) == n * (n - 1) / 2, "i64 sum");
  // reduce_scatter: rank k gets the sum of everyone's block k; out-of-place and in place.
  const size_t blk = 7;
  std::vector<float> in(blk * static_cast<size_t>(n)), out(blk);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i + static_cast<size_t>(r) * 1000);
  c.reduce_scatter(in.data(), out.data(), blk, DataType::F32);
  for (size_t j = 0; j < blk; ++j) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += static_cast<float>(static_cast<size_t>(r) * blk + j + static_cast<size_t>(q) * 1000);
    check(out[j] == want, "reduce_scatter");
  }
  float* mine = in.data() + static_cast<size_t>(r) * blk;
  c.reduce_scatter(in.data(), mine, blk, DataType::F32);
  check(mine[0] == out[0] && mine[blk - 1] == out[blk - 1], "reduce_scatter in place");
  // all_gather, in place.
  std::vector<double> g(3 * static_cast<size_t>(n), -1);
  for (int k = 0; k < 3; ++k) g[static_cast<size_t>(r * 3 + k)] = r * 10 + k;
  c.all_gather(g.data() + r * 3, g.data(), 3, DataType::F64);
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < 3; ++k) check(g[static_cast<size_t>(q * 3 + k)] == q * 10 + k, "all_gather");
  // broadcast from the last rank.
  std::vector<int32_t> b(5, r);
  c.broadcast(b.data(), b.size(), DataType::I32, n - 1);
  check(b[4] == n - 1, "broadcast");
  // send/recv around a ring, both posted before either waits.
  int32_t to = r * 100, from = -1;
  auto s = c.send_async(&to, 1, DataType::I32, (r + 1) % n);
  auto v = c.recv_async(&from, 1, DataType::I32, (r + n - 1) % n);
  s->wait();
  v->wait();
  check(from == ((r + n - 1) % n) * 100, "ring send/recv");
  // Several async all-reduces in flight, waited in reverse order.
  std::vector<std::vector<float>> bufs(4, std::vector<float>(257, 1.f));
  std::vector<WorkHandle> hs;
  for (auto& bb : bufs) hs.push_back(c.all_reduce_async(bb.data(), bb.size(), DataType::F32, ReduceOp::Sum));
  for (size_t i = hs.size(); i-- > 0;) hs[i]->wait();
  for (auto& bb : bufs) check(bb[256] == static_cast<float>(n), "async all_reduce");
  // all_to_all: rank r sends value 100*r + i to rank i.
  std::vector<int64_t> a2a_in(static_cast<size_t>(n) * 2), a2a_out(a2a_in.size(), -1);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 2; ++k) a2a_in[static_cast<size_t>(i * 2 + k)] = 100 * r + i + 1000 * k;
  c.all_to_all(a2a_in.data(), a2a_out.data(), 2, DataType::I64);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 2; ++k) check(a2a_out[static_cast<size_t>(i * 2 + k)] == 100 * i + r + 1000 * k, "all_to_all");
  c.barrier();
  // A sub-group of the even ranks.
  std::vector<int> even;
  for (int q = 0; q < n; q += 2) even.push_back(q);
  if (r % 2 == 0) {
    auto sub = w.new_group("even", even);
    check(sub->size() == static_cast<int>(even.size()) && sub->rank() == r / 2, "sub-group rank");
    check(sub->all_reduce_value<int64_t>(1) == static_cast<int64_t>(even.size()), "sub-group all_reduce");
  }
}

// all_to_all_v: rank r sends count(r, i) floats to rank i (zeros included, and in the second
// round rank 0 neither sends nor receives anything), value 1000 r + 10 i + k.
void all_to_all_v(World& w) {
  auto& c = *w.world();
  const int n = c.size(), r = c.rank();
  for (int round = 0; round < 2; ++round) {
    auto count = [&](int from, int to) -> size_t {
      if (round == 1 && (from == 0 || to == 0)) return 0;
      return static_cast<size_t>((from + 2 * to + round) % 3);
    };
    std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    std::vector<float> in, out;
    for (int i = 0; i < n; ++i) {
      sc[static_cast<size_t>(i)] = count(r, i);
      rc[static_cast<size_t>(i)] = count(i, r);
      for (size_t k = 0; k < count(r, i); ++k) in.push_back(static_cast<float>(1000 * r + 10 * i) + static_cast<float>(k));
    }
    size_t total = 0;
    for (size_t x : rc) total += x;
    out.assign(total, -1.f);
    c.all_to_all_v(in.empty() ? nullptr : in.data(), sc, out.empty() ? nullptr : out.data(), rc, DataType::F32);
    size_t pos = 0;
    for (int i = 0; i < n; ++i)
      for (size_t k = 0; k < count(i, r); ++k)
        check(out[pos++] == static_cast<float>(1000 * i + 10 * r) + static_cast<float>(k), "all_to_all_v");
  }
  // The operation after it still matches up on every rank.
  check(c.all_reduce_value<int64_t>(1) == n, "all_reduce after all_to_all_v");
}

TEST(Collectives, AllToAllVThreeRanks) { expect_all_ok(run_ranks(3, all_to_all_v)); }
TEST(Collectives, AllToAllVFourRanks) { expect_all_ok(run_ranks(4, all_to_all_v)); }

TEST(Collectives, ThreeRanks) { expect_all_ok(run_ranks(3, collectives)); }
TEST(Collectives, FourRanks) { expect_all_ok(run_ranks(4, collectives)); }

TEST(Collectives, DeadRankIsNamedAndOthersExitQuickly) {
  RankOptions o;
  o.comm_timeout = std::chrono::seconds(60);
  auto res = run_ranks(3, [](World& w) {
    w.world()->barrier();
    if (w.rank() == 2) ::raise(SIGKILL);
    std::vector<float> x(100, 1.f);
    for (int i = 0; i < 1000; ++i) w.world()->all_reduce(x.data(), x.size());
  }, o);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[2].signal, SIGKILL);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[static_cast<size_t>(r)].exit_code, 2) << res[static_cast<size_t>(r)].stderr_text;
    EXPECT_NE(res[static_cast<size_t>(r)].stderr_text.find("world rank 2 exited or crashed"), std::string::npos)
        << res[static_cast<size_t>(r)].stderr_text;
    EXPECT_LT(res[static_cast<size_t>(r)].seconds, 20.0);  // far inside the 60 s timeout
    std::printf("rank %d code %d signal %d: %s\n", r, res[static_cast<size_t>(r)].exit_code, res[static_cast<size_t>(r)].signal, res[static_cast<size_t>(r)].stderr_text.c_str());
  }
}

TEST(Collectives, StuckRankTimesOutWithAClearError) {
  RankOptions o;
  o.comm_timeout = std::chrono::milliseconds(1000);
  o.deadline = std::chrono::seconds(30);
  auto res = run_ranks(2, [](World& w) {
    w.world()->barrier();
    if (w.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(4));  // stuck, but alive
      return;
    }
    float x = 1;
    w.world()->all_reduce(&x, 1);
  }, o);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0].exit_code, 2);
  EXPECT_NE(res[0].stderr_text.find("--distributed-timeout-minutes"), std::string::npos) << res[0].stderr_text;
  EXPECT_LT(res[0].seconds, 3.5);
  std::printf("%s", res[0].stderr_text.c_str());
}

}  // namespace
}  // namespace mt::comm
