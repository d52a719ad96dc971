#pragma once
// The rank grid (DESIGN.md): ranks are laid out in the order tp-cp-ep-dp-pp, leftmost fastest,
//   rank = tp + TP*(cp + CP*(ep + EP*(dp + DP*pp)))
// as Megatron's RankGenerator lays out the dense (non-expert) grid, where EP is 1 and the
// expert-parallel split happens inside DP x CP. A process group is named by the dimensions that
// vary inside it: "tp" is the TP group, "tp-pp" the model-parallel group, "dp-cp" the
// gradient-reduction group under context parallelism, and so on.
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
  // Derives DP = world / (TP*CP*EP*PP); throws mt::Error naming the flags when that does not divide.
  RankGrid(int world_size, int tp, int pp, int cp = 1, int ep = 1);
  int world() const { return world_; }
  int size(Dim d) const { return size_[d]; }
  int tp() const { return size_[kTP]; }
  int cp() const { return size_[kCP]; }
  int ep() const { return size_[kEP]; }
  int dp() const { return size_[kDP]; }
  int pp() const { return size_[kPP]; }

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
  std::vector<Dim> parse(const std::string& dims) const;
  int world_;
  std::array<int, kNumDims> size_{};
};

}  // namespace mt::parallel
