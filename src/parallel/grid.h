#pragma once
// The rank grid (DESIGN.md): ranks are laid out in the order tp-cp-ep-dp-pp, leftmost fastest,
//   rank = tp + TP*(cp + CP*(ep + EP*(dp + DP*pp)))
// as Megatron's RankGenerator lays out the dense (non-expert) grid, where EP is 1:
//   rank = tp + TP*(cp + CP*(dp + DP*pp)),  DP = world / (TP*CP*PP).
// MoE layers re-factor the same TP*CP*DP ranks of each pipeline stage as etp-ep-edp (Megatron's
// "MoE parallel folding", its expert RankGenerator with CP 1):
//   rank = etp + ETP*(ep + EP*(edp + EDP*pp)),  EDP = TP*CP*DP / (ETP*EP)
// expert_grid() is that second grid; its dimensions answer to "etp" (= "tp"), "ep" and "edp"
// (= "dp"). A process group is named by the dimensions that vary inside it: "tp" is the TP group,
// "tp-pp" the model-parallel group, "dp-cp" the gradient-reduction group under context
// parallelism; on the expert grid "etp-ep" is the allgather dispatcher's group, "edp" the expert
// gradients' reduction group, and so on.
#include <array>
#include <string>
#include <vector>

namespace mt::parallel {

enum Dim { kTP = 0, kCP = 1, kEP = 2, kDP = 3, kPP = 4, kNumDims = 5 };

struct Coord {
  std::array<int, kNumDims> at{};  // indexed by Dim
  int tp() const { return at[kTP]; }
  int cp() const { return at[kCP]; }
  int ep() const { return at[kEP]; }
  int dp() const { return at[kDP]; }
  int pp() const { return at[kPP]; }
};

class RankGrid {
 public:
  // Derives DP = world / (TP*CP*PP) and EDP = TP*CP*DP / (ETP*EP); throws mt::Error naming the
  // flags when either does not divide. `etp` 0 means TP (Megatron's default expert TP size).
  RankGrid(int world_size, int tp, int pp, int cp = 1, int ep = 1, int etp = 0);
  int world() const { return world_; }
  int size(Dim d) const { return size_[d]; }
  int tp() const { return size_[kTP]; }
  int cp() const { return size_[kCP]; }
  int dp() const { return size_[kDP]; }
  int pp() const { return size_[kPP]; }
  // The expert sizes (on the dense grid EP is 1 as a dimension; these size the expert grid).
  int expert_model_parallel() const { return ep_; }
  int expert_tensor_parallel() const { return etp_; }
  int expert_data_parallel() const { return tp() * cp() * dp() / (ep_ * etp_); }
  // The expert grid of the same ranks: sizes (ETP, 1, EP, EDP, PP).
  RankGrid expert_grid() const;

  Coord coord(int rank) const;
  int rank(const Coord& c) const;
  // The members of `rank`'s group over the dimensions named in `dims` ("tp", "dp-cp", "tp-pp",
  // ...), in group-rank order (leftmost dimension fastest). Throws on an unknown name.
  std::vector<int> group(int rank, const std::string& dims) const;
  // Every group of that kind, each in group-rank order (what Megatron's get_ranks returns).
  std::vector<std::vector<int>> all_groups(const std::string& dims) const;
  // The embedding group: the first and last pipeline stages that share `rank`'s other coordinates.
  std::vector<int> embedding_group(int rank) const;

 private:
  RankGrid() = default;
  std::vector<Dim> parse(const std::string& dims) const;
  int world_ = 1;
  std::array<int, kNumDims> size_{1, 1, 1, 1, 1};
  int ep_ = 1, etp_ = 1;
};

}  // namespace mt::parallel
