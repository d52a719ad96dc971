// NCCL communicator (see the header). Built only with the CUDA backend (MT_HAVE_NCCL).
#ifdef MT_HAVE_NCCL
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/ranges.h>

#include "core/log.h"

namespace mt::comm {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::F32: return ncclFloat32;
    case DataType::F64: return ncclFloat64;
    case DataType::BF16: return ncclBfloat16;
    case DataType::F16: return ncclFloat16;
    case DataType::I32: return ncclInt32;
    case DataType::I64: return ncclInt64;
    case DataType::U8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// A completion event shared by a Work handle and the watchdog.
struct Event {
  cudaEvent_t ev = nullptr;
  Event() { check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() {
    if (ev) cudaEventDestroy(ev);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  bool done() const { return cudaEventQuery(ev) == cudaSuccess; }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Event> e, cudaStream_t compute) : e_(std::move(e)), compute_(compute) {}
  // The consumer is the compute stream: it waits on the device, the host goes on.
  void wait() override { check_cuda(cudaStreamWaitEvent(compute_, e_->ev, 0), "cudaStreamWaitEvent"); }
  bool done() const override { return e_->done(); }

 private:
  std::shared_ptr<Event> e_;
  cudaStream_t compute_;
};

}  // namespace

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on old drivers
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// One NCCL communicator with its stream: the group's, or a point-to-point direction's.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct NcclState {
  std::string name;
  std::vector<int> world_ranks;
  int rank = 0;
  int device = 0;
  std::shared_ptr<Store> store;
  cudaStream_t compute = nullptr;
  std::chrono::milliseconds timeout{};
  Channel group;
  std::map<int, Channel> send_to, recv_from;  // by peer group rank

  // Outstanding operations, oldest first, for the watchdog.
  struct Pending {
    std::shared_ptr<Event> e;
    std::chrono::steady_clock::time_point t0;
    std::string what;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> pending;
  bool stop = false;
  std::thread watchdog;

  [[noreturn]] void die(const std::string& msg) {
    std::string who;
    try {
      auto lost = store ? store->lost_ranks() : std::vector<int>{};
      if (!lost.empty()) who = fmt::format("; world rank {} exited or crashed", lost[0]);
      else who = "; no rank has exited, so one is stuck or slower than --distributed-timeout-minutes allows";
    } catch (const std::exception&) {
      who = "; the rendezvous store is unreachable too, so world rank 0 (its host) or the launcher has exited";
    }
    std::fflush(stdout);
    std::fprintf(stderr, "megatron: error: [group %s of world ranks %s] %s%s\n", name.c_str(),
                 fmt::format("{}", fmt::join(world_ranks, ",")).c_str(), msg.c_str(), who.c_str());
    std::fflush(stderr);
    // A collective stuck on the device cannot be unwound: leave at once, as NCCL's own
    // watchdog in PyTorch does (the peers' watchdogs or sockets end them too).
    std::_Exit(2);
  }

  void watch() {
    (void)cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, std::chrono::milliseconds(500));
      while (!pending.empty() && pending.front().e->done()) pending.pop_front();
      ncclResult_t async = ncclSuccess;
      if (group.comm && ncclCommGetAsyncError(group.comm, &async) == ncclSuccess && async != ncclSuccess)
        die(fmt::format("NCCL reported an asynchronous error: {}", ncclGetErrorString(async)));
      if (pending.empty()) continue;
      const auto age = std::chrono::steady_clock::now() - pending.front().t0;
      const std::string what = pending.front().what;
      if (age > timeout)
        die(fmt::format("NCCL {} did not complete within {} s (--distributed-timeout-minutes)", what,
                        std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
      if (age < std::chrono::seconds(5) || !store) continue;
      // A peer that died leaves our transfers waiting forever: ask the store (without holding
      // the lock, so new operations are not held up meanwhile).
      lock.unlock();
      std::vector<int> lost;
      bool reachable = true;
      try {
        lost = store->lost_ranks();
      } catch (const std::exception&) {
        reachable = false;
      }
      if (!reachable || !lost.empty()) die(fmt::format("NCCL {} cannot complete", what));
      lock.lock();
    }
  }

  // Runs `issue` on `ch` after the compute stream's earlier work; returns the completion handle.
  template <typename F>
  WorkHandle launch(Channel& ch, const std::string& what, F&& issue) {
    auto before = std::make_shared<Event>();
    check_cuda(cudaEventRecord(before->ev, compute), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(ch.stream, before->ev, 0), "cudaStreamWaitEvent");
    const ncclResult_t r = issue(ch);
    if (r != ncclSuccess && r != ncclInProgress)
      throw CommError(fmt::format("NCCL {} on group '{}' failed: {}", what, name, ncclGetErrorString(r)));
    auto after = std::make_shared<Event>();
    check_cuda(cudaEventRecord(after->ev, ch.stream), "cudaEventRecord");
    {
      std::lock_guard<std::mutex> lock(mu);
      pending.push_back({after, std::chrono::steady_clock::now(), what});
    }
    return std::make_shared<NcclWork>(after, compute);
  }

  // Joins an NCCL communicator of `n` ranks whose id rank 0 publishes under `key`.
  Channel join(const std::string& key, int n, int my) {
    ncclUniqueId id{};
    if (my == 0) {
      if (ncclGetUniqueId(&id) != ncclSuccess) throw CommError("ncclGetUniqueId failed");
      store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string v = store->get(key);  // bounded by the store's timeout
      MT_CHECK(v.size() == sizeof(id), "malformed NCCL id under '{}'", key);
      std::copy(v.begin(), v.end(), reinterpret_cast<char*>(&id));
    }
    Channel ch;
    const ncclResult_t r = ncclCommInitRank(&ch.comm, n, id, my);
    if (r != ncclSuccess)
      throw CommError(fmt::format("joining NCCL communicator '{}' of group '{}' failed: {}", key, name,
                                  ncclGetErrorString(r)));
    check_cuda(cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    return ch;
  }

  // Both directions with every peer, in one NCCL group so that the setups proceed together
  // whatever order the peers call in. The sender of a direction is rank 0 of its communicator
  // and publishes its id.
  void make_p2p(const std::vector<int>& peers) {
    std::vector<std::pair<ncclUniqueId, std::pair<Channel*, int>>> todo;  // id, (channel, my rank in it)
    for (int p : peers) {
      MT_CHECK(p >= 0 && p < static_cast<int>(world_ranks.size()) && p != rank, "p2p peer {} in group '{}'", p, name);
      if (!send_to.count(p)) {
        ncclUniqueId id{};
        if (ncclGetUniqueId(&id) != ncclSuccess) throw CommError("ncclGetUniqueId failed");
        store->set(fmt::format("p2p/{}>{}", rank, p), std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
        todo.push_back({id, {&send_to[p], 0}});
      }
    }
    for (int p : peers) {
      if (recv_from.count(p)) continue;
      const std::string v = store->get(fmt::format("p2p/{}>{}", p, rank));
      MT_CHECK(v.size() == sizeof(ncclUniqueId), "malformed NCCL id from group rank {}", p);
      ncclUniqueId id{};
      std::copy(v.begin(), v.end(), reinterpret_cast<char*>(&id));
      todo.push_back({id, {&recv_from[p], 1}});
    }
    if (todo.empty()) return;
    ncclResult_t r = ncclGroupStart();
    for (auto& [id, ch] : todo)
      if (r == ncclSuccess) r = ncclCommInitRank(&ch.first->comm, 2, id, ch.second);
    const ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess || e != ncclSuccess)
      throw CommError(fmt::format("setting up NCCL point-to-point channels of group '{}' failed: {}", name,
                                  ncclGetErrorString(r != ncclSuccess ? r : e)));
    for (auto& [id, ch] : todo)
      check_cuda(cudaStreamCreateWithFlags(&ch.first->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // Connect now with one transfer per direction, all in one group. NCCL otherwise connects a
    // pair at its first transfer, on the host, waiting for the peer and for the device; in the
    // middle of a pipeline schedule the device may be busy with a receive whose sender is
    // itself waiting in such a connect, and neither ever returns.
    constexpr size_t kWarm = size_t{8} << 20;  // large enough to use every p2p channel
    void* warm[2] = {nullptr, nullptr};
    check_cuda(cudaMalloc(&warm[0], kWarm), "cudaMalloc");
    check_cuda(cudaMalloc(&warm[1], kWarm), "cudaMalloc");
    r = ncclGroupStart();
    for (auto& [id, ch] : todo) {
      if (r != ncclSuccess) break;
      r = ch.second == 0 ? ncclSend(warm[0], kWarm, ncclUint8, 1, ch.first->comm, ch.first->stream)
                         : ncclRecv(warm[1], kWarm, ncclUint8, 0, ch.first->comm, ch.first->stream);
    }
    const ncclResult_t e2 = ncclGroupEnd();
    for (auto& [id, ch] : todo) check_cuda(cudaStreamSynchronize(ch.first->stream), "connecting p2p channels");
    cudaFree(warm[0]);
    cudaFree(warm[1]);
    if (r != ncclSuccess || e2 != ncclSuccess)
      throw CommError(fmt::format("connecting NCCL point-to-point channels of group '{}' failed: {}", name,
                                  ncclGetErrorString(r != ncclSuccess ? r : e2)));
  }

  Channel& p2p(bool sending, int peer) {
    auto& chans = sending ? send_to : recv_from;
    auto it = chans.find(peer);
    if (it == chans.end())
      throw Error(fmt::format("{} group rank {} on group '{}' without prepare_p2p({{{}}}) first (collective, before "
                              "any transfer)",
                              sending ? "send to" : "receive from", peer, name, peer));
    return it->second;
  }

  static void release(Channel& ch) {
    if (ch.comm) ncclCommDestroy(ch.comm);
    if (ch.stream) cudaStreamDestroy(ch.stream);
    ch = Channel{};
  }
};

NcclCommunicator::NcclCommunicator(std::string name, std::vector<int> world_ranks, int rank,
                                   std::shared_ptr<Store> store, CommPtr host, void* compute_stream, int device,
                                   std::chrono::milliseconds timeout)
    : name_(std::move(name)), world_ranks_(std::move(world_ranks)), rank_(rank), host_(std::move(host)),
      st_(std::make_unique<NcclState>()) {
  st_->name = name_;
  st_->world_ranks = world_ranks_;
  st_->rank = rank_;
  st_->device = device;
  st_->store = std::move(store);
  st_->compute = static_cast<cudaStream_t>(compute_stream);
  st_->timeout = timeout;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  // Connect collectives at setup rather than at first use (the same reason as for p2p below;
  // a user's own setting wins).
  ::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  st_->group = st_->join("group", size(), rank_);
  {
    constexpr size_t kWarm = size_t{1} << 20;
    float* warm = nullptr;
    check_cuda(cudaMalloc(&warm, kWarm * 4), "cudaMalloc");
    check_cuda(cudaMemset(warm, 0, kWarm * 4), "cudaMemset");
    const ncclResult_t r = ncclAllReduce(warm, warm, kWarm, ncclFloat32, ncclSum, st_->group.comm, st_->group.stream);
    check_cuda(cudaStreamSynchronize(st_->group.stream), "connecting the NCCL group");
    cudaFree(warm);
    if (r != ncclSuccess)
      throw CommError(fmt::format("first NCCL all-reduce on group '{}' failed: {}", name_, ncclGetErrorString(r)));
  }
  st_->watchdog = std::thread([s = st_.get()] { s->watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stop = true;
  }
  st_->cv.notify_all();
  if (st_->watchdog.joinable()) st_->watchdog.join();
  // Work still queued must finish before its communicator goes (nothing is pending in a clean exit).
  if (st_->group.stream) (void)cudaStreamSynchronize(st_->group.stream);
  // Point-to-point channels: ncclCommDestroy waits until the peer destroys the same channel, so
  // two ranks destroying their two directions in opposite orders wait forever (seen at the end
  // of PP=2 runs). Their transfers are all done here (streams synchronised), so they are
  // released locally with ncclCommAbort, in one global order (sender, receiver) all the same.
  std::vector<std::pair<std::pair<int, int>, Channel*>> p2p;
  for (auto& [p, ch] : st_->send_to) p2p.push_back({{rank_, p}, &ch});
  for (auto& [p, ch] : st_->recv_from) p2p.push_back({{p, rank_}, &ch});
  std::sort(p2p.begin(), p2p.end());
  for (auto& [key, ch] : p2p) {
    if (ch->stream) (void)cudaStreamSynchronize(ch->stream);
    if (ch->comm) ncclCommAbort(ch->comm);
    if (ch->stream) cudaStreamDestroy(ch->stream);
    *ch = Channel{};
  }
  NcclState::release(st_->group);
}

namespace {
// Both buffers of one call live in the same kind of memory.
bool device_pair(const void* a, const void* b, const char* op, const std::string& group) {
  const bool da = is_device_pointer(a), db = is_device_pointer(b);
  MT_CHECK(da == db, "{} on group '{}' mixes host and device buffers", op, group);
  return da;
}
}  // namespace

WorkHandle NcclCommunicator::all_reduce_async(void* buf, size_t count, DataType t, ReduceOp op) {
  if (!is_device_pointer(buf)) return host_->all_reduce_async(buf, count, t, op);
  return st_->launch(st_->group, fmt::format("all-reduce of {} {}", count, data_type_name(t)), [&](Channel& ch) {
    return ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), ch.comm, ch.stream);
  });
}

WorkHandle NcclCommunicator::reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp op) {
  if (!device_pair(in, out, "reduce-scatter", name_)) return host_->reduce_scatter_async(in, out, count, t, op);
  return st_->launch(st_->group, fmt::format("reduce-scatter of {} x {} {}", size(), count, data_type_name(t)),
                     [&](Channel& ch) {
                       return ncclReduceScatter(in, out, count, nccl_type(t), nccl_op(op), ch.comm, ch.stream);
                     });
}

WorkHandle NcclCommunicator::all_gather_async(const void* in, void* out, size_t count, DataType t) {
  if (!device_pair(in, out, "all-gather", name_)) return host_->all_gather_async(in, out, count, t);
  return st_->launch(st_->group, fmt::format("all-gather of {} x {} {}", size(), count, data_type_name(t)),
                     [&](Channel& ch) { return ncclAllGather(in, out, count, nccl_type(t), ch.comm, ch.stream); });
}

WorkHandle NcclCommunicator::broadcast_async(void* buf, size_t count, DataType t, int root) {
  if (!is_device_pointer(buf)) return host_->broadcast_async(buf, count, t, root);
  return st_->launch(st_->group, fmt::format("broadcast of {} {}", count, data_type_name(t)), [&](Channel& ch) {
    return ncclBroadcast(buf, buf, count, nccl_type(t), root, ch.comm, ch.stream);
  });
}

WorkHandle NcclCommunicator::all_to_all_async(const void* in, void* out, size_t count, DataType t) {
  if (!device_pair(in, out, "all-to-all", name_)) return host_->all_to_all_async(in, out, count, t);
  const size_t bytes = count * data_type_size(t);
  return st_->launch(st_->group, fmt::format("all-to-all of {} x {} {}", size(), count, data_type_name(t)),
                     [&](Channel& ch) {
                       ncclResult_t r = ncclGroupStart();
                       for (int p = 0; p < size() && r == ncclSuccess; ++p) {
                         const size_t off = static_cast<size_t>(p) * bytes;
                         r = ncclSend(static_cast<const char*>(in) + off, count, nccl_type(t), p, ch.comm, ch.stream);
                         if (r == ncclSuccess)
                           r = ncclRecv(static_cast<char*>(out) + off, count, nccl_type(t), p, ch.comm, ch.stream);
                       }
                       const ncclResult_t e = ncclGroupEnd();
                       return r != ncclSuccess ? r : e;
                     });
}

WorkHandle NcclCommunicator::all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                                const std::vector<size_t>& recv_counts, DataType t) {
  MT_CHECK(send_counts.size() == static_cast<size_t>(size()) && recv_counts.size() == static_cast<size_t>(size()),
           "all_to_all_v on '{}': {} send and {} receive counts for {} members", name_, send_counts.size(),
           recv_counts.size(), size());
  // An empty side may come as a null pointer: the other side says where the data lives.
  const bool device = in && out ? device_pair(in, out, "all-to-all-v", name_) : is_device_pointer(in ? in : out);
  if (!device) return host_->all_to_all_v_async(in, send_counts, out, recv_counts, t);
  const size_t es = data_type_size(t);
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  return st_->launch(st_->group, fmt::format("all-to-all-v of {} {} sent", total, data_type_name(t)),
                     [&](Channel& ch) {
                       ncclResult_t r = ncclGroupStart();
                       size_t so = 0, ro = 0;
                       for (int p = 0; p < size() && r == ncclSuccess; ++p) {
                         const size_t sc = send_counts[static_cast<size_t>(p)], rc = recv_counts[static_cast<size_t>(p)];
                         if (sc > 0) r = ncclSend(static_cast<const char*>(in) + so * es, sc, nccl_type(t), p, ch.comm, ch.stream);
                         if (r == ncclSuccess && rc > 0)
                           r = ncclRecv(static_cast<char*>(out) + ro * es, rc, nccl_type(t), p, ch.comm, ch.stream);
                         so += sc;
                         ro += rc;
                       }
                       const ncclResult_t e = ncclGroupEnd();
                       return r != ncclSuccess ? r : e;
                     });
}

WorkHandle NcclCommunicator::send_async(const void* buf, size_t count, DataType t, int peer) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "send to rank {} in group '{}' of {}", peer, name_, size());
  if (!is_device_pointer(buf)) return host_->send_async(buf, count, t, peer);
  Channel& ch = st_->p2p(true, peer);
  return st_->launch(ch, fmt::format("send of {} {} to group rank {}", count, data_type_name(t), peer),
                     [&](Channel& c) { return ncclSend(buf, count, nccl_type(t), 1, c.comm, c.stream); });
}

WorkHandle NcclCommunicator::recv_async(void* buf, size_t count, DataType t, int peer) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv from rank {} in group '{}' of {}", peer, name_, size());
  if (!is_device_pointer(buf)) return host_->recv_async(buf, count, t, peer);
  Channel& ch = st_->p2p(false, peer);
  return st_->launch(ch, fmt::format("receive of {} {} from group rank {}", count, data_type_name(t), peer),
                     [&](Channel& c) { return ncclRecv(buf, count, nccl_type(t), 0, c.comm, c.stream); });
}

void NcclCommunicator::prepare_p2p(const std::vector<int>& peers) {
  host_->prepare_p2p(peers);
  st_->make_p2p(peers);
}

// A barrier is a host-side agreement: Gloo's (device work is ordered by the streams).
WorkHandle NcclCommunicator::barrier_async() { return host_->barrier_async(); }

}  // namespace mt::comm
#endif  // MT_HAVE_NCCL
