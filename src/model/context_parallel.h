#pragma once
// Context parallelism (Megatron's --context-parallel-size): the ranks of a CP group each hold
// part of every sequence and attention is the only layer that needs the rest. Megatron's causal
// load balancing cuts the sequence into 2 x CP chunks and gives rank r chunks r and 2CP-1-r, so
// every rank has the same share of the causal triangle.
//
// The attention runs in one of Megatron's --cp-comm-type forms:
//  * p2p (ring attention): key/value blocks travel around the group, each rank attends its
//    query chunks to the block in hand while the next one is on its way, and merges the partial
//    results by their log-sum-exp; backward sends the blocks round again with their gradients.
//  * allgather: every rank gathers all keys and values, attends, and reduce-scatters dK, dV.
//  * a2a (Ulysses): an all-to-all trades sequence for heads, so each rank holds the whole
//    sequence for CP-th of the heads; plain attention; an all-to-all back.
//  * a2a+p2p: all-to-all inside groups of --hierarchical-context-parallel-sizes' first size,
//    then a ring over the groups.
// All of them are built from two ops of ops.def: attention of a query chunk against a key
// chunk at their positions (AttentionShape's q_pos/k_pos), and attention_merge.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/ops.h"

namespace mt::model {

struct ContextParallel {
  comm::Communicator* group = nullptr;  // the CP group (null: no context parallelism)
  std::string comm_type = "p2p";        // p2p | a2a | allgather | a2a+p2p
  // a2a+p2p: the all-to-all group (CP ranks group->rank() / a2a size alike, consecutive) and
  // the ring over them (ranks with the same place in their all-to-all group). Other types: null.
  comm::Communicator* a2a = nullptr;
  comm::Communicator* ring = nullptr;
  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool on() const { return size() > 1; }
};

// Collective over the ring group (p2p and a2a+p2p): connects each rank to its ring neighbours
// before the first transfer. NCCL's point-to-point channels must exist before any send (their
// setup synchronises the device); the CPU communicators need nothing and return at once.
void prepare_cp_transfers(const ContextParallel& cp);

// The chunks (of 2n) that rank r of a CP group of n holds, in the order it stores them.
std::vector<int64_t> cp_chunks(int64_t n, int64_t r);
// Positions in the whole sequence of a rank's S / n tokens, in its storage order.
std::vector<int32_t> cp_positions(int64_t S, int64_t n, int64_t r);

// This rank's attention under CP. p describes the local call: B, this TP rank's heads, S = the
// local tokens per sample (2 chunks), seq_total = the whole sequence, causal, cu_seqlens over
// whole samples (packed documents); q [B, Hq, S, D], k/v [B, Hkv, S, D] in storage order.
// Writes out (q's shape) and lse [B, Hq, S]; backward takes them as the forward wrote them.
void cp_attention_forward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                          const Tensor& v, Tensor& out, Tensor& lse);
void cp_attention_backward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq,
                           Tensor& dk, Tensor& dv);

}  // namespace mt::model
