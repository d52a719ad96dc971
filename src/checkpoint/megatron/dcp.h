#pragma once
// PyTorch distributed checkpoints (torch.distributed.checkpoint, Megatron's `torch_dist`): a
// `.metadata` pickle naming every tensor (dtype, global size, chunks: offset and size boxes) and
// every bytes item, and where each lives (file, byte offset, length) in the `__R_N.distcp` files.
// Each stored item is itself a torch.save archive (torch_zip.h). The metadata is validated
// (plain file names, boxes inside their tensor, byte ranges inside their file) before use.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/megatron/torch_zip.h"

namespace mt::checkpoint::megatron {

struct DcpRange {
  std::string file;  // a plain file name in the checkpoint directory
  uint64_t offset = 0, length = 0;
};

struct DcpChunk {
  std::vector<int64_t> offsets, sizes;
  DcpRange where;
};

struct DcpTensor {
  std::string dtype;  // torch's name: float32, bfloat16, ...
  Shape size;
  std::vector<DcpChunk> chunks;
};

struct DcpMetadata {
  std::map<std::string, DcpTensor> tensors;
  std::map<std::string, DcpRange> bytes;
  std::vector<std::string> order;  // tensor names as the checkpoint lists them (module order)
};

// Interprets a parsed .metadata pickle; `where` names the file in errors.
DcpMetadata parse_dcp_metadata(const pickle::Pickle& pk, const std::string& where);

class DcpReader {
 public:
  explicit DcpReader(const std::string& dir);
  ~DcpReader();
  const DcpMetadata& metadata() const { return md_; }
  bool has_tensor(const std::string& name) const { return md_.tensors.count(name) != 0; }
  // The whole tensor, assembled from its chunks (every element must be covered once).
  HostTensor read(const std::string& name);
  // A bytes item (a torch.save'd Python object); throws naming it when absent.
  TorchSave object(const std::string& name);
  // The bytes item whose name starts with `prefix` (Megatron appends /shard_...); -1 style: throws.
  std::string find_object(const std::string& prefix) const;
  const std::string& dir() const { return dir_; }

 private:
  Bytes range(const DcpRange& r, const std::string& what);
  std::string dir_;
  DcpMetadata md_;
  std::map<std::string, std::unique_ptr<MappedFile>> files_;
};

}  // namespace mt::checkpoint::megatron
