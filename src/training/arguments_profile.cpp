// Pretrain's profiling section: Megatron's --profile window for nsys (cudaProfilerStart/Stop
// through the device layer) and NVTX ranges.
#include <cstdlib>

#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_profile_flags(FlagParser& p, ProfileArgs& a) {
  p.store_true("--profile", &a.profile,
               "call cudaProfilerStart/Stop around iterations (--profile-step-start, --profile-step-end] for "
               "nsys --capture-range=cudaProfilerApi, with NVTX ranges (CUDA builds; nothing on the CPU)");
  p.value("--profile-step-start", &a.profile_step_start, "iteration after which profiling starts (default 10)",
          {0, INT64_MAX});
  p.value("--profile-step-end", &a.profile_step_end, "iteration after which profiling stops (default 12)",
          {0, INT64_MAX});
  p.list("--profile-ranks", &a.profile_ranks, "global ranks that profile (default 0)");
  p.store_true("--nvtx-ranges", &a.nvtx_ranges, "NVTX ranges per layer and per pipeline action (CUDA builds)");
  p.store_true("--record-memory-history", &a.record_memory_history,
               "record every tensor allocation and free (CPU and GPU, GPU kernel workspaces too) with its time, "
               "iteration and the bytes in use, written at the end to --memory-snapshot-path");
  p.value("--memory-snapshot-path", &a.memory_snapshot_path,
          "where --record-memory-history writes its timeline (default snapshot.pickle, Megatron's name; the content is "
          "JSON lines, one event per line and a summary line)");
}

void validate_profile_args(const ProfileArgs& a) {
  if (a.memory_snapshot_path.empty()) fail("--memory-snapshot-path must name a file");
  if (a.profile && a.profile_step_end <= a.profile_step_start)
    fail("--profile-step-end ({}) must be after --profile-step-start ({})", a.profile_step_end, a.profile_step_start);
  for (const auto& r : a.profile_ranks) {
    char* end = nullptr;
    const long long v = std::strtoll(r.c_str(), &end, 10);
    if (r.empty() || *end != '\0' || v < 0 || v > (1 << 24)) fail("--profile-ranks: '{}' is not a rank", r);
  }
}

}  // namespace mt
