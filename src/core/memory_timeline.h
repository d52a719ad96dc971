#pragma once
// A memory timeline of the run (--record-memory-history, Megatron's flag; torch records its
// caching allocator's history, this records ours): every tensor allocation and free on the CPU
// and the GPU, and every GPU kernel workspace, with the time, the iteration and the bytes in use
// after it, written at the end as JSON lines (--memory-snapshot-path). Allocations made before
// recording began are not counted, nor their frees, so "in use" is what the recorded part of the
// run holds. Process-wide, like the allocators it listens to; a mutex serialises the events while
// recording, and a relaxed flag keeps the allocators' cost at one load when it is off.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/allocator.h"

namespace mt::memory_timeline {

// Starts recording (what an earlier recording held is dropped). At most `max_events` events are
// kept; later ones are counted as dropped, while the in-use totals and peaks stay exact.
void start(size_t max_events = 2'000'000);
bool recording();
// The iteration the following events belong to (the trainer sets it before each step).
void set_iteration(int64_t iteration);
// From the allocators: `ptr` of `bytes` on `device` was allocated / is being freed.
void on_alloc(Device device, const void* ptr, size_t bytes);
void on_free(Device device, const void* ptr);
// Peak bytes in use on `device` since start().
size_t peak(Device device);
// Stops recording and writes the events to `path` as JSON lines, one event per line:
//   {"t_ms": 12.5, "iteration": 3, "device": "cuda", "bytes": 1048576, "in_use": 73400320}
// (bytes negative for a free), then a summary line {"summary": {...}} with the event count, the
// dropped count and each device's peak. Fails naming `flag` when the file cannot be written.
void stop_and_write(const std::string& path, const std::string& flag = "--memory-snapshot-path");

}  // namespace mt::memory_timeline
