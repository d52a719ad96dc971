#include "training/tfrecord.h"

#include <array>
#include <cstring>

#include "core/error.h"

namespace mt::tfrecord {
namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), one table lookup per byte: event files
// are small and written once per interval, so speed does not matter here.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + static_cast<size_t>(i)]);
  return v;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t c = 0xffffffffu;
  for (char ch : bytes) c = kTable[(c ^ static_cast<uint8_t>(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  put_u32(out, masked_crc32c(std::string_view(out.data(), 8)));
  out.append(data);
  put_u32(out, masked_crc32c(data));
  return out;
}

std::vector<std::string> read_records(std::string_view bytes, const std::string& what, uint64_t max_record) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) fail("{}: truncated record header at byte {}", what, at);
    const uint64_t n = get_le(bytes, at, 8);
    if (static_cast<uint32_t>(get_le(bytes, at + 8, 4)) != masked_crc32c(bytes.substr(at, 8)))
      fail("{}: record length CRC mismatch at byte {}", what, at);
    // The length is checked against what is left before any arithmetic, so it cannot wrap.
    if (n > max_record || n > bytes.size() - at - 12 || bytes.size() - at - 12 - n < 4)
      fail("{}: record at byte {} claims {} bytes, beyond the end of the file", what, at, n);
    const std::string_view data = bytes.substr(at + 12, n);
    if (static_cast<uint32_t>(get_le(bytes, at + 12 + n, 4)) != masked_crc32c(data))
      fail("{}: record data CRC mismatch at byte {}", what, at);
    out.emplace_back(data);
    at += 16 + n;
  }
  return out;
}

}  // namespace mt::tfrecord
