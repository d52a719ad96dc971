#pragma once
// The two OCP FP8 formats (OCP 8-bit Floating Point Specification, v1.0) on the host: exact
// encode/decode, and rounding an fp32 value onto a format's grid. This is the CPU's emulation of
// FP8 GEMM inputs and the reference the CUDA casts are checked against.
//   E4M3: bias 7, 3 mantissa bits, max 448, no infinities, NaN = S.1111.111 (0x7F / 0xFF).
//   E5M2: bias 15, 2 mantissa bits, max 57344, IEEE-like: inf = S.11111.00, NaN = S.11111.{01,10,11}.
// Encoding rounds to nearest, ties to even, and saturates as Transformer Engine's casts do
// (cuda's cvt.rn.satfinite): every finite value beyond the max and +-inf become +-max; NaN stays
// NaN (encoded 0x7F with the sign).
#include <cstdint>

namespace mt {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

const char* fp8_format_name(Fp8Format f);
// The largest finite magnitude: 448 or 57344.
float fp8_max(Fp8Format f);
// The OCP value of a code (NaN for NaN codes, +-inf for E5M2's infinities).
float fp8_decode(uint8_t code, Fp8Format f);
// Round-to-nearest-even, saturating; see above.
uint8_t fp8_encode(float x, Fp8Format f);
// fp8_decode(fp8_encode(x)) without the table: x rounded onto the format's grid, saturated.
float fp8_round(float x, Fp8Format f);

}  // namespace mt
