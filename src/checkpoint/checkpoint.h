#pragma once
// Checkpoints, first version (single rank). Layout, as Megatron's:
//   SAVE/latest_checkpointed_iteration.txt      iteration as text, updated last
//   SAVE/iter_0000100/model.safetensors         fp32 main params by Megatron-core names
//   SAVE/iter_0000100/optimizer.safetensors     optimizer state (unless --no-save-optim)
//   SAVE/iter_0000100/state.json                iteration, consumed samples, scheduler, RNG, args
//   SAVE/iter_0000100/metadata.json             CRC32 of every file; written last = complete
// A save goes to SAVE/iter_0000100.tmp.<pid>, is fsynced, renamed into place, and only then does
// the tracker move (itself written to a temporary file and renamed). A failed save leaves the
// previous checkpoint as the latest.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/params.h"
#include "optim/optimizer.h"

namespace mt::checkpoint {

struct TrainingState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t optimizer_steps = 0;  // scheduler position is derived from consumed samples
  bool has_rng = false;
  uint64_t rng_seed = 0, rng_offset = 0;
  int64_t skipped_iterations = 0, nan_iterations = 0;
  nlohmann::json args;  // model/tokenizer settings the checkpoint was made with
};

std::string iteration_dir(const std::string& save, int64_t iteration);

void save_checkpoint(const std::string& save, const TrainingState& state, const model::ParamStore& params,
                     optim::Optimizer* optimizer /* null: --no-save-optim */);

// Reads SAVE/latest_checkpointed_iteration.txt; nullopt when the directory holds no checkpoint.
std::optional<int64_t> latest_iteration(const std::string& load);

struct LoadOptions {
  bool load_optim = true;
  bool load_rng = true;
};
// Loads iteration `it` into params (and optimizer when given and requested); verifies checksums
// and shapes; returns the saved state. Throws mt::Error naming the file or tensor on problems.
TrainingState load_checkpoint(const std::string& load, int64_t it, model::ParamStore& params,
                              optim::Optimizer* optimizer, const LoadOptions& opts);

// Reads only state.json (for generate, which needs the model settings first).
TrainingState read_state(const std::string& load, int64_t it);

}  // namespace mt::checkpoint
