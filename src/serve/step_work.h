#pragma once
// A tensor-parallel server's ranks run one engine each, and the engines must stay in step: every
// rank must see the same requests join, in the same order, and the same cancellations, at the
// same step (the engine gives ids in submission order, and the logits every rank gathers are the
// same, so the same work gives the same tokens everywhere). Rank 0, which owns the HTTP server,
// decides each step's new work (StepWork) and broadcasts it before the step; every rank applies
// it (apply_work) and steps. Also the single-rank server's loop, without the broadcast.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "inference/engine.h"

namespace mt::serve {

struct StepWork {
  // Requests joining before this step, in submission order. Only what the engine computes with
  // travels (prompt, sampling, lengths, stop tokens, logprobs); callbacks are rank 0's own.
  std::vector<inference::Request> fresh;
  std::vector<inference::RequestId> cancel;  // requests to end (Cancelled) at this step
  bool shutdown = false;                     // the server stopped: leave the loop
};

// The message: int64 words (floats by their bits). decode_work throws mt::Error on a malformed
// message (a rank running another build).
std::vector<int64_t> encode_work(const StepWork& w);
StepWork decode_work(const std::vector<int64_t>& words);

// Collective over `c`: rank 0's `w` is sent, every other rank's is replaced by it. Two broadcasts
// of host memory (the word count, then the words when there are any). Bounded by the group's
// timeout; a rank that is gone fails it (comm::CommError).
void broadcast_work(comm::Communicator& c, StepWork& w);

// Submits w.fresh in order and applies w.cancel. Returns, per fresh request, its id, or 0 where
// the engine refused it (the reason in `errors`, same index): every rank refuses the same ones.
std::vector<inference::RequestId> apply_work(inference::Engine& e, StepWork& w, std::vector<std::string>* errors);

// The loop of ranks other than 0: receive, apply, step, until rank 0 says shutdown. Returns then;
// throws when the group fails (rank 0 gone or stuck past the timeout) or a step fails.
void follow_engine(inference::Engine& e, comm::Communicator& c);

}  // namespace mt::serve
