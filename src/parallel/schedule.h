#pragma once
// Pipeline schedules as plain data: the order in which one pipeline rank runs the forward and
// backward passes of its micro-batches, and which neighbour each pass receives from and sends
// to. Megatron's three schedules come out of one definition:
//  * no pipelining (PP = 1): F0 B0 F1 B1 ... (gradient accumulation);
//  * 1F1B (PP > 1, one model chunk per rank): rank r runs min(PP - r - 1, M) warm-up forwards,
//    then alternates one forward and one backward, then drains the remaining backwards, so at
//    most PP - r micro-batches hold activations at once;
//  * interleaved 1F1B (VPP > 1 model chunks per rank): the forwards follow Megatron's schedule
//    table (groups of N micro-batches, every chunk in turn), the backwards the same table with
//    the chunks reversed, after (PP - r - 1) * 2 + (VPP - 1) * N warm-up forwards.
// Virtual stage v = chunk * PP + rank holds the v-th slice of the layers: activations flow
// from virtual stage v to v + 1, i.e. to the next rank, and from the last rank to rank 0 when
// the chunk changes. Keeping this pure lets tests check orders and simulate every layout for
// deadlocks without processes.
#include <cstdint>
#include <vector>

namespace mt::parallel {

struct ScheduleSpec {
  int pp = 1;                 // pipeline ranks
  int vpp = 1;                // model chunks (virtual stages) per rank
  int rank = 0;               // this pipeline rank
  int64_t microbatches = 1;   // M per global batch (per data-parallel rank)
  int64_t group = 0;          // interleaved: micro-batches per chunk in turn (N); 0: PP (Megatron's default)
  bool forward_only = false;  // evaluation: forwards only, in schedule-table order
};

struct Action {
  enum Kind : uint8_t { Forward, Backward };
  Kind kind = Forward;
  int chunk = 0;
  int64_t microbatch = 0;
  bool operator==(const Action&) const = default;
  auto operator<=>(const Action&) const = default;
};

// The ordered passes of spec.rank. Valid specs only (see check_interleaved_microbatches).
std::vector<Action> build_schedule(const ScheduleSpec& spec);

// Forwards run before the first backward (Megatron's num_warmup_microbatches), over all chunks.
int64_t warmup_passes(const ScheduleSpec& spec);

// Megatron's interleaved schedule table: entry k is the (micro-batch, chunk) of the k-th
// forward on every rank.
std::vector<std::pair<int64_t, int>> schedule_table(int64_t microbatches, int vpp, int64_t group);

// Megatron's micro-batch rules for the interleaved schedule as errors naming the flags:
// PP <= N <= M, and the last group holds all N or at least PP micro-batches.
void check_interleaved_microbatches(int64_t microbatches, int pp, int64_t group);

// Point-to-point traffic of one pass on `rank`: the pipeline rank its input comes from and the
// rank its output goes to (-1: none; the first virtual stage reads tokens, the last computes
// the loss). A forward sends activations to the next virtual stage; a backward sends the input
// gradient to the previous one.
struct PassComm {
  int recv_from = -1;
  int send_to = -1;
};
PassComm pass_comm(const Action& a, int pp, int vpp, int rank);

// The pass on the receiving rank that consumes what `a` (run on `rank`) sends: the same
// micro-batch and kind, on the next (forward) or previous (backward) virtual stage.
Action consumer_of(const Action& a, int pp, int rank);

}  // namespace mt::parallel
