#pragma once
// Which transformer layers each pipeline rank holds, as Megatron splits them: evenly, or with
// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers on the first / last
// stage and the rest spread evenly over the middle ones; with virtual stages, every rank's
// layers are cut into VPP equal chunks and virtual stage v = chunk * PP + rank takes the v-th
// slice of the layer sequence (so chunk c of rank r is followed by chunk c of rank r + 1).
// Layers keep their global index, so parameter names (decoder.layers.<i>...) and checkpoints do
// not depend on the split.
#include <cstdint>
#include <utility>
#include <vector>

namespace mt::parallel {

struct PipelineOptions {
  int64_t pp = 1;
  int64_t num_layers_per_virtual_stage = 0;  // --num-layers-per-virtual-pipeline-stage (0: unset)
  int64_t virtual_stages_per_rank = 0;       // --num-virtual-stages-per-pipeline-rank (0: unset)
  int64_t first_stage_layers = 0;            // --decoder-first-pipeline-num-layers (0: unset)
  int64_t last_stage_layers = 0;             // --decoder-last-pipeline-num-layers (0: unset)
};

class PipelineLayout {
 public:
  // Applies Megatron's rules (errors name the flags). num_layers: the model's --num-layers.
  PipelineLayout(int64_t num_layers, const PipelineOptions& o);
  int pp() const { return pp_; }
  int vpp() const { return vpp_; }
  // Global [begin, end) layer range of `chunk` on pipeline rank `rank`.
  std::pair<int64_t, int64_t> range(int rank, int chunk) const;
  // Every chunk of `rank`, in chunk order.
  std::vector<std::pair<int64_t, int64_t>> chunks(int rank) const;

 private:
  int pp_ = 1, vpp_ = 1;
  std::vector<int64_t> begin_;  // by virtual stage, plus the end
};

}  // namespace mt::parallel
