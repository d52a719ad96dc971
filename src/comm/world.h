#pragma once
// The job's processes and their process groups. init_world() reads the launcher's environment,
// starts (on world rank 0, unless the launcher hosts it) or joins the rendezvous store, and
// connects the world group; new_group() builds sub-groups (TP, DP, ...). Groups of one are local
// and cost nothing, so a single-process run never opens a socket.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/env.h"
#include "comm/store.h"

namespace gloo::transport {
class Device;
}

namespace mt::comm {

// GPU ranks: every group also gets an NCCL communicator for device buffers (host buffers keep
// going through Gloo). `compute_stream` is the cudaStream_t the model runs on.
struct DeviceComm {
  bool nccl = false;
  void* compute_stream = nullptr;
  int device = 0;
};

class World {
 public:
  // `timeout` bounds every rendezvous and collective (--distributed-timeout-minutes).
  World(const DistEnv& env, std::chrono::milliseconds timeout, DeviceComm dev = {});
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return env_.rank; }
  int size() const { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const CommPtr& world() const { return world_; }
  // Called by the members of the group only (all with the same name and ranks, in the same
  // order relative to other new_group calls among them). `ranks` are world ranks.
  CommPtr new_group(const std::string& name, const std::vector<int>& ranks);
  // The rendezvous store (null for a single process): NCCL unique-id exchange goes through it.
  const std::shared_ptr<Store>& store() const { return store_; }
  // Marks this rank as finished cleanly; afterwards its exit is not reported as a lost rank.
  void shutdown();

 private:
  DistEnv env_;
  std::chrono::milliseconds timeout_;
  DeviceComm dev_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  CommPtr world_;
};

}  // namespace mt::comm
