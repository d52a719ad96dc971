#pragma once
// Megatron Core's MoE token dispatchers: how the tokens an MoE layer's router sent to experts
// reach the ranks that hold those experts (expert parallelism), and how the experts' outputs come
// back, weighted by the routing probs (--moe-token-dispatcher-type).
//   allgather  Every rank of the ETP x EP group gathers the group's tokens (with their probs and
//              routing map), runs its local experts on the rows routed to them, unpermutes into a
//              partial output and reduce-scatters it back: the sum adds the other EP ranks'
//              experts and, under expert TP, the partial fc2 sums. Backward mirrors it.
//   alltoall   Each rank permutes its own tokens expert-major and sends every expert's rows to the
//              EP rank that holds it (all-to-all-v after an exchange of the row counts); under
//              expert TP the ETP members then gather each other's received rows (each runs its
//              fc1/fc2 shard on all of them, and the partial outputs are summed back); the chunks
//              are sorted from (source, local expert) into expert-major order (Megatron's
//              sort_chunks_by_idxs), and after the experts it all runs in reverse.
// In a group of one both are the single-rank path: plan, permute, experts, unpermute.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/context.h"

namespace mt::model {

// Where an MoE layer's experts live (ModelOptions::expert): this rank's expert-parallel groups
// (parallel::ProcessGroups). Null groups: this rank holds every expert, whole.
struct ExpertParallel {
  comm::Communicator* ep = nullptr;      // expert-model-parallel: each member holds E / EP experts
  comm::Communicator* etp = nullptr;     // expert-tensor-parallel: each expert's fc1 column-, fc2 row-split
  comm::Communicator* tp_ep = nullptr;  // ETP x EP (ETP fastest): the allgather dispatcher's group
  int ep_size() const { return ep ? ep->size() : 1; }
  int ep_rank() const { return ep ? ep->rank() : 0; }
  int etp_size() const { return etp ? etp->size() : 1; }
  int etp_rank() const { return etp ? etp->rank() : 0; }
};

class TokenDispatcher {
 public:
  // What one micro-batch's dispatch keeps for combine and the two backward passes.
  struct Saved {
    Tensor token_rows;  // I32 [N, E]: the dispatch plan's row of each routed (token, expert)
    Tensor probs;       // f32 [N, E]: the routing weights of the plan's tokens
    Tensor yp;          // the experts' outputs in the plan's row order (unpermute's input)
    int64_t rows = 0;   // rows of the plan, all experts
    // allgather: the local experts' rows [first_row, first_row + local_rows) of the plan.
    int64_t first_row = 0, local_rows = 0;
    // alltoall: rows per (EP member, local expert) this rank sends (E: its plan's counts), and
    // per (ETP member, EP member, local expert) the rows the ETP group received (ETP x EP x local;
    // without expert TP just this rank's).
    std::vector<int64_t> send_chunks, recv_chunks;
    // Set by the caller before dispatch: the plan's row count when it is known in advance
    // (dropless routing: tokens x topk), else -1. Lets the permute be queued before the host
    // waits for the per-expert counts.
    int64_t expected_rows = -1;
  };
  virtual ~TokenDispatcher() = default;
  // Work with no part in the exchange (the shared expert) that dispatch and combine_backward run
  // while their token exchange is in flight (--moe-shared-expert-overlap); may be empty. Without
  // an exchange to hide, it simply runs there.
  using InFlight = std::function<void()>;
  // x [T, h] this rank's tokens; probs f32 and map I32 [T, E] from the router. Returns the rows
  // for this rank's experts, expert-major, counts[i] of them for local expert i. `routed` [E]
  // gets the tokens per expert this rank contributes to the expert-bias update: summed over the
  // TP x DP ranks, every routed token counts once.
  virtual Tensor dispatch(const Tensor& x, const Tensor& probs, const Tensor& map, Saved& s,
                          std::vector<int64_t>& counts, std::vector<int32_t>& routed, PassContext& ctx,
                          const InFlight& in_flight) const = 0;
  // The local experts' outputs, in dispatch's row order -> y [T, h]: per token, the sum over
  // its experts of prob x output.
  virtual Tensor combine(const Tensor& yp, Saved& s, PassContext& ctx) const = 0;
  // Backward of combine: returns the gradient of the experts' outputs (dispatch's row order) and
  // writes dprobs f32 [T, E].
  virtual Tensor combine_backward(const Tensor& dy, Saved& s, Tensor& dprobs, PassContext& ctx,
                                  const InFlight& in_flight) const = 0;
  // Backward of dispatch: dx [T, h] from the gradient of the experts' inputs; clears `s`.
  virtual Tensor dispatch_backward(const Tensor& dxp, Saved& s, PassContext& ctx) const = 0;
};

// The dispatcher `type` names (--moe-token-dispatcher-type allgather|alltoall) for a layer of
// `num_experts` experts spread over ep.
std::shared_ptr<const TokenDispatcher> make_token_dispatcher(const std::string& type, const ExpertParallel& ep,
                                                             int64_t num_experts);

}  // namespace mt::model
