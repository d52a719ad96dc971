#pragma once
// A two-rank group (this process is rank 0) that communicates nothing and records what it was
// asked to do: which collective, from which buffer, how many elements of which type. For tests
// of which collectives a layer issues, without a second rank.
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt::testing {

class RecordingComm final : public comm::Communicator {
 public:
  enum class Op { AllReduce, ReduceScatter, AllGather, Other };
  struct Call {
    const void* buf;
    size_t count;
    comm::DataType type;
    Op op = Op::Other;
  };
  std::vector<Call> calls;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  comm::WorkHandle all_reduce_async(void* buf, size_t count, comm::DataType t, comm::ReduceOp) override {
    return record(buf, count, t, Op::AllReduce);
  }
  comm::WorkHandle reduce_scatter_async(const void* in, void*, size_t count, comm::DataType t,
                                        comm::ReduceOp) override {
    return record(in, count, t, Op::ReduceScatter);
  }
  comm::WorkHandle all_gather_async(const void* in, void*, size_t count, comm::DataType t) override {
    return record(in, count, t, Op::AllGather);
  }
  comm::WorkHandle broadcast_async(void* buf, size_t count, comm::DataType t, int) override {
    return record(buf, count, t);
  }
  comm::WorkHandle all_to_all_async(const void* in, void*, size_t count, comm::DataType t) override {
    return record(in, count, t);
  }
  comm::WorkHandle all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void*,
                                      const std::vector<size_t>&, comm::DataType t) override {
    size_t n = 0;
    for (size_t c : send_counts) n += c;
    return record(in, n, t);
  }
  comm::WorkHandle send_async(const void* buf, size_t count, comm::DataType t, int) override {
    return record(buf, count, t);
  }
  comm::WorkHandle recv_async(void* buf, size_t count, comm::DataType t, int) override {
    return record(buf, count, t);
  }
  comm::WorkHandle barrier_async() override { return comm::done_work(); }

 private:
  comm::WorkHandle record(const void* buf, size_t count, comm::DataType t, Op op = Op::Other) {
    calls.push_back({buf, count, t, op});
    return comm::done_work();
  }
  std::vector<int> ranks_{0, 1};
  std::string name_ = "recording";
};

}  // namespace mt::testing
