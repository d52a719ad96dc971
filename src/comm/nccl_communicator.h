#pragma once
// Communicator for GPU tensors over NCCL, with the group's Gloo communicator alongside for host
// memory (loss sums, token counts, RNG offsets: small values the host needs anyway). Each call
// picks the backend by where its buffer lives, so one group object serves both, as Megatron
// keeps an NCCL and a Gloo group per process group.
//
// Stream semantics: an operation waits (on the device) for the compute stream's work issued
// before it, runs on the group's communication stream, and Work::wait() makes the compute
// stream wait for it - the host never blocks on a transfer, so bucketed gradient reductions and
// pipeline transfers overlap compute. Buffers stay valid because device memory is freed in
// compute-stream order, after the waits.
//
// Point-to-point: NCCL matches sends and receives per communicator in issue order, and a
// receive blocks its stream until the data arrives. A send and a receive between the same two
// ranks on one stream could then wait for each other; so every direction (this rank -> peer,
// peer -> this rank) gets a two-rank communicator and a stream of its own (the k-th message in
// a direction is the k-th on its channel). They are made together by prepare_p2p before any
// transfer: NCCL's setup synchronises the device, which would wait forever on a receive whose
// sender is itself blocked setting up another direction.
//
// Failures: a watchdog thread checks outstanding operations; one that does not complete within
// --distributed-timeout-minutes, or an asynchronous NCCL error, ends the process with an error
// naming the group, the operation and (from the rendezvous store) a rank that is gone.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"

namespace mt::comm {

struct NcclState;

class NcclCommunicator final : public Communicator {
 public:
  // Collective with the members: exchanges NCCL's unique id through `store` (private to this
  // group) and joins the communicator. `host` is the same group over Gloo. `compute_stream` is
  // the cudaStream_t the model's kernels run on; `device` the CUDA device of this rank.
  NcclCommunicator(std::string name, std::vector<int> world_ranks, int rank, std::shared_ptr<Store> store,
                   CommPtr host, void* compute_stream, int device, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }

  WorkHandle all_reduce_async(void* buf, size_t count, DataType t, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp op) override;
  WorkHandle all_gather_async(const void* in, void* out, size_t count, DataType t) override;
  WorkHandle broadcast_async(void* buf, size_t count, DataType t, int root) override;
  WorkHandle all_to_all_async(const void* in, void* out, size_t count, DataType t) override;
  WorkHandle all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DataType t) override;
  WorkHandle send_async(const void* buf, size_t count, DataType t, int peer) override;
  WorkHandle recv_async(void* buf, size_t count, DataType t, int peer) override;
  WorkHandle barrier_async() override;
  void prepare_p2p(const std::vector<int>& peers) override;

 private:
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_;
  CommPtr host_;
  std::unique_ptr<NcclState> st_;
};

// True when `p` points to device (or managed) memory.
bool is_device_pointer(const void* p);

}  // namespace mt::comm
