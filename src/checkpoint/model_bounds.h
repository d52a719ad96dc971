#pragma once
// Bounds on model sizes read from files (HF config.json, a checkpoint's recorded arguments):
// beyond every published model, and small enough that products of them (parameter counts,
// buffer sizes) cannot overflow 64 bits. A file asking for more is refused before anything is
// allocated for it.
#include <cstdint>

namespace mt::checkpoint {

constexpr int64_t kMaxLayers = 1 << 14, kMaxHidden = 1 << 18, kMaxFfn = 1 << 20, kMaxHeads = 1 << 14,
                  kMaxHeadDim = 1 << 14, kMaxVocab = 1 << 26, kMaxPositions = 1 << 26, kMaxExperts = 1 << 16;

}  // namespace mt::checkpoint
