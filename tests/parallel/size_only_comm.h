#pragma once
// A stand-in DP group that only reports its size and rank (any collective throws): enough for
// the data-parallel layer's bookkeeping (buckets, owned slices, the optimizer's shard) without
// processes.
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace mt::testing {

class SizeOnly final : public comm::Communicator {
 public:
  SizeOnly(int rank, int size) : rank_(rank), size_(size), ranks_(static_cast<size_t>(size)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  comm::WorkHandle all_reduce_async(void*, size_t, comm::DataType, comm::ReduceOp) override { return none(); }
  comm::WorkHandle reduce_scatter_async(const void*, void*, size_t, comm::DataType, comm::ReduceOp) override {
    return none();
  }
  comm::WorkHandle all_gather_async(const void*, void*, size_t, comm::DataType) override { return none(); }
  comm::WorkHandle broadcast_async(void*, size_t, comm::DataType, int) override { return none(); }
  comm::WorkHandle all_to_all_async(const void*, void*, size_t, comm::DataType) override { return none(); }
  comm::WorkHandle all_to_all_v_async(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                                      comm::DataType) override {
    return none();
  }
  comm::WorkHandle send_async(const void*, size_t, comm::DataType, int) override { return none(); }
  comm::WorkHandle recv_async(void*, size_t, comm::DataType, int) override { return none(); }
  comm::WorkHandle barrier_async() override { return none(); }

 private:
  static comm::WorkHandle none() { throw Error("no communication in this test"); }
  int rank_, size_;
  std::vector<int> ranks_;
  std::string name_ = "dp";
};

}  // namespace mt::testing
