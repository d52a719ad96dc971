#include "comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>

namespace mt::comm {

namespace {

// Gloo's rendezvous reads and writes through this interface; ours bounds every wait.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(mt::comm::Store& s) : s_(s) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = s_.get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) s_.get(k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  mt::comm::Store& s_;
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return &gloo::sum<T>;
    case ReduceOp::Max: return &gloo::max<T>;
    case ReduceOp::Min: return &gloo::min<T>;
  }
  return &gloo::sum<T>;
}

ReduceFn reduce_fn(DataType t, ReduceOp op) {
  switch (t) {
    case DataType::F32: return reduce_fn<float>(op);
    case DataType::F64: return reduce_fn<double>(op);
    case DataType::I32: return reduce_fn<int32_t>(op);
    case DataType::I64: return reduce_fn<int64_t>(op);
    case DataType::U8: return reduce_fn<uint8_t>(op);
    case DataType::BF16: case DataType::F16: break;
  }
  throw Error("reductions over bf16/fp16 are not offered on CPU (Gloo); reduce in fp32 as Megatron does");
}

template <typename T>
const gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return gloo::ReductionFunction<T>::sum;
    case ReduceOp::Max: return gloo::ReductionFunction<T>::max;
    case ReduceOp::Min: return gloo::ReductionFunction<T>::min;
  }
  return gloo::ReductionFunction<T>::sum;
}

}  // namespace

// Gloo's halving-doubling reduce-scatter, which leaves this rank's reduced block at the start of
// the buffer it works on. Its algorithm objects are meant to live long: run() may return while
// its last notification sends are still in flight, so destroying the object right after would
// free buffers the transport still uses. They are therefore cached per shape, with their own
// scratch buffer, and reused (every member builds them in the same call order, so their slots
// agree).
class ReduceScatterBase {
 public:
  virtual ~ReduceScatterBase() = default;
  virtual void run(const void* in, void* out) = 0;
};

template <typename T>
class CachedReduceScatter final : public ReduceScatterBase {
 public:
  CachedReduceScatter(const std::shared_ptr<gloo::Context>& ctx, size_t count, ReduceOp op)
      : count_(count), scratch_(count * static_cast<size_t>(ctx->size)) {
    std::vector<T*> ptrs{scratch_.data()};
    std::vector<int> recv(static_cast<size_t>(ctx->size), static_cast<int>(count));
    alg_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(ctx, ptrs, static_cast<int>(scratch_.size()), recv,
                                                                    reduction<T>(op));
  }
  void run(const void* in, void* out) override {
    std::memcpy(scratch_.data(), in, scratch_.size() * sizeof(T));
    alg_->run();
    std::memcpy(out, scratch_.data(), count_ * sizeof(T));
  }

 private:
  size_t count_;
  std::vector<T> scratch_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<T>> alg_;
};

class GlooWork final : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
    if (!error_.empty()) throw CommError(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }
  void finish(std::string error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }
  std::string what;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::string error_;
};

// A posted send or recv; waiting completes it (with the group's timeout).
class P2PWork final : public Work {
 public:
  P2PWork(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, std::chrono::milliseconds timeout,
          std::function<std::string(const std::exception&)> describe)
      : buf_(std::move(buf)), is_send_(is_send), timeout_(timeout), describe_(std::move(describe)) {}
  void wait() override {
    if (done_) return;
    try {
      bool ok = is_send_ ? buf_->waitSend(timeout_) : buf_->waitRecv(timeout_);
      if (!ok) throw CommError("point-to-point transfer aborted");
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(describe_(e));
    }
    done_ = true;
  }
  bool done() const override { return done_; }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  std::chrono::milliseconds timeout_;
  std::function<std::string(const std::exception&)> describe_;
  bool done_ = false;
};

GlooCommunicator::GlooCommunicator(std::string name, std::vector<int> world_ranks, int rank,
                                   std::shared_ptr<Store> store, std::shared_ptr<gloo::transport::Device> device,
                                   std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      rank_(rank),
      store_(std::move(store)),
      timeout_(timeout),
      send_seq_(world_ranks_.size(), 0),
      recv_seq_(world_ranks_.size(), 0) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size());
  ctx->setTimeout(timeout_);
  try {
    GlooStoreAdapter adapter(*store_);
    ctx->connectFullMesh(adapter, device);
  } catch (const CommError& e) {
    throw CommError(fmt::format("connecting process group '{}' (world ranks {}): {}", name_,
                                fmt::join(world_ranks_, ","), e.what()));
  } catch (const std::exception& e) {
    rethrow_as_comm_error("connecting", e);
  }
  ctx_ = ctx;
  worker_ = std::thread([this] { worker(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  reduce_scatters_.clear();  // before the context they use
}

std::string GlooCommunicator::diagnose(bool timed_out) {
  std::vector<int> lost;
  // The store may hear of a death a moment after the peers' sockets do: ask a few times.
  for (int attempt = 0; attempt < 30; ++attempt) {
    try {
      lost = store_->lost_ranks();
    } catch (const std::exception&) {
      return fmt::format("; the rendezvous store at {} is unreachable too, so world rank 0 (its host) or the "
                         "launcher has exited",
                         store_->where());
    }
    if (!lost.empty() || timed_out) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!lost.empty()) {
    std::string m = fmt::format("; world rank {} exited or crashed", lost[0]);
    if (lost.size() > 1) m += fmt::format(" (then world ranks {} stopped too)", fmt::join(lost.begin() + 1, lost.end(), ", "));
    return m;
  }
  if (timed_out)
    return "; no rank has exited, so one is stuck or slower than --distributed-timeout-minutes allows";
  return "; a peer closed its connection";
}

void GlooCommunicator::rethrow_as_comm_error(const std::string& what, const std::exception& e) {
  std::string msg = e.what();
  bool timed_out = msg.find("imed out") != std::string::npos;
  throw CommError(fmt::format("{} on process group '{}' (world ranks {}) failed: {}{}", what, name_,
                              fmt::join(world_ranks_, ","), msg, diagnose(timed_out)));
}

WorkHandle GlooCommunicator::enqueue(std::string what, std::function<void(uint32_t)> fn) {
  auto w = std::make_shared<GlooWork>();
  w->what = std::move(what);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(w, std::move(fn));
  }
  cv_.notify_all();
  return w;
}

void GlooCommunicator::worker() {
  while (true) {
    std::shared_ptr<GlooWork> w;
    std::function<void(uint32_t)> fn;
    uint32_t tag;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      w = queue_.front().first;
      fn = std::move(queue_.front().second);
      queue_.pop_front();
      tag = next_tag_++;
    }
    if (!broken_.empty()) {
      w->finish(fmt::format("{} on process group '{}' not run: an earlier operation failed: {}", w->what, name_,
                            broken_));
      continue;
    }
    std::string error;
    try {
      try {
        fn(tag);
      } catch (const CommError&) {
        throw;
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        rethrow_as_comm_error(w->what, e);
      }
    } catch (const std::exception& e) {
      error = e.what();
      broken_ = error;
    }
    w->finish(std::move(error));
  }
}

namespace {
template <typename T>
void all_reduce_typed(const std::shared_ptr<gloo::Context>& ctx, void* buf, size_t count, ReduceOp op, uint32_t tag,
                      std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(static_cast<T*>(buf), count);
  o.setReduceFunction(reduce_fn<T>(op));
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allreduce(o);
}
}  // namespace

WorkHandle GlooCommunicator::all_reduce_async(void* buf, size_t count, DataType t, ReduceOp op) {
  if (count == 0 || size() == 1) return done_work();
  if (t == DataType::BF16 || t == DataType::F16) reduce_fn(t, op);  // throws the explanation
  return enqueue("all_reduce", [this, buf, count, t, op](uint32_t tag) {
    switch (t) {
      case DataType::F32: all_reduce_typed<float>(ctx_, buf, count, op, tag, timeout_); break;
      case DataType::F64: all_reduce_typed<double>(ctx_, buf, count, op, tag, timeout_); break;
      case DataType::I32: all_reduce_typed<int32_t>(ctx_, buf, count, op, tag, timeout_); break;
      case DataType::I64: all_reduce_typed<int64_t>(ctx_, buf, count, op, tag, timeout_); break;
      case DataType::U8: all_reduce_typed<uint8_t>(ctx_, buf, count, op, tag, timeout_); break;
      case DataType::BF16: case DataType::F16: break;
    }
  });
}

WorkHandle GlooCommunicator::reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp op) {
  if (count == 0) return done_work();
  if (size() == 1) {
    if (in != out) std::memmove(out, in, count * data_type_size(t));
    return done_work();
  }
  if (t != DataType::F32 && t != DataType::F64)
    throw Error(fmt::format("reduce_scatter over {} is not offered on CPU", data_type_name(t)));
  return enqueue("reduce_scatter", [this, in, out, count, t, op](uint32_t) {
    // Only the worker thread touches the cache.
    auto key = std::make_tuple(count, static_cast<int>(t), static_cast<int>(op));
    auto& alg = reduce_scatters_[key];
    if (!alg) {
      if (t == DataType::F32) alg = std::make_unique<CachedReduceScatter<float>>(ctx_, count, op);
      else alg = std::make_unique<CachedReduceScatter<double>>(ctx_, count, op);
    }
    alg->run(in, out);
  });
}

WorkHandle GlooCommunicator::all_gather_async(const void* in, void* out, size_t count, DataType t) {
  if (count == 0) return done_work();
  const size_t bytes = count * data_type_size(t);
  return enqueue("all_gather", [this, in, out, bytes](uint32_t tag) {
    uint8_t* o8 = static_cast<uint8_t*>(out);
    uint8_t* mine = o8 + static_cast<size_t>(rank_) * bytes;
    if (in != mine) std::memmove(mine, in, bytes);
    gloo::AllgatherOptions o(ctx_);
    o.setOutput(o8, bytes * static_cast<size_t>(size()));  // input taken in place from `mine`
    o.setTag(tag);
    o.setTimeout(timeout_);
    gloo::allgather(o);
  });
}

WorkHandle GlooCommunicator::broadcast_async(void* buf, size_t count, DataType t, int root) {
  if (count == 0) return done_work();
  MT_CHECK(root >= 0 && root < size(), "broadcast root {} outside group of {}", root, size());
  const size_t bytes = count * data_type_size(t);
  return enqueue("broadcast", [this, buf, bytes, root](uint32_t tag) {
    gloo::BroadcastOptions o(ctx_);
    o.setOutput(static_cast<uint8_t*>(buf), bytes);
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout_);
    gloo::broadcast(o);
  });
}

WorkHandle GlooCommunicator::all_to_all_async(const void* in, void* out, size_t count, DataType t) {
  if (count == 0) return done_work();
  const size_t bytes = count * data_type_size(t) * static_cast<size_t>(size());
  return enqueue("all_to_all", [this, in, out, bytes](uint32_t tag) {
    gloo::AlltoallOptions o(ctx_);
    o.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
    o.setOutput(static_cast<uint8_t*>(out), bytes);
    o.setTag(tag);
    o.setTimeout(timeout_);
    gloo::alltoall(o);
  });
}

WorkHandle GlooCommunicator::all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                                const std::vector<size_t>& recv_counts, DataType t) {
  MT_CHECK(send_counts.size() == static_cast<size_t>(size()) && recv_counts.size() == static_cast<size_t>(size()),
           "all_to_all_v on '{}': {} send and {} receive counts for {} members", name_, send_counts.size(),
           recv_counts.size(), size());
  // Never skipped locally, even with nothing to move: the others' counts are not known here, and
  // every member must run the operation for the group's tags to stay in step.
  const size_t es = data_type_size(t);
  std::vector<int64_t> sb(send_counts.size()), rb(recv_counts.size());
  for (size_t i = 0; i < sb.size(); ++i) {
    sb[i] = static_cast<int64_t>(send_counts[i] * es);
    rb[i] = static_cast<int64_t>(recv_counts[i] * es);
  }
  return enqueue("all_to_all_v", [this, in, out, sb = std::move(sb), rb = std::move(rb)](uint32_t tag) {
    static uint8_t none = 0;  // Gloo's buffers want an address even for zero bytes
    gloo::AlltoallvOptions o(ctx_);
    o.setInput(in ? static_cast<uint8_t*>(const_cast<void*>(in)) : &none, sb);
    o.setOutput(out ? static_cast<uint8_t*>(out) : &none, rb);
    o.setTag(tag);
    o.setTimeout(timeout_);
    gloo::alltoallv(o);
  });
}

WorkHandle GlooCommunicator::barrier_async() {
  return enqueue("barrier", [this](uint32_t tag) {
    gloo::BarrierOptions o(ctx_);
    o.setTag(tag);
    o.setTimeout(timeout_);
    gloo::barrier(o);
  });
}

namespace {
constexpr uint8_t kP2PSlotPrefix = 0x40;  // above Gloo's own collective prefixes
}

WorkHandle GlooCommunicator::send_async(const void* buf, size_t count, DataType t, int peer) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "send to rank {} in group of {}", peer, size());
  // Direction bit: the pair's two streams never share a slot.
  uint64_t seq = send_seq_[static_cast<size_t>(peer)]++;
  uint32_t tag = static_cast<uint32_t>(seq * 2 + (rank_ < peer ? 0 : 1));
  auto ub = ctx_->createUnboundBuffer(const_cast<void*>(buf), count * data_type_size(t));
  ub->send(peer, gloo::Slot::build(kP2PSlotPrefix, tag));
  int wr = world_ranks_[static_cast<size_t>(peer)];
  return std::make_shared<P2PWork>(std::move(ub), true, timeout_, [this, wr](const std::exception& e) {
    std::string m = e.what();
    return fmt::format("send to world rank {} on process group '{}' failed: {}{}", wr, name_, m,
                       diagnose(m.find("imed out") != std::string::npos));
  });
}

WorkHandle GlooCommunicator::recv_async(void* buf, size_t count, DataType t, int peer) {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv from rank {} in group of {}", peer, size());
  uint64_t seq = recv_seq_[static_cast<size_t>(peer)]++;
  uint32_t tag = static_cast<uint32_t>(seq * 2 + (peer < rank_ ? 0 : 1));
  auto ub = ctx_->createUnboundBuffer(buf, count * data_type_size(t));
  ub->recv(peer, gloo::Slot::build(kP2PSlotPrefix, tag));
  int wr = world_ranks_[static_cast<size_t>(peer)];
  return std::make_shared<P2PWork>(std::move(ub), false, timeout_, [this, wr](const std::exception& e) {
    std::string m = e.what();
    return fmt::format("recv from world rank {} on process group '{}' failed: {}{}", wr, name_, m,
                       diagnose(m.find("imed out") != std::string::npos));
  });
}

}  // namespace mt::comm
