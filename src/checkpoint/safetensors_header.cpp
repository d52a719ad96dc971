// The safetensors header check, apart from the file mapping so the fuzzer can feed it bytes. It
// holds a file to what the reference implementation accepts: every size is checked before use,
// and the tensors' byte ranges must tile the data section exactly (no overlap, no hole, nothing
// past the end), so no two tensors alias the same bytes.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "checkpoint/json_fields.h"
#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/error.h"

namespace mt::checkpoint {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

DType parse_dtype(const nlohmann::json& v, const std::string& what) {
  const std::string s = json_string(v, what);
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16, DType::U8})
    if (s == safetensors_dtype(t)) return t;
  fail("{}: unsupported safetensors dtype '{}' (megatron.cpp reads F32, BF16, F16, I32, I64, U16, U8)", what,
       s.substr(0, 40));
}

}  // namespace

SafetensorsHeader parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& path) {
  if (size < 8) fail("'{}' is not a safetensors file (only {} bytes)", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian, whatever the host
  if (n > size - 8 || n > kMaxHeaderBytes)
    fail("'{}' has a corrupt safetensors header (length {} of a {}-byte file)", path, n, size);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' has a corrupt safetensors header: {}", path, e.what());
  }
  if (!header.is_object()) fail("'{}' has a corrupt safetensors header (not a JSON object)", path);
  const uint64_t data_size = size - 8 - n;
  const uint8_t* base = bytes + 8 + n;
  SafetensorsHeader out;
  struct Range {
    uint64_t lo, hi;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string where = fmt::format("'{}': tensor '{}'", path, it.key().substr(0, 200));
    if (it.key() == "__metadata__") {
      if (it.value().is_null()) continue;
      if (!it.value().is_object()) fail("'{}': __metadata__ must be an object of strings", path);
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) out.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    JsonFields f(it.value(), where);
    TensorEntry e;
    e.name = it.key();
    e.dtype = parse_dtype(f.at("dtype"), where + " dtype");
    e.shape = json_int_array(f.at("shape"), where + " shape", 0, INT64_MAX);
    const std::vector<int64_t> offs = json_int_array(f.at("data_offsets"), where + " data_offsets", 0, INT64_MAX, 2);
    const uint64_t lo = static_cast<uint64_t>(offs[0]), hi = static_cast<uint64_t>(offs[1]);
    if (lo > hi || hi > data_size)
      fail("{} has data offsets [{}, {}] outside the {} data bytes of the file (truncated?)", where, lo, hi, data_size);
    const int64_t nbytes =
        checked_mul(checked_product(e.shape, where + " shape"), static_cast<int64_t>(dtype_size(e.dtype)), where);
    if (static_cast<uint64_t>(nbytes) != hi - lo)
      fail("{} holds {} bytes but its shape {} of {} needs {}", where, hi - lo, shape_to_string(e.shape),
           safetensors_dtype(e.dtype), nbytes);
    e.data = base + lo;
    e.nbytes = hi - lo;
    auto [pos, fresh] = out.tensors.emplace(e.name, e);
    MT_CHECK(fresh, "a JSON object with key '{}' twice", e.name);  // nlohmann keeps the last of duplicates
    ranges.push_back({lo, hi, &pos->first});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi;
  });
  uint64_t end = 0;
  for (const Range& r : ranges) {
    if (r.lo < end) fail("'{}': tensor '{}' overlaps the bytes of another tensor (corrupt file)", path, *r.name);
    if (r.lo > end) fail("'{}': {} bytes before tensor '{}' belong to no tensor (corrupt file)", path, r.lo - end, *r.name);
    end = r.hi;
  }
  if (end != data_size)
    fail("'{}': {} bytes after the last tensor belong to no tensor (corrupt or appended-to file)", path, data_size - end);
  return out;
}

}  // namespace mt::checkpoint
