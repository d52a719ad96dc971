#pragma once
// Element types and the bf16/f16 <-> f32 conversions used by the CPU engine.
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws mt::Error on unknown names

// Round-to-nearest-even f32 -> bf16 (NaN stays NaN), as torch and CUDA do.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Rounds an f32 through bf16 and back (what a bf16 store followed by a load sees).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace mt
