#pragma once
// Megatron-LM checkpoints as megatron.cpp's own: the weights and Adam state of a `torch_dist`
// (PyTorch distributed checkpoint) or legacy `torch` (mp_rank_00/model_optim_rng.pt) iteration
// directory, under native names (decoder.layers.N.input_layernorm.weight, exp_avg/<param>), as
// whole global tensors, plus the training state a resume needs (iteration, consumed samples,
// optimizer steps, scheduler position) and the run's arguments for --use-checkpoint-args. The
// native loader reshards them like any native checkpoint.
//   torch_dist: layer-stacked tensors ([layers, ...]) split per layer; the layer norms Megatron
//               names linear_qkv.layer_norm_weight / linear_fc1.layer_norm_weight become
//               input_layernorm / pre_mlp_layernorm; the distributed optimizer's flat buffers
//               (fp32 main params, exp_avg, exp_avg_sq per bucket) are cut into parameters in
//               Megatron's buffer order (the model's parameters reversed, starts aligned to 64),
//               checked against the checkpoint's own model weights.
//   torch:      one file per TP x PP rank; this reader takes TP = PP = 1 checkpoints.
#include <map>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/torch_zip.h"

namespace mt::checkpoint::megatron {

enum class Format { None, TorchDist, Torch };
// What Megatron-LM format the iteration directory holds (None: not one).
Format detect_format(const std::string& iter_dir);
const char* format_name(Format f);  // "torch_dist", "torch"

struct Imported {
  std::map<std::string, HostTensor> tensors;  // native names
  TrainingState state;
};

// `weights`: read tensors (false: only the training state and args). Throws mt::Error naming
// the file and the item.
Imported read_checkpoint(const std::string& iter_dir, int64_t iteration, bool weights);

}  // namespace mt::checkpoint::megatron
