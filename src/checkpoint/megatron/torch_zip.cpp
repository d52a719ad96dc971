// Stored zips and torch.save archives (torch_zip.h).
#include "checkpoint/megatron/torch_zip.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"

namespace mt::checkpoint::megatron {

using pickle::Kind;

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  int fd = open_regular_file(path, what, &size_);
  if (size_ == 0) {
    ::close(fd);
    fail("{} '{}' is empty", what, path);
  }
  void* addr = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) fail("cannot map {} '{}' into memory", what, path);
  data_ = static_cast<const uint8_t*>(addr);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

uint64_t rd(const uint8_t* p, int k) {
  uint64_t v = 0;
  for (int i = 0; i < k; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

StoredZip::StoredZip(Bytes b, std::string where) {
  auto bad = [&](const std::string& why) -> void {
    fail("'{}' is not a torch.save archive megatron.cpp reads: {}", where, why);
  };
  const uint64_t n = b.size;
  if (n < 22) bad("too short for a zip");
  // The end-of-central-directory record: the last 22 bytes unless a comment follows it.
  uint64_t eocd = UINT64_MAX;
  for (uint64_t back = 22; back <= std::min<uint64_t>(n, 22 + 65535); ++back)
    if (rd(b.data + n - back, 4) == 0x06054b50) {
      eocd = n - back;
      break;
    }
  if (eocd == UINT64_MAX) bad("no end-of-central-directory record");
  const uint8_t* e = b.data + eocd;
  uint64_t count = rd(e + 10, 2), cd_size = rd(e + 12, 4), cd_off = rd(e + 16, 4);
  if (rd(e + 4, 2) != 0 || rd(e + 6, 2) != 0) bad("a multi-disk zip");
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {  // zip64
    if (eocd < 20 || rd(e - 20, 4) != 0x07064b50) bad("a zip64 archive without its locator");
    const uint64_t z = rd(e - 20 + 8, 8);
    if (z > n || n - z < 56 || rd(b.data + z, 4) != 0x06064b50) bad("a zip64 end record out of bounds");
    count = rd(b.data + z + 32, 8);
    cd_size = rd(b.data + z + 40, 8);
    cd_off = rd(b.data + z + 48, 8);
  }
  if (cd_off > n || cd_size > n - cd_off) bad("its central directory reaches past the end of the file");
  if (count > cd_size / 46) bad("more entries than its central directory holds");
  uint64_t p = cd_off;
  const uint64_t end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - p < 46 || rd(b.data + p, 4) != 0x02014b50) bad("a corrupt central directory entry");
    const uint8_t* c = b.data + p;
    const uint64_t method = rd(c + 10, 2), name_len = rd(c + 28, 2), extra_len = rd(c + 30, 2),
                   comment_len = rd(c + 32, 2);
    uint64_t csize = rd(c + 20, 4), usize = rd(c + 24, 4), local = rd(c + 42, 4);
    if (end - p - 46 < name_len + extra_len + comment_len) bad("a central directory entry past its end");
    std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    // Zip64 sizes and offset live in extra field 1, in this order, for the fields that overflowed.
    for (uint64_t x = 0; x + 4 <= extra_len;) {
      const uint8_t* f = c + 46 + name_len + x;
      const uint64_t id = rd(f, 2), len = rd(f + 2, 2);
      if (x + 4 + len > extra_len) bad("a corrupt extra field in entry '" + name + "'");
      if (id == 1) {
        uint64_t q = 0;
        auto take = [&](uint64_t& v) {
          if (v != 0xFFFFFFFF) return;
          if (q + 8 > len) bad("a short zip64 field in entry '" + name + "'");
          v = rd(f + 4 + q, 8);
          q += 8;
        };
        take(usize);
        take(csize);
        take(local);
      }
      x += 4 + len;
    }
    if (method != 0 || csize != usize)
      bad("entry '" + name + "' is compressed (torch.save stores entries uncompressed)");
    if (local > n || n - local < 30 || rd(b.data + local, 4) != 0x04034b50)
      bad("entry '" + name + "' has no local header in bounds");
    const uint64_t data = local + 30 + rd(b.data + local + 26, 2) + rd(b.data + local + 28, 2);
    if (data > n || usize > n - data) bad("entry '" + name + "' reaches past the end of the file");
    if (!entries_.emplace(name, Bytes{b.data + data, usize}).second) bad("entry '" + name + "' appears twice");
    p += 46 + name_len + extra_len + comment_len;
  }
}

TorchSave::TorchSave(Bytes b, std::string where) : where_(std::move(where)), zip_(b, where_) {
  const Bytes* pkl = nullptr;
  for (const auto& [name, bytes] : zip_.entries()) {
    const auto slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
      if (pkl) fail("'{}' holds two data.pkl entries", where_);
      pkl = &bytes;
      prefix_ = name.substr(0, slash);
    }
  }
  if (!pkl) fail("'{}' is not a torch.save archive: it has no <name>/data.pkl entry", where_);
  pk_ = pickle::parse(pkl->data, pkl->size, where_ + " (data.pkl)");
}

bool TorchSave::is_tensor(int64_t n) const {
  return n >= 0 && pk_.callee(n) == "torch._utils._rebuild_tensor_v2";
}

namespace {

// Bytes per element of a storage class, and its dtype (F32 for f64, converted on read).
struct StorageType {
  const char* name;
  int bytes;
  bool floating;
};
constexpr StorageType kStorages[] = {
    {"FloatStorage", 4, true},  {"BFloat16Storage", 2, true}, {"HalfStorage", 2, true},
    {"DoubleStorage", 8, true}, {"LongStorage", 8, false},    {"IntStorage", 4, false},
    {"ShortStorage", 2, false}, {"CharStorage", 1, false},    {"ByteStorage", 1, false},
    {"BoolStorage", 1, false}};

double element(const StorageType& t, const uint8_t* p) {
  const std::string n = t.name;
  if (n == "FloatStorage") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (n == "BFloat16Storage") return bf16_to_f32(static_cast<uint16_t>(rd(p, 2)));
  if (n == "HalfStorage") return f16_to_f32(static_cast<uint16_t>(rd(p, 2)));
  if (n == "DoubleStorage") {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  if (n == "CharStorage") return static_cast<int8_t>(p[0]);
  if (n == "ShortStorage") return static_cast<int16_t>(rd(p, 2));
  if (n == "IntStorage") return static_cast<int32_t>(rd(p, 4));
  if (n == "LongStorage") return static_cast<double>(static_cast<int64_t>(rd(p, 8)));
  return p[0];
}

}  // namespace

// Reads a tensor's values through `fn(double)` in row-major order; returns its shape.
template <typename Fn>
static Shape walk_tensor(const pickle::Pickle& pk, const std::map<std::string, Bytes>& entries,
                         const std::string& prefix, const std::string& where, int64_t n, const std::string& what,
                         bool want_float, Fn&& fn) {
  auto bad = [&](const std::string& why) -> void { fail("'{}': tensor {} is corrupt: {}", where, what, why); };
  const pickle::Node& args = pk.at(pk.at(n).items[1]);
  if (args.items.size() < 4) bad("too few rebuild arguments");
  const pickle::Node& pid = pk.at(args.items[0]);
  if (pid.kind != Kind::PersId) bad("its storage is not a persistent id");
  const pickle::Node& id = pk.at(pid.items[0]);
  if (id.kind != Kind::Tuple || id.items.size() < 5) bad("a persistent id that is not ('storage', type, key, ...)");
  const pickle::Node &tag = pk.at(id.items[0]), &type = pk.at(id.items[1]), &key = pk.at(id.items[2]),
                     &numel = pk.at(id.items[4]);
  if (tag.kind != Kind::Str || tag.s != "storage" || type.kind != Kind::Global || key.kind != Kind::Str ||
      numel.kind != Kind::Int || numel.i < 0)
    bad("a persistent id that is not ('storage', type, key, location, numel)");
  const StorageType* st = nullptr;
  for (const auto& s : kStorages)
    if (type.s == "torch" && type.name == s.name) st = &s;
  if (!st) bad("storage type " + type.s + "." + type.name + " is not one megatron.cpp reads");
  if (want_float && !st->floating) bad(std::string("an integer storage (") + st->name + ") where floats belong");
  auto it = entries.find(prefix + "/data/" + key.s);
  if (it == entries.end()) bad("its storage '" + key.s + "' is missing from the archive");
  const int64_t need = checked_mul(numel.i, st->bytes, where + ": storage size");
  if (static_cast<uint64_t>(need) > it->second.size)
    bad(fmt::format("storage '{}' holds {} bytes, its {} elements need {}", key.s, it->second.size, numel.i, need));
  const pickle::Node &off = pk.at(args.items[1]), &size = pk.at(args.items[2]), &stride = pk.at(args.items[3]);
  if (off.kind != Kind::Int || off.i < 0 || size.kind != Kind::Tuple || stride.kind != Kind::Tuple ||
      size.items.size() != stride.items.size() || size.items.size() > 8)
    bad("offset, sizes and strides do not describe a tensor");
  Shape shape;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < size.items.size(); ++d) {
    const pickle::Node &s = pk.at(size.items[d]), &t = pk.at(stride.items[d]);
    if (s.kind != Kind::Int || t.kind != Kind::Int || s.i < 0 || t.i < 0) bad("a negative or non-integer size");
    shape.push_back(s.i);
    strides.push_back(t.i);
  }
  const int64_t count = checked_product(shape, where + ": tensor " + what);
  if (count == 0) return shape;
  // A view never has more elements than its storage (but for stride-0 expansions, which
  // checkpoints do not hold): this bounds what a hostile shape can make us allocate.
  if (count > numel.i) bad(fmt::format("{} elements in a storage of {}", count, numel.i));
  int64_t last = off.i;  // the highest element index the tensor reaches
  for (size_t d = 0; d < shape.size(); ++d)
    last = checked_add(last, checked_mul(shape[d] - 1, strides[d], where + ": strides"), where + ": strides");
  if (last >= numel.i) bad(fmt::format("it reaches element {} of a storage of {}", last, numel.i));
  const uint8_t* base = it->second.data;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < count; ++k) {
    int64_t e = off.i;
    for (size_t d = 0; d < shape.size(); ++d) e += idx[d] * strides[d];
    fn(element(*st, base + e * st->bytes));
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return shape;
}

HostTensor TorchSave::tensor(int64_t n, const std::string& what) const {
  if (!is_tensor(n)) fail("'{}': {} is not a tensor", where_, what);
  HostTensor t;
  t.shape = walk_tensor(pk_, zip_.entries(), prefix_, where_, n, what, true,
                        [&](double v) { t.values.push_back(static_cast<float>(v)); });
  return t;
}

double TorchSave::number(int64_t n, const std::string& what) const {
  const pickle::Node& v = pk_.at(n);
  if (v.kind == Kind::Int) return static_cast<double>(v.i);
  if (v.kind == Kind::Float) return v.f;
  if (!is_tensor(n)) fail("'{}': {} is not a number", where_, what);
  std::vector<double> vals;
  walk_tensor(pk_, zip_.entries(), prefix_, where_, n, what, false, [&](double x) { vals.push_back(x); });
  if (vals.size() != 1) fail("'{}': {} should be one number, it has {} elements", where_, what, vals.size());
  return vals[0];
}

}  // namespace mt::checkpoint::megatron
