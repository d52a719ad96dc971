#pragma once
// The JSON files of a native checkpoint, parsed and validated before anything in them is used:
// metadata.json (its files, the pieces of every tensor, the layout and the RNG streams) and
// state.json (iteration, sample counts, scheduler, RNG, loss scaler, model arguments). A piece
// whose box has another rank than its tensor, reaches past the tensor, or names a file outside
// the iteration directory is refused here, naming the file and the tensor, so the loader's copy
// loops can trust every index they compute.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/slices.h"

namespace mt::checkpoint {

struct FileInfo {
  uint32_t crc = 0;
  int64_t bytes = -1;  // -1: unknown (version 1)
};

struct RngEntry {
  int64_t rank = 0;
  uint64_t seed = 0, offset = 0, tp_seed = 0, tp_offset = 0;
};

struct Metadata {
  int64_t version = 2;
  std::map<std::string, FileInfo> files;       // plain names inside the iteration directory
  std::map<std::string, TensorIndex> tensors;  // version 2 (version 1 lists whole tensors in its files)
  int64_t tp = 1, pp = 1, dp = 1;              // the layout that saved
  std::vector<RngEntry> rng;
  nlohmann::json fp8;  // FP8 scaling state, checked where it is loaded (checkpoint/fp8_state.h)
};

// Bounds on counts read from a checkpoint: far beyond any real run, small enough that the
// arithmetic done with them cannot overflow.
constexpr int64_t kMaxIteration = 1'000'000'000'000;  // 1e12 iterations
constexpr int64_t kMaxSamples = 1'000'000'000'000'000;  // 1e15 samples

// `where` names the file (its path) in errors.
Metadata parse_metadata(const nlohmann::json& j, const std::string& where);
// `iteration`: the one the tracker and the directory name say (kReleaseIteration: any).
TrainingState parse_state(const nlohmann::json& j, const std::string& where, int64_t iteration);

}  // namespace mt::checkpoint
