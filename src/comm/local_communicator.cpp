#include "comm/local_communicator.h"

#include <cstring>

namespace mt::comm {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::F32: case DataType::I32: return 4;
    case DataType::F64: case DataType::I64: return 8;
    case DataType::BF16: case DataType::F16: return 2;
    case DataType::U8: return 1;
  }
  return 1;
}

const char* data_type_name(DataType t) {
  switch (t) {
    case DataType::F32: return "f32";
    case DataType::F64: return "f64";
    case DataType::BF16: return "bf16";
    case DataType::F16: return "f16";
    case DataType::I32: return "i32";
    case DataType::I64: return "i64";
    case DataType::U8: return "u8";
  }
  return "?";
}

WorkHandle done_work() {
  static const WorkHandle w = std::make_shared<DoneWork>();  // immutable, shared by all
  return w;
}

WorkHandle LocalCommunicator::reduce_scatter_async(const void* in, void* out, size_t count, DataType t, ReduceOp) {
  if (in != out) std::memmove(out, in, count * data_type_size(t));
  return done_work();
}

WorkHandle LocalCommunicator::all_gather_async(const void* in, void* out, size_t count, DataType t) {
  if (in != out) std::memmove(out, in, count * data_type_size(t));
  return done_work();
}

WorkHandle LocalCommunicator::all_to_all_v_async(const void* in, const std::vector<size_t>& send_counts, void* out,
                                                 const std::vector<size_t>& recv_counts, DataType t) {
  MT_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0],
           "all_to_all_v in the group of one '{}': counts must be one equal pair", name_);
  if (in != out && send_counts[0] > 0) std::memmove(out, in, send_counts[0] * data_type_size(t));
  return done_work();
}

WorkHandle LocalCommunicator::broadcast_async(void*, size_t, DataType, int root) {
  MT_CHECK(root == 0, "broadcast root {} in a group of one", root);
  return done_work();
}

WorkHandle LocalCommunicator::send_async(const void*, size_t, DataType, int peer) {
  MT_CHECK(false, "send to rank {} in the group of one '{}'", peer, name_);
  return done_work();
}

WorkHandle LocalCommunicator::recv_async(void*, size_t, DataType, int peer) {
  MT_CHECK(false, "recv from rank {} in the group of one '{}'", peer, name_);
  return done_work();
}

}  // namespace mt::comm
