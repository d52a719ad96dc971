#pragma once
// Communicator: the collectives a process group offers, over raw buffers so that one interface
// serves CPU memory (Gloo) and device memory (NCCL). Every operation has an async form that
// returns a Work handle (for overlapping communication with compute) and a blocking form.
// Members of a group must issue the same operations in the same order, as with NCCL and MPI.
// Failures (a dead peer, a timeout) surface as comm::CommError naming the group and, where it
// can be found out, the rank that is gone.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::comm {

enum class DataType : uint8_t { F32, F64, BF16, I32, I64, U8, F16 };
enum class ReduceOp : uint8_t { Sum, Max, Min };

size_t data_type_size(DataType t);
const char* data_type_name(DataType t);

template <typename T> constexpr DataType data_type_of();
template <> constexpr DataType data_type_of<float>() { return DataType::F32; }
template <> constexpr DataType data_type_of<double>() { return DataType::F64; }
template <> constexpr DataType data_type_of<int32_t>() { return DataType::I32; }
template <> constexpr DataType data_type_of<int64_t>() { return DataType::I64; }
template <> constexpr DataType data_type_of<uint8_t>() { return DataType::U8; }

// A communication failure: fatal for the run. A distinct type so the CLI can exit at once
// instead of unwinding through communicators that may still wait on dead peers.
class CommError : public Error {
 public:
  explicit CommError(const std::string& msg) : Error(msg) {}
};

// Completion handle of an async operation. wait() rethrows the operation's error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool done() const = 0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank inside this group
  virtual int size() const = 0;
  // World ranks of the members, in group-rank order.
  virtual const std::vector<int>& world_ranks() const = 0;
  virtual const std::string& name() const = 0;

  // In place: buf[count] <- op over members.
  virtual WorkHandle all_reduce_async(void* buf, size_t count, DataType t, ReduceOp op) = 0;
  // in[size() * count] -> out[count] = op over members of in[rank()*count : (rank()+1)*count].
  // `out` may alias in + rank()*count (Megatron's in-place grad-buffer shard).
  virtual WorkHandle reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp op) = 0;
  // in[count] -> out[size() * count], member i's input at out + i*count. `in` may alias
  // out + rank()*count.
  virtual WorkHandle all_gather_async(const void* in, void* out, size_t count, DataType t) = 0;
  virtual WorkHandle broadcast_async(void* buf, size_t count, DataType t, int root) = 0;
  // in[size() * count] -> out[size() * count]: block i of `in` goes to member i, whose block
  // rank() of `out` receives it (expert dispatch). `in` and `out` must not overlap.
  virtual WorkHandle all_to_all_async(const void* in, void* out, size_t count, DataType t) = 0;
  // The variable-size form (expert dispatch): `in` holds send_counts[i] elements for member i,
  // blocks in member order; `out` receives recv_counts[i] elements from member i, likewise.
  // recv_counts[i] must be member i's send_counts[rank()] (exchange the counts first, e.g. with
  // all_to_all). Every member takes part even when it sends and receives nothing.
  virtual WorkHandle all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                        const std::vector<size_t>& recv_counts, DataType t) = 0;
  // Point-to-point between group ranks; messages between a pair arrive in issue order.
  virtual WorkHandle send_async(const void* buf, size_t count, DataType t, int peer) = 0;
  virtual WorkHandle recv_async(void* buf, size_t count, DataType t, int peer) = 0;
  virtual WorkHandle barrier_async() = 0;
  // Collective with the members: readies point-to-point transfers with these group ranks before
  // the first one (NCCL builds a communicator per direction, which cannot be done safely while
  // transfers are in flight). A no-op for backends that need nothing.
  virtual void prepare_p2p(const std::vector<int>& peers) { (void)peers; }

  // Blocking forms.
  void all_reduce(void* buf, size_t count, DataType t, ReduceOp op = ReduceOp::Sum) {
    all_reduce_async(buf, count, t, op)->wait();
  }
  void reduce_scatter(const void* in, void* out, size_t count, DataType t, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, count, t, op)->wait();
  }
  void all_gather(const void* in, void* out, size_t count, DataType t) { all_gather_async(in, out, count, t)->wait(); }
  void broadcast(void* buf, size_t count, DataType t, int root) { broadcast_async(buf, count, t, root)->wait(); }
  void all_to_all(const void* in, void* out, size_t count, DataType t) { all_to_all_async(in, out, count, t)->wait(); }
  void all_to_all_v(const void* in, const std::vector<size_t>& send_counts, void* out,
                    const std::vector<size_t>& recv_counts, DataType t) {
    all_to_all_v_async(in, send_counts, out, recv_counts, t)->wait();
  }
  void send(const void* buf, size_t count, DataType t, int peer) { send_async(buf, count, t, peer)->wait(); }
  void recv(void* buf, size_t count, DataType t, int peer) { recv_async(buf, count, t, peer)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Typed conveniences.
  template <typename T>
  void all_reduce(T* buf, size_t count, ReduceOp op = ReduceOp::Sum) {
    all_reduce(buf, count, data_type_of<T>(), op);
  }
  template <typename T>
  T all_reduce_value(T v, ReduceOp op = ReduceOp::Sum) {
    all_reduce(&v, 1, data_type_of<T>(), op);
    return v;
  }
};
using CommPtr = std::shared_ptr<Communicator>;

// A finished Work (for size-1 groups and no-op paths).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() const override { return true; }
};
WorkHandle done_work();

}  // namespace mt::comm
