#pragma once
// torch.save's files: a zip archive of stored (uncompressed) entries, <archive>/data.pkl (a pickle,
// read by the restricted unpickler) and one entry <archive>/data/<key> per storage. Every entry's
// bounds, every storage's size and every tensor's offset, shape and strides are checked before a
// byte is read, so a corrupt or hostile file is an error naming it, never an out-of-bounds read.
// Used for legacy `--ckpt-format torch` checkpoints (model_optim_rng.pt) and for every item of a
// PyTorch distributed checkpoint, which stores each tensor and object as such an archive.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/megatron/pickle.h"
#include "core/tensor.h"

namespace mt::checkpoint::megatron {

// A whole regular file mapped read-only.
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

struct Bytes {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

// The entries of a stored zip (zip64 included). Compressed entries are refused: torch.save
// never compresses, and a reader of stored entries has no decompressor to attack.
class StoredZip {
 public:
  StoredZip(Bytes b, std::string where);
  const std::map<std::string, Bytes>& entries() const { return entries_; }

 private:
  std::map<std::string, Bytes> entries_;
};

// A fp32 copy of a tensor.
struct HostTensor {
  Shape shape;
  std::vector<float> values;
};

class TorchSave {
 public:
  TorchSave(Bytes b, std::string where);
  const pickle::Pickle& pickle() const { return pk_; }
  const std::string& where() const { return where_; }
  // Whether node `n` is a tensor (a call of torch._utils._rebuild_tensor_v2).
  bool is_tensor(int64_t n) const;
  // The tensor at node `n` as fp32 (from f32, bf16, f16, f64 storages; integer storages are
  // refused); `what` names it in errors.
  HostTensor tensor(int64_t n, const std::string& what) const;
  // A number: a Python int/float, or a one-element tensor of any dtype.
  double number(int64_t n, const std::string& what) const;

 private:
  std::string where_;
  StoredZip zip_;
  std::string prefix_;
  pickle::Pickle pk_;
};

// Writing (torch_save_writer.cpp): the bytes of a torch.save archive "archive/" holding the
// pickle `pkl` and storages "0", "1", ... (`storages[k]`'s raw little-endian bytes), laid out as
// torch writes them (stored entries, data aligned to 64 bytes, the version records).
std::string torch_save_archive(const std::string& pkl, const std::vector<std::string>& storages);

// A fp32 tensor as torch.save writes it: the pickle (a _rebuild_tensor_v2 call on storage "0")
// and its storage bytes.
std::string torch_save_tensor(const Shape& shape, const float* values);

// Any pickle tree as a torch.save archive without storages (Python objects: dicts, Namespace).
std::string torch_save_object(const pickle::Pickle& pk, int64_t root);

}  // namespace mt::checkpoint::megatron
