// MD5 as specified by RFC 1321 (kept in-tree so the data layer needs no crypto library).
#include "data/gpt_dataset_md5.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace mt::data {

namespace {

constexpr uint32_t kShift[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

// RFC 1321's table T[i] = floor(2^32 * |sin(i + 1)|).
const std::array<uint32_t, 64>& sine_table() {
  static const std::array<uint32_t, 64> t = [] {
    std::array<uint32_t, 64> k{};
    for (int i = 0; i < 64; ++i) k[i] = static_cast<uint32_t>(std::floor(std::fabs(std::sin(i + 1.0)) * 4294967296.0));
    return k;
  }();
  return t;
}

uint32_t rotl(uint32_t x, uint32_t c) { return (x << c) | (x >> (32 - c)); }

}  // namespace

std::string md5_hex(std::string_view data) {
  const auto& K = sine_table();
  uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  std::vector<uint8_t> msg(data.begin(), data.end());
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  msg.push_back(0x80);
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 0; i < 8; ++i) msg.push_back(static_cast<uint8_t>(bits >> (8 * i)));

  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t m[16];
    for (int i = 0; i < 16; ++i) {
      const uint8_t* p = &msg[off + 4 * i];
      m[i] = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (uint32_t i = 0; i < 64; ++i) {
      uint32_t f, g;
      if (i < 16) { f = (b & c) | (~b & d); g = i; }
      else if (i < 32) { f = (d & b) | (~d & c); g = (5 * i + 1) % 16; }
      else if (i < 48) { f = b ^ c ^ d; g = (3 * i + 5) % 16; }
      else { f = c ^ (b | ~d); g = (7 * i) % 16; }
      f += a + K[i] + m[g];
      a = d;
      d = c;
      c = b;
      b += rotl(f, kShift[i]);
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t w : h) {
    for (int i = 0; i < 4; ++i) {
      const uint8_t byte = static_cast<uint8_t>(w >> (8 * i));
      out.push_back(hex[byte >> 4]);
      out.push_back(hex[byte & 15]);
    }
  }
  return out;
}

}  // namespace mt::data
