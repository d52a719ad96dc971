#include "parallel/grid.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace mt::parallel {

RankGrid::RankGrid(int world_size, int tp, int pp, int cp, int ep, int etp) : world_(world_size) {
  if (world_size < 1) fail("world size must be at least 1 (got {})", world_size);
  if (etp == 0) etp = tp;
  for (auto [name, v] : {std::pair{"--tensor-model-parallel-size", tp}, {"--pipeline-model-parallel-size", pp},
                         {"--context-parallel-size", cp}, {"--expert-model-parallel-size", ep},
                         {"--expert-tensor-parallel-size", etp}})
    if (v < 1) fail("{} must be at least 1 (got {})", name, v);
  const int mp = tp * pp * cp;
  if (world_size % mp != 0)
    fail("world size {} is not divisible by --tensor-model-parallel-size ({}) x --pipeline-model-parallel-size ({}) "
         "x --context-parallel-size ({}) = {}; start a multiple of {} processes or change the sizes",
         world_size, tp, pp, cp, mp, mp);
  const int dp = world_size / mp;
  // MoE parallel folding: the expert grid (ETP x EP x EDP) re-factors the TP x CP x DP ranks of a
  // pipeline stage, so ETP x EP must divide them.
  if ((tp * cp * dp) % (etp * ep) != 0)
    fail("--expert-tensor-parallel-size ({}) x --expert-model-parallel-size ({}) must divide the {} ranks of a "
         "pipeline stage (--tensor-model-parallel-size {} x --context-parallel-size {} x data-parallel size {})",
         etp, ep, tp * cp * dp, tp, cp, dp);
  // The dense grid carries EP as 1 (as Megatron's decoder RankGenerator does).
  size_ = {tp, cp, 1, dp, pp};
  ep_ = ep;
  etp_ = etp;
}

RankGrid RankGrid::expert_grid() const {
  RankGrid g;
  g.world_ = world_;
  g.size_ = {etp_, 1, ep_, expert_data_parallel(), pp()};
  g.ep_ = ep_;
  g.etp_ = etp_;
  return g;
}

Coord RankGrid::coord(int rank) const {
  Coord c;
  for (int d = 0; d < kNumDims; ++d) {
    c.at[static_cast<size_t>(d)] = rank % size_[static_cast<size_t>(d)];
    rank /= size_[static_cast<size_t>(d)];
  }
  return c;
}

int RankGrid::rank(const Coord& c) const {
  int r = 0;
  for (int d = kNumDims; d-- > 0;) r = r * size_[static_cast<size_t>(d)] + c.at[static_cast<size_t>(d)];
  return r;
}

std::vector<Dim> RankGrid::parse(const std::string& dims) const {
  std::vector<Dim> out;
  std::stringstream ss(dims);
  std::string tok;
  while (std::getline(ss, tok, '-')) {
    // "etp" and "edp" name the expert grid's TP and DP dimensions (the same slots).
    static const std::pair<const char*, Dim> names[] = {{"tp", kTP}, {"cp", kCP},  {"ep", kEP},  {"dp", kDP},
                                                        {"pp", kPP}, {"etp", kTP}, {"edp", kDP}};
    auto it = std::find_if(std::begin(names), std::end(names), [&](const auto& n) { return tok == n.first; });
    MT_CHECK(it != std::end(names), "unknown grid dimension '{}' in '{}'", tok, dims);
    out.push_back(it->second);
  }
  std::sort(out.begin(), out.end());  // group-rank order is always leftmost-fastest in grid order
  return out;
}

std::vector<int> RankGrid::group(int rank, const std::string& dims) const {
  MT_CHECK(rank >= 0 && rank < world_, "rank {} outside world of {}", rank, world_);
  std::vector<Dim> ds = parse(dims);
  int n = 1;
  for (Dim d : ds) n *= size_[d];
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n));
  Coord base = coord(rank);
  for (int i = 0; i < n; ++i) {
    Coord c = base;
    int k = i;
    for (Dim d : ds) {
      c.at[d] = k % size_[d];
      k /= size_[d];
    }
    out.push_back(this->rank(c));
  }
  return out;
}

std::vector<std::vector<int>> RankGrid::all_groups(const std::string& dims) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    auto g = group(r, dims);
    if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(std::move(g));
  }
  return out;
}

std::vector<int> RankGrid::embedding_group(int rank) const {
  auto pp = group(rank, "pp");
  if (pp.size() == 1) return pp;
  return {pp.front(), pp.back()};
}

}  // namespace mt::parallel
