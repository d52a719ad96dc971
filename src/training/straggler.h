#pragma once
// --log-straggler: each log interval, every rank's own step time (host wall time inside its
// training steps, averaged over the interval) gathered over all ranks, and the spread reported
// with the slowest and fastest ranks named, in the spirit of Megatron's straggler detector line
// (MnRtt/Rnk, MxRtt/Rnk: min and max round-trip time and their ranks).
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

// `ms`: step time per rank, indexed by rank. `count`: how many slowest and fastest ranks to
// name (--straggler-minmax-count, clamped to the world size).
std::string format_straggler(const std::vector<double>& ms, int64_t count);

}  // namespace mt
