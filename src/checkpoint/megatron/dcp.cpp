// PyTorch distributed checkpoint metadata and items (dcp.h).
#include "checkpoint/megatron/dcp.h"

#include <filesystem>

#include "checkpoint/io_util.h"
#include "core/checked.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace mt::checkpoint::megatron {

using pickle::Kind;
using pickle::Node;

namespace {

// Field access on the pickled dataclasses: each is a call of its class with BUILD's state dict.
class View {
 public:
  View(const pickle::Pickle& pk, std::string where) : pk_(pk), where_(std::move(where)) {}
  [[noreturn]] void bad(const std::string& why) const {
    fail("'{}' is not PyTorch distributed checkpoint metadata megatron.cpp reads: {}", where_, why);
  }
  const Node& node(int64_t i) const { return pk_.at(i); }
  // The state dict of an object of class `cls` (module.name).
  int64_t state(int64_t obj, const std::string& cls) const {
    if (pk_.callee(obj) != cls) bad("expected a " + cls);
    const int64_t s = node(obj).items[2];
    if (s < 0 || node(s).kind != Kind::Dict) bad(cls + " without its fields");
    return s;
  }
  int64_t field(int64_t dict, const std::string& key) const {
    const int64_t v = pk_.get(dict, key);
    if (v < 0) bad("a field '" + key + "' is missing");
    return v;
  }
  std::string str(int64_t v, const std::string& what) const {
    if (node(v).kind != Kind::Str) bad(what + " is not a string");
    return node(v).s;
  }
  int64_t num(int64_t v, const std::string& what) const {
    if (node(v).kind != Kind::Int || node(v).i < 0) bad(what + " is not a non-negative integer");
    return node(v).i;
  }
  // torch.Size((a, b, ...)): a call of torch.Size with one tuple of ints.
  std::vector<int64_t> size(int64_t v, const std::string& what) const {
    if (pk_.callee(v) != "torch.Size") bad(what + " is not a torch.Size");
    const Node& args = node(node(v).items[1]);
    if (args.items.size() != 1 || node(args.items[0]).kind != Kind::Tuple) bad(what + " is not a torch.Size");
    std::vector<int64_t> out;
    for (int64_t x : node(args.items[0]).items) out.push_back(num(x, what));
    if (out.size() > 8) bad(what + " has more than 8 dimensions");
    return out;
  }
  const pickle::Pickle& pk() const { return pk_; }

 private:
  const pickle::Pickle& pk_;
  std::string where_;
};

const std::string kMd = "torch.distributed.checkpoint.metadata.";

}  // namespace

DcpMetadata parse_dcp_metadata(const pickle::Pickle& pk, const std::string& where) {
  View v(pk, where);
  const int64_t top = v.state(pk.root, kMd + "Metadata");
  const int64_t sdm = v.field(top, "state_dict_metadata"), sd = v.field(top, "storage_data");
  if (v.node(sdm).kind != Kind::Dict || v.node(sd).kind != Kind::Dict) v.bad("state_dict_metadata or storage_data is not a dict");
  DcpMetadata md;
  const auto& items = v.node(sdm).items;
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    const std::string name = v.str(items[k], "a state dict key");
    const int64_t e = items[k + 1];
    const std::string cls = pk.callee(e);
    if (cls == kMd + "BytesStorageMetadata") {
      md.bytes[name] = {};
      continue;
    }
    const int64_t s = v.state(e, kMd + "TensorStorageMetadata");
    DcpTensor t;
    const int64_t props = v.field(s, "properties");
    if (pk.callee(props) != kMd + "TensorProperties") v.bad("tensor '" + name + "' has no TensorProperties");
    // TensorProperties pickles its fields as a tuple state, dtype first.
    const int64_t ps = v.node(props).items[2];
    int64_t dtype = -1;
    if (ps >= 0 && v.node(ps).kind == Kind::Tuple && !v.node(ps).items.empty()) dtype = v.node(ps).items[0];
    else if (ps >= 0 && v.node(ps).kind == Kind::Dict) dtype = pk.get(ps, "dtype");
    if (dtype < 0 || v.node(dtype).kind != Kind::Global || v.node(dtype).s != "torch")
      v.bad("tensor '" + name + "' has no torch dtype");
    t.dtype = v.node(dtype).name;
    t.size = v.size(v.field(s, "size"), "the size of '" + name + "'");
    const int64_t numel = checked_product(t.size, where + ": tensor " + name);
    (void)numel;
    const int64_t chunks = v.field(s, "chunks");
    if (v.node(chunks).kind != Kind::List) v.bad("the chunks of '" + name + "' are not a list");
    for (int64_t c : v.node(chunks).items) {
      const int64_t cs = v.state(c, kMd + "ChunkStorageMetadata");
      DcpChunk ch;
      ch.offsets = v.size(v.field(cs, "offsets"), "a chunk offset of '" + name + "'");
      ch.sizes = v.size(v.field(cs, "sizes"), "a chunk size of '" + name + "'");
      if (ch.offsets.size() != t.size.size() || ch.sizes.size() != t.size.size())
        v.bad("a chunk of '" + name + "' has another rank than the tensor");
      for (size_t d = 0; d < t.size.size(); ++d)
        if (ch.offsets[d] > t.size[d] || ch.sizes[d] > t.size[d] - ch.offsets[d])
          v.bad("a chunk of '" + name + "' reaches outside the tensor");
      t.chunks.push_back(std::move(ch));
    }
    if (!md.tensors.emplace(name, std::move(t)).second) v.bad("tensor '" + name + "' is listed twice");
    md.order.push_back(name);
  }
  // Where each item lives: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length).
  const auto& where_items = v.node(sd).items;
  for (size_t k = 0; k + 1 < where_items.size(); k += 2) {
    const int64_t idx = v.state(where_items[k], kMd + "MetadataIndex");
    const int64_t info = v.state(where_items[k + 1], "torch.distributed.checkpoint.filesystem._StorageInfo");
    const std::string fqn = v.str(v.field(idx, "fqn"), "a storage fqn");
    DcpRange r;
    r.file = v.str(v.field(info, "relative_path"), "a relative_path");
    if (!is_plain_file_name(r.file)) v.bad("item '" + fqn + "' names file '" + r.file + "' outside the directory");
    r.offset = static_cast<uint64_t>(v.num(v.field(info, "offset"), "an item offset"));
    r.length = static_cast<uint64_t>(v.num(v.field(info, "length"), "an item length"));
    const int64_t off = pk.get(idx, "offset");  // absent or None for a bytes item
    if (off < 0 || v.node(off).kind == Kind::None) {
      auto it = md.bytes.find(fqn);
      if (it == md.bytes.end()) v.bad("storage for unknown bytes item '" + fqn + "'");
      it->second = r;
      continue;
    }
    auto it = md.tensors.find(fqn);
    if (it == md.tensors.end()) v.bad("storage for unknown tensor '" + fqn + "'");
    const std::vector<int64_t> o = v.size(off, "an item offset of '" + fqn + "'");
    bool found = false;
    for (auto& ch : it->second.chunks)
      if (ch.offsets == o && ch.where.file.empty()) {
        ch.where = r;
        found = true;
        break;
      }
    if (!found) v.bad("storage for a chunk of '" + fqn + "' that its metadata does not list");
  }
  for (const auto& [name, t] : md.tensors)
    for (const auto& ch : t.chunks)
      if (ch.where.file.empty()) v.bad("a chunk of '" + name + "' has no storage");
  for (const auto& [name, r] : md.bytes)
    if (r.file.empty()) v.bad("item '" + name + "' has no storage");
  return md;
}

DcpReader::DcpReader(const std::string& dir) : dir_(dir) {
  const std::string path = (fs::path(dir) / ".metadata").string();
  MappedFile f(path, "--load (torch_dist metadata)");
  md_ = parse_dcp_metadata(pickle::parse(f.data(), f.size(), path), path);
}

DcpReader::~DcpReader() = default;

Bytes DcpReader::range(const DcpRange& r, const std::string& what) {
  auto it = files_.find(r.file);
  if (it == files_.end()) {
    const std::string path = (fs::path(dir_) / r.file).string();
    it = files_.emplace(r.file, std::make_unique<MappedFile>(path, "torch_dist data file")).first;
  }
  const MappedFile& f = *it->second;
  if (r.offset > f.size() || r.length > f.size() - r.offset)
    fail("'{}' is truncated or corrupt: {} lies at bytes {}..{} of a {}-byte file", f.path(), what, r.offset,
         r.offset + r.length, f.size());
  return Bytes{f.data() + r.offset, r.length};
}

HostTensor DcpReader::read(const std::string& name) {
  auto it = md_.tensors.find(name);
  if (it == md_.tensors.end()) fail("tensor '{}' is missing from torch_dist checkpoint '{}'", name, dir_);
  const DcpTensor& t = it->second;
  // Every chunk's bytes lie in their file, and together hold at least a byte per element, before
  // the tensor is allocated: a metadata file claiming a huge tensor cannot make us allocate it.
  std::vector<Bytes> data;
  uint64_t stored = 0;
  for (const auto& ch : t.chunks) {
    data.push_back(range(ch.where, fmt::format("a chunk of '{}'", name)));
    stored += data.back().size;
  }
  const int64_t n = shape_numel(t.size);
  if (static_cast<uint64_t>(n) > stored)
    fail("torch_dist checkpoint '{}' is corrupt: tensor '{}' has {} elements but its chunks hold {} bytes", dir_, name,
         n, stored);
  HostTensor out;
  out.shape = t.size;
  out.values.assign(static_cast<size_t>(n), 0.f);
  std::vector<bool> seen(static_cast<size_t>(n), false);
  int64_t covered = 0;
  for (size_t k = 0; k < t.chunks.size(); ++k) {
    const DcpChunk& ch = t.chunks[k];
    const std::string what = fmt::format("a chunk of '{}'", name);
    TorchSave ts(data[k], fmt::format("{}/{} ({})", dir_, ch.where.file, what));
    HostTensor c = ts.tensor(ts.pickle().root, what);
    if (c.shape != Shape(ch.sizes.begin(), ch.sizes.end()))
      fail("torch_dist checkpoint '{}' is corrupt: {} has shape {}, its metadata says {}", dir_, what,
           shape_to_string(c.shape), shape_to_string(Shape(ch.sizes.begin(), ch.sizes.end())));
    // Row-major walk of the chunk's box inside the global tensor.
    const size_t r = t.size.size();
    std::vector<int64_t> idx(r, 0);
    for (size_t e = 0; e < c.values.size(); ++e) {
      int64_t g = 0;
      for (size_t d = 0; d < r; ++d) g = g * t.size[d] + ch.offsets[d] + idx[d];
      if (seen[static_cast<size_t>(g)])
        fail("torch_dist checkpoint '{}' is corrupt: chunks of '{}' overlap", dir_, name);
      seen[static_cast<size_t>(g)] = true;
      out.values[static_cast<size_t>(g)] = c.values[e];
      ++covered;
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < ch.sizes[d]) break;
        idx[d] = 0;
      }
    }
  }
  if (covered != n)
    fail("torch_dist checkpoint '{}' is incomplete: the chunks of '{}' hold {} of its {} elements", dir_, name, covered,
         n);
  return out;
}

std::string DcpReader::find_object(const std::string& prefix) const {
  for (const auto& [name, r] : md_.bytes)
    if (name.rfind(prefix, 0) == 0) return name;
  fail("torch_dist checkpoint '{}' has no '{}' item (not a Megatron-LM checkpoint?)", dir_, prefix);
}

TorchSave DcpReader::object(const std::string& name) {
  auto it = md_.bytes.find(name);
  if (it == md_.bytes.end()) fail("torch_dist checkpoint '{}' has no item '{}'", dir_, name);
  return TorchSave(range(it->second, "item '" + name + "'"), fmt::format("{}/{} (item '{}')", dir_, it->second.file, name));
}

}  // namespace mt::checkpoint::megatron
