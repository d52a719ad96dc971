#pragma once
// Writing Megatron-LM `torch_dist` checkpoints (PyTorch distributed checkpoints) that Megatron-LM
// loads: one data file __0_0.distcp of torch.save items, the .metadata pickle indexing them, and
// Megatron's metadata.json and tracker. The layout follows the fixture Megatron-LM wrote
// (tests/fixtures/megatron_ckpt/ck_dist): layer-stacked tensors [layers, ...] with one chunk per
// layer (fc1 under SwiGLU: its gate and up halves), the plain optimizer's exp_avg / exp_avg_sq
// under optimizer.state.*, fp32; the common state (args, iteration, scheduler, param groups,
// step) and the rerun state machine's as torch.save'd objects. No RNG state is written: the
// Megatron-LM run that loads it needs --no-load-rng.
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"

namespace mt::checkpoint::megatron {

// Writes iteration `st.iteration` of `reader`'s checkpoint (native names, any layout, or a
// Megatron-LM checkpoint read alike) into SAVE/iter_NNNNNNN and moves SAVE's tracker to it.
// Throws mt::Error naming tensors megatron.cpp cannot place in Megatron's layout (MoE experts).
void write_torch_dist(const std::string& save, CheckpointReader& reader);

}  // namespace mt::checkpoint::megatron
