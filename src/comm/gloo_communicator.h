#pragma once
// Communicator over Gloo's TCP transport for CPU processes. Collectives run one at a time, in
// issue order, on a worker thread per group: async handles let the caller overlap them with
// compute, and issue order is the same on every member, which is what Gloo needs to match
// operations. Point-to-point messages bypass the worker so that a send and a recv posted
// together cannot deadlock behind each other.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "comm/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace mt::comm {

class GlooWork;
class ReduceScatterBase;

class GlooCommunicator final : public Communicator {
 public:
  // Connects the members (a full mesh) through `store`, which must be private to this group
  // (a PrefixStore). `rank` is this process's rank in the group. Collective with the members.
  GlooCommunicator(std::string name, std::vector<int> world_ranks, int rank, std::shared_ptr<Store> store,
                   std::shared_ptr<gloo::transport::Device> device, std::chrono::milliseconds timeout);
  ~GlooCommunicator() override;

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

 private:
  WorkHandle enqueue(std::string what, std::function<void(uint32_t tag)> fn);
  void worker();
  [[noreturn]] void rethrow_as_comm_error(const std::string& what, const std::exception& e);
  std::string diagnose(bool timed_out);

  std::string name_;
  std::vector<int> world_ranks_;
  int rank_;
  std::shared_ptr<Store> store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> ctx_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<GlooWork>, std::function<void(uint32_t)>>> queue_;
  bool stop_ = false;
  uint32_t next_tag_ = 0;
  std::string broken_;  // the first failure; later operations fail at once with it
  std::vector<uint64_t> send_seq_, recv_seq_;
  // Gloo reduce-scatter algorithms by (count, dtype, op): built once, reused (see the .cpp).
  std::map<std::tuple<size_t, int, int>, std::unique_ptr<ReduceScatterBase>> reduce_scatters_;
  std::thread worker_;
};

}  // namespace mt::comm
