// torch.save archives (torch_zip.h): a zip of stored entries, each entry's data aligned to 64
// bytes by padding its local header's extra field, as torch's own writer does.
#include <cstring>

#include "checkpoint/megatron/torch_zip.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace mt::checkpoint::megatron {

namespace {

void le(std::string& out, uint64_t v, int k) {
  for (int i = 0; i < k; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

struct Entry {
  std::string name, data;
};

std::string zip_stored(const std::vector<Entry>& entries) {
  std::string out, cd;
  for (const auto& e : entries) {
    MT_CHECK(e.data.size() < 0xFFFFFFFFull, "torch.save entry '{}' of {} bytes needs zip64", e.name, e.data.size());
    const uint32_t crc = crc32_bytes(e.data.data(), e.data.size());
    const uint64_t offset = out.size();
    const uint64_t bare = offset + 30 + e.name.size();
    const uint64_t pad = bare % 64 == 0 ? 0 : (64 - (bare + 4) % 64) % 64 + 4;  // extra field 'FB' + padding
    out += std::string("PK\x03\x04", 4);
    le(out, 20, 2);  // version needed
    le(out, 0, 2);   // flags
    le(out, 0, 2);   // stored
    le(out, 0, 4);   // time, date
    le(out, crc, 4);
    le(out, e.data.size(), 4);
    le(out, e.data.size(), 4);
    le(out, e.name.size(), 2);
    le(out, pad, 2);
    out += e.name;
    if (pad) {
      le(out, 0x4246, 2);
      le(out, pad - 4, 2);
      out.append(pad - 4, 'Z');
    }
    out += e.data;
    cd += std::string("PK\x01\x02", 4);
    le(cd, 20, 2);  // made by
    le(cd, 20, 2);  // needed
    le(cd, 0, 2);
    le(cd, 0, 2);
    le(cd, 0, 4);
    le(cd, crc, 4);
    le(cd, e.data.size(), 4);
    le(cd, e.data.size(), 4);
    le(cd, e.name.size(), 2);
    le(cd, 0, 2);  // extra
    le(cd, 0, 2);  // comment
    le(cd, 0, 2);  // disk
    le(cd, 0, 2);  // internal attributes
    le(cd, 0, 4);  // external attributes
    le(cd, offset, 4);
    cd += e.name;
  }
  MT_CHECK(out.size() < 0xFFFFFFFFull, "torch.save archive of {} bytes needs zip64", out.size());
  const uint64_t cd_off = out.size();
  out += cd;
  out += std::string("PK\x05\x06", 4);
  le(out, 0, 2);
  le(out, 0, 2);
  le(out, entries.size(), 2);
  le(out, entries.size(), 2);
  le(out, cd.size(), 4);
  le(out, cd_off, 4);
  le(out, 0, 2);
  return out;
}

}  // namespace

std::string torch_save_archive(const std::string& pkl, const std::vector<std::string>& storages) {
  std::vector<Entry> e = {{"archive/data.pkl", pkl},
                          {"archive/.format_version", "1"},
                          {"archive/.storage_alignment", "64"},
                          {"archive/byteorder", "little"}};
  for (size_t k = 0; k < storages.size(); ++k) e.push_back({"archive/data/" + std::to_string(k), storages[k]});
  e.push_back({"archive/version", "3\n"});
  e.push_back({"archive/.data/serialization_id", std::string(40, '0')});
  return zip_stored(e);
}

std::string torch_save_tensor(const Shape& shape, const float* values) {
  pickle::Builder b;
  const int64_t n = shape_numel(shape);
  std::vector<int64_t> size, stride(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = b.integer(s);
    s *= shape[d];
  }
  for (int64_t x : shape) size.push_back(b.integer(x));
  const int64_t pid = b.persistent_id(b.tuple({b.str("storage"), b.global("torch", "FloatStorage"), b.str("0"),
                                               b.str("cpu"), b.integer(n)}));
  const int64_t hooks = b.call(b.global("collections", "OrderedDict"), {});
  const int64_t t = b.call(b.global("torch._utils", "_rebuild_tensor_v2"),
                           {pid, b.integer(0), b.tuple(size), b.tuple(stride), b.boolean(false), hooks});
  std::string data(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * 4);
  return torch_save_archive(pickle::serialize(b.pk, t), {data});
}

std::string torch_save_object(const pickle::Pickle& pk, int64_t root) {
  return torch_save_archive(pickle::serialize(pk, root), {});
}

}  // namespace mt::checkpoint::megatron
