// The token dispatchers against the single-rank path, with stand-in experts (expert e scales its
// rows by e + 1; under expert TP each ETP member contributes a share of that, summed back) on
// ranks that route random tokens: combine's output, and the backward's dx and dprobs, match the
// same tokens dispatched on one rank. Covers the corners a training run rarely hits: experts that
// receive nothing, a rank that routes no token at all, uneven counts per rank.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comm/multiprocess.h"
#include "model/moe/token_dispatcher.h"

namespace mt::model {
namespace {

constexpr int64_t kTokens = 12, kHidden = 5, kExperts = 8;

struct Routed {
  Tensor x, probs, map, dy;
};

// Rank r's tokens: top-2 of random scores, except that no token picks expert 0 or 5, and rank 1
// (when `idle_rank`) routes nothing.
Routed tokens_of(int rank, bool idle_rank) {
  std::mt19937 g(1234 + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(kTokens * kHidden), dy(kTokens * kHidden), probs(kTokens * kExperts, 0.f);
  std::vector<int32_t> map(kTokens * kExperts, 0);
  for (auto& v : x) v = u(g);
  for (auto& v : dy) v = u(g);
  for (int64_t t = 0; t < kTokens; ++t) {
    if (idle_rank && rank == 1) break;
    std::vector<int64_t> order = {1, 2, 3, 4, 6, 7};
    std::shuffle(order.begin(), order.end(), g);
    for (int k = 0; k < 2; ++k) {
      map[t * kExperts + order[k]] = 1;
      probs[t * kExperts + order[k]] = 0.25f + 0.5f * std::fabs(u(g));
    }
  }
  return {Tensor::from_vector(x, {kTokens, kHidden}), Tensor::from_vector(probs, {kTokens, kExperts}),
          Tensor::from_vector(map, {kTokens, kExperts}), Tensor::from_vector(dy, {kTokens, kHidden})};
}

// The stand-in experts: rows of local expert i (global first + i) times (first + i + 1) / share.
Tensor scale_rows(const Tensor& rows, const std::vector<int64_t>& counts, int64_t first, float share) {
  Tensor out = rows.clone();
  float* p = out.data<float>();
  int64_t r = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    for (int64_t k = 0; k < counts[i]; ++k, ++r)
      for (int64_t j = 0; j < kHidden; ++j) p[r * kHidden + j] *= static_cast<float>(first + static_cast<int64_t>(i) + 1) / share;
  return out;
}

struct Result {
  std::vector<float> y, dx, dprobs;
};

Result run(const TokenDispatcher& d, const Routed& in, int64_t first, float share) {
  PassContext ctx;
  TokenDispatcher::Saved s;
  std::vector<int64_t> counts;
  std::vector<int32_t> routed;
  const Tensor xp = d.dispatch(in.x, in.probs, in.map, s, counts, routed, ctx, {});
  const Tensor y = d.combine(scale_rows(xp, counts, first, share), s, ctx);
  Tensor dprobs;
  const Tensor dyp = d.combine_backward(in.dy, s, dprobs, ctx, {});
  const Tensor dx = d.dispatch_backward(scale_rows(dyp, counts, first, share), s, ctx);
  return {y.to_vector(), dx.to_vector(), dprobs.to_vector()};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  if (got.size() != want.size()) throw Error(fmt::format("{}: {} values, want {}", what, got.size(), want.size()));
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > 1e-5f * (1.f + std::fabs(want[i])))
      throw Error(fmt::format("{}[{}] = {}, single rank {}", what, i, got[i], want[i]));
}

// `world` ranks as ETP x EP (ETP fastest, as the expert grid lays them out).
void check(const std::string& type, int world, int etp, bool idle_rank) {
  auto res = testing::run_ranks(world, [&](comm::World& w) {
    const int ep_size = world / etp, r = w.rank(), etp_rank = r % etp, ep_rank = r / etp;
    std::vector<int> ep_members, etp_members;
    for (int i = 0; i < ep_size; ++i) ep_members.push_back(etp_rank + etp * i);
    for (int i = 0; i < etp; ++i) etp_members.push_back(ep_rank * etp + i);
    comm::CommPtr ep = w.new_group("ep", ep_members), etp_group = w.new_group("etp", etp_members);
    ExpertParallel where{ep.get(), etp_group.get(), w.world().get()};
    const Routed in = tokens_of(r, idle_rank);
    const int64_t local = kExperts / ep_size;
    const Result got = run(*make_token_dispatcher(type, where, kExperts), in, ep_rank * local, static_cast<float>(etp));
    const Result want = run(*make_token_dispatcher(type, ExpertParallel{}, kExperts), in, 0, 1.f);
    expect_close(got.y, want.y, "y");
    expect_close(got.dx, want.dx, "dx");
    expect_close(got.dprobs, want.dprobs, "dprobs");
  });
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

TEST(TokenDispatcher, AllGatherEP2) { check("allgather", 2, 1, false); }
TEST(TokenDispatcher, AllGatherEP4IdleRank) { check("allgather", 4, 1, true); }
TEST(TokenDispatcher, AllGatherEP2ExpertTP2IdleRank) { check("allgather", 4, 2, true); }
TEST(TokenDispatcher, AllToAllEP2) { check("alltoall", 2, 1, false); }
TEST(TokenDispatcher, AllToAllEP4IdleRank) { check("alltoall", 4, 1, true); }
TEST(TokenDispatcher, AllToAllEP2ExpertTP2IdleRank) { check("alltoall", 4, 2, true); }
TEST(TokenDispatcher, AllToAllExpertTP2) { check("alltoall", 2, 2, false); }

}  // namespace
}  // namespace mt::model
