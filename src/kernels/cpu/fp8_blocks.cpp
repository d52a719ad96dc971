// Blockwise FP8 ops of ops.def on the CPU: the codes and scales cuBLASLt's block-scaled GEMMs
// read, and that GEMM as "dequantize, then an fp32 GEMM". The reference the CUDA kernels are
// checked against byte for byte, and (through Fp8Store::real_gemms_on_cpu) the real-GEMM path's
// stand-in in CI.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_blocks.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

namespace {

using fp8::kBlockTile;

// x [R, C] f32 quantized in tiles of tile_r x tile_c (edge tiles partial) with the emulation's
// scale rule: put(r, c, code) for every element, scale(r0, c0, 1 / scale) once per tile (r0, c0:
// the tile's first element).
template <class Put, class Scale>
void for_tiles(const Tensor& x, Fp8Format f, int64_t tile_r, int64_t tile_c, Put put, Scale scale) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const float* in = x.data<float>();
  const float mx = fp8_max(f);
  for (int64_t r0 = 0; r0 < R; r0 += tile_r)
    for (int64_t c0 = 0; c0 < C; c0 += tile_c) {
      const int64_t r1 = std::min(R, r0 + tile_r), c1 = std::min(C, c0 + tile_c);
      float a = 0.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) a = std::fmax(a, std::fabs(in[r * C + c]));  // NaN ignored
      const float s = fp8::block_scale(a, mx);
      scale(r0, c0, 1.f / s);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) put(r, c, fp8_encode(in[r * C + c] * s, f));
    }
}

// The output tensors of a cast of x [R, C]: q [R, C] with its scales in tiling `qt_tiles` of outer
// R, and qt [C, R] with its scales in the tiling of outer C. Returns the checked pointers.
struct CastOut {
  uint8_t* q = nullptr;
  float* q_si = nullptr;
  uint8_t* qt = nullptr;
  float* qt_si = nullptr;
};
CastOut cast_outputs(const Tensor& x, Fp8Tiles tiles, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                     Tensor* qt_scale_inv, const char* what) {
  MT_CHECK(x.dtype() == DType::F32 && x.ndim() == 2, "{}: f32 [R, C], got {} {}", what, dtype_name(x.dtype()),
           x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1);
  CastOut o;
  if (q.defined()) {
    check_vector(q, Device::CPU, DType::U8, R * C, what);
    check_vector(q_scale_inv, Device::CPU, DType::F32, fp8::tile_scales(tiles, R, C), what);
    o.q = q.data<uint8_t>();
    o.q_si = q_scale_inv.data<float>();
    std::fill_n(o.q_si, q_scale_inv.numel(), 0.f);
  }
  if (qt) {
    MT_CHECK(qt_scale_inv, "{}: qt without its scales", what);
    check_vector(*qt, Device::CPU, DType::U8, R * C, what);
    check_vector(*qt_scale_inv, Device::CPU, DType::F32, fp8::tile_scales(tiles, C, R), what);
    o.qt = qt->data<uint8_t>();
    o.qt_si = qt_scale_inv->data<float>();
    std::fill_n(o.qt_si, qt_scale_inv->numel(), 0.f);
  }
  MT_CHECK(o.q || o.qt, "{}: neither q nor qt asked for", what);
  return o;
}

}  // namespace

void fp8_block_cast_rows(const Tensor& x, Fp8Format format, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                         Tensor* qt_scale_inv) {
  constexpr Fp8Tiles kRows = Fp8Tiles::Rows1x128;
  const CastOut o = cast_outputs(x, kRows, q, q_scale_inv, qt, qt_scale_inv, "fp8_block_cast_rows");
  const int64_t R = x.dim(0), C = x.dim(1);
  if (o.q)
    for_tiles(
        x, format, 1, kBlockTile, [&](int64_t r, int64_t c, uint8_t v) { o.q[r * C + c] = v; },
        [&](int64_t r0, int64_t c0, float si) { o.q_si[fp8::tile_scale_index(kRows, R, C, r0, c0)] = si; });
  if (o.qt)  // x's 128x1 tiles are qt's 1x128 ones
    for_tiles(
        x, format, kBlockTile, 1, [&](int64_t r, int64_t c, uint8_t v) { o.qt[c * R + r] = v; },
        [&](int64_t r0, int64_t c0, float si) { o.qt_si[fp8::tile_scale_index(kRows, C, R, c0, r0)] = si; });
}

void fp8_block_cast_tiles(const Tensor& x, Fp8Format format, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                          Tensor* qt_scale_inv) {
  constexpr Fp8Tiles kBlocks = Fp8Tiles::Blocks128x128;
  const CastOut o = cast_outputs(x, kBlocks, q, q_scale_inv, qt, qt_scale_inv, "fp8_block_cast_tiles");
  const int64_t R = x.dim(0), C = x.dim(1);
  for_tiles(
      x, format, kBlockTile, kBlockTile,
      [&](int64_t r, int64_t c, uint8_t v) {
        if (o.q) o.q[r * C + c] = v;
        if (o.qt) o.qt[c * R + r] = v;
      },
      [&](int64_t r0, int64_t c0, float si) {
        if (o.q_si) o.q_si[fp8::tile_scale_index(kBlocks, R, C, r0, c0)] = si;
        if (o.qt_si) o.qt_si[fp8::tile_scale_index(kBlocks, C, R, c0, r0)] = si;
      });
}

bool fp8_block_gemm_supported(Device /*device*/, const Fp8BlockGemm& /*g*/) { return true; }

namespace {

// An operand [outer, K] dequantized: code * its tile's scale_inv, as fp32.
std::vector<float> dequantize(const Tensor& codes, Fp8Format f, Fp8Tiles tiles, const Tensor& scale_inv,
                              const char* what) {
  const int64_t outer = codes.dim(0), K = codes.dim(1);
  check_vector(scale_inv, Device::CPU, DType::F32, fp8::tile_scales(tiles, outer, K), what);
  const uint8_t* q = codes.data<uint8_t>();
  const float* si = scale_inv.data<float>();
  std::vector<float> v(static_cast<size_t>(outer * K));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k)
      v[static_cast<size_t>(o * K + k)] = fp8_decode(q[o * K + k], f) * si[fp8::tile_scale_index(tiles, outer, K, o, k)];
  return v;
}

}  // namespace

void fp8_block_gemm_into(const Tensor& a, Fp8Format a_format, Fp8Tiles a_tiles, const Tensor& a_scale_inv,
                         const Tensor& b, Fp8Format b_format, Fp8Tiles b_tiles, const Tensor& b_scale_inv,
                         const Tensor* c, Tensor& d) {
  MT_CHECK(a.dtype() == DType::U8 && b.dtype() == DType::U8 && a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(1),
           "fp8_block_gemm: U8 [M, K] x U8 [N, K], got {} {} and {} {}", dtype_name(a.dtype()), a.shape_str(),
           dtype_name(b.dtype()), b.shape_str());
  MT_CHECK(a_tiles == Fp8Tiles::Rows1x128 || b_tiles == Fp8Tiles::Rows1x128,
           "fp8_block_gemm: two operands in 128x128 tiles (cuBLASLt runs none)");
  const int64_t M = a.dim(0), N = b.dim(0), K = a.dim(1);
  check_vector(d, Device::CPU, DType::F32, M * N, "fp8_block_gemm_into (d)");
  if (c) check_vector(*c, Device::CPU, DType::F32, M * N, "fp8_block_gemm_into (c)");
  const std::vector<float> av = dequantize(a, a_format, a_tiles, a_scale_inv, "fp8_block_gemm_into (a scales)");
  const std::vector<float> bv = dequantize(b, b_format, b_tiles, b_scale_inv, "fp8_block_gemm_into (b scales)");
  const float* add = c ? c->data<float>() : nullptr;  // read before the write: c may be d
  float* out = d.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += av[static_cast<size_t>(m * K + k)] * bv[static_cast<size_t>(n * K + k)];
      out[m * N + n] = acc + (add ? add[m * N + n] : 0.f);
    }
}

}  // namespace mt::ops::host
