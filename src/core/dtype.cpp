#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace mt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U16: return "uint16";
    case DType::U8: return "uint8";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "float32" || n == "f32" || n == "fp32" || n == "F32") return DType::F32;
  if (n == "bfloat16" || n == "bf16" || n == "BF16") return DType::BF16;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "F16") return DType::F16;
  if (n == "int32" || n == "i32" || n == "I32") return DType::I32;
  if (n == "int64" || n == "i64" || n == "I64") return DType::I64;
  if (n == "uint16" || n == "u16" || n == "U16") return DType::U16;
  if (n == "uint8" || n == "u8" || n == "U8") return DType::U8;
  fail("unknown dtype '{}' (expected float32, bfloat16, float16, int32, int64, uint16 or uint8)", n);
}

// IEEE half conversion with round-to-nearest-even, subnormals, inf and nan.
uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x00800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return static_cast<uint16_t>(half);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {
      float v = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&out, &v, 4);
      out |= sign;
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace mt
