#pragma once
// Refuses a model that cannot fit in this machine's memory before any of it is allocated. The
// estimate is a lower bound of what the CPU engine needs (this rank's share of the parameters at
// `bytes_per_param`, plus `extra_bytes` such as the logits), so it never refuses a run that could
// fit. Without it a too-large model fails halfway through building, or is ended by the kernel's
// OOM killer without a word.
#include <cstdint>
#include <string>

#include "model/config.h"

namespace mt {

// `m` must be finalized. `shards`: ranks the parameters are split over (TP x PP). `needs` says
// what the bytes are for in the message ("its fp32 parameters and gradients").
void check_host_memory(const model::TransformerConfig& m, int64_t bytes_per_param, int64_t shards,
                       int64_t extra_bytes, const std::string& needs);

// Physical memory of this machine in bytes (0 when unknown).
int64_t host_memory_bytes();

}  // namespace mt
