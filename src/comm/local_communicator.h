#pragma once
// The group of one: every collective is a copy or nothing. Used for single-process runs and for
// parallel groups of size 1 (TP=1, DP=1, ...), so callers never special-case sizes.
#include "comm/communicator.h"

namespace mt::comm {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name, int world_rank = 0) : name_(std::move(name)), ranks_{world_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  WorkHandle all_reduce_async(void*, size_t, DataType, ReduceOp) override { return done_work(); }
  WorkHandle reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp) override;
  WorkHandle all_gather_async(const void* in, void* out, size_t count, DataType t) override;
  WorkHandle broadcast_async(void*, size_t, DataType, int root) override;
  WorkHandle all_to_all_async(const void* in, void* out, size_t count, DataType t) override {
    return all_gather_async(in, out, count, t);  // one block, copied
  }
  WorkHandle all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DataType t) override;
  WorkHandle send_async(const void*, size_t, DataType, int peer) override;
  WorkHandle recv_async(void*, size_t, DataType, int peer) override;
  WorkHandle barrier_async() override { return done_work(); }

 private:
  std::string name_;
  std::vector<int> ranks_;
};

}  // namespace mt::comm
