#include "parallel/pipeline_layout.h"

#include "core/error.h"

namespace mt::parallel {

PipelineLayout::PipelineLayout(int64_t L, const PipelineOptions& o) {
  const int64_t P = o.pp;
  if (P < 1) fail("--pipeline-model-parallel-size must be at least 1 (got {})", P);
  const bool uneven = o.first_stage_layers != 0 || o.last_stage_layers != 0;
  if (o.num_layers_per_virtual_stage != 0 && o.virtual_stages_per_rank != 0)
    fail("give only one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank");
  if (o.num_layers_per_virtual_stage < 0 || o.virtual_stages_per_rank < 0)
    fail("--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank must be positive");
  if (o.first_stage_layers < 0 || o.last_stage_layers < 0)
    fail("--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers must be positive (got {} / {})",
         o.first_stage_layers, o.last_stage_layers);
  if (uneven && P == 1)
    fail(
        "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers need "
        "--pipeline-model-parallel-size > 1");

  int64_t V = 1;
  if (o.num_layers_per_virtual_stage > 0) {
    if (uneven)
      fail(
          "with --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers give the virtual stages as "
          "--num-virtual-stages-per-pipeline-rank (as Megatron requires)");
    if (L % P != 0) fail("--num-layers ({}) must be divisible by --pipeline-model-parallel-size ({})", L, P);
    if ((L / P) % o.num_layers_per_virtual_stage != 0)
      fail(
          "the layers per pipeline stage ({} = --num-layers / --pipeline-model-parallel-size) must be divisible by "
          "--num-layers-per-virtual-pipeline-stage ({})",
          L / P, o.num_layers_per_virtual_stage);
    V = L / P / o.num_layers_per_virtual_stage;
  } else if (o.virtual_stages_per_rank > 0) {
    V = o.virtual_stages_per_rank;
  }
  // Megatron asks for PP > 2 when p2p overlap is off (--no-overlap-p2p-communication); here p2p
  // is always asynchronous, so PP = 2 works as with overlap on, Megatron's default.
  if (V > 1 && P == 1)
    fail(
        "virtual pipeline stages (--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank) "
        "need --pipeline-model-parallel-size > 1");

  // Layers per rank.
  std::vector<int64_t> per_rank(static_cast<size_t>(P), 0);
  int64_t rest = L, middle_ranks = P;
  if (o.first_stage_layers > 0) rest -= o.first_stage_layers, --middle_ranks;
  if (o.last_stage_layers > 0) rest -= o.last_stage_layers, --middle_ranks;
  if (!uneven && L % P != 0)
    fail(
        "--num-layers ({}) must be divisible by --pipeline-model-parallel-size ({}); or set "
        "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split",
        L, P);
  if (rest < 0 || (middle_ranks == 0 && rest != 0) || (middle_ranks > 0 && rest % middle_ranks != 0))
    fail(
        "--num-layers ({}) minus --decoder-first-pipeline-num-layers ({}) and --decoder-last-pipeline-num-layers ({}) "
        "leaves {} layers, which must split evenly over the other {} pipeline stage(s)",
        L, o.first_stage_layers, o.last_stage_layers, rest, middle_ranks);
  const int64_t mid = middle_ranks > 0 ? rest / middle_ranks : 0;
  for (int64_t r = 0; r < P; ++r) per_rank[static_cast<size_t>(r)] = mid;
  if (o.first_stage_layers > 0) per_rank.front() = o.first_stage_layers;
  if (o.last_stage_layers > 0) per_rank.back() = o.last_stage_layers;
  for (int64_t r = 0; r < P; ++r) {
    const int64_t n = per_rank[static_cast<size_t>(r)];
    if (n % V != 0) {
      const char* which = r == 0 && o.first_stage_layers > 0      ? "--decoder-first-pipeline-num-layers"
                          : r == P - 1 && o.last_stage_layers > 0 ? "--decoder-last-pipeline-num-layers"
                                                                  : "the layers of a middle stage";
      fail("{} ({}) must be divisible by the virtual stages per pipeline rank ({})", which, n, V);
    }
    if (n / V < 1)
      fail(
          "pipeline stage {} would get {} layer(s) for {} virtual stage(s): every virtual stage needs at least one "
          "layer; use fewer stages or more layers",
          r, n, V);
  }
  pp_ = static_cast<int>(P);
  vpp_ = static_cast<int>(V);
  begin_.assign(static_cast<size_t>(P * V + 1), 0);
  for (int64_t v = 0; v < P * V; ++v)
    begin_[static_cast<size_t>(v + 1)] = begin_[static_cast<size_t>(v)] + per_rank[static_cast<size_t>(v % P)] / V;
}

std::pair<int64_t, int64_t> PipelineLayout::range(int rank, int chunk) const {
  MT_CHECK(rank >= 0 && rank < pp_ && chunk >= 0 && chunk < vpp_, "no chunk {} on pipeline rank {}", chunk, rank);
  const size_t v = static_cast<size_t>(chunk * pp_ + rank);
  return {begin_[v], begin_[v + 1]};
}

std::vector<std::pair<int64_t, int64_t>> PipelineLayout::chunks(int rank) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int c = 0; c < vpp_; ++c) out.push_back(range(rank, c));
  return out;
}

}  // namespace mt::parallel
