// The GPU path of an FP8 linear under blockwise scaling (DeepSeek-V3's recipe; model/fp8.h): the
// operands cast to real FP8 codes in their tiles, each with the power-of-two scale of its own amax
// (the emulation's rule, model/fp8.cpp, so the codes read back are exactly the emulated operands),
// and the three GEMMs run through cuBLASLt's block-scaled FP8 matmul (kernels/cuda/
// fp8_block_gemm.cpp) with fp32 accumulation, where the emulation runs activation-type GEMMs on
// the read-back values. Hopper's FP8 GEMMs read both operands K-major, the tiles run along K:
//   forward  y  [rows, out] = x [rows, in] (1x128)      . w [out, in] (128x128)
//   dgrad    dx [rows, in]  = dy [rows, out] (1x128)    . w^T [in, out] (the same tiles, transposed)
//   wgrad    dw [out, in]   = dy^T [out, rows] (1x128)  . x^T [in, rows] (1x128: x's 128x1 tiles)
// One cast of an activation or gradient writes its row-major codes and the transposed ones the
// weight gradient needs. There is no scaling state (a scale is a function of its tile), so a
// recomputed forward or an evaluation simply casts again. Memory as the per-tensor path
// (fp8_gemms.cpp): the weight's codes cached for the optimizer step, its transpose cast again in
// each backward, the input kept as transposed codes where the caller can drop its own copy.
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "model/fp8.h"

namespace mt::model {

namespace {

constexpr Fp8Tiles kRows = Fp8Tiles::Rows1x128, kBlocks = Fp8Tiles::Blocks128x128;

Tensor codes(int64_t r, int64_t c, Device d) { return Tensor::empty({r, c}, DType::U8, d); }
Tensor scales(Fp8Tiles t, int64_t outer, int64_t k, Device d) {
  return Tensor::empty({fp8::tile_scales(t, outer, k)}, DType::F32, d);
}
Tensor rows2d(const Tensor& x) { return x.view({x.numel() / x.dim(-1), x.dim(-1)}); }
bool mult128(int64_t v) { return v > 0 && v % fp8::kBlockTile == 0; }

// Why a linear of rows x in -> out cannot run its GEMMs through cuBLASLt on `d`; empty if it can.
std::string refusal(Device d, int64_t rows, int64_t in, int64_t out, DType act, const Fp8Config& c) {
  if (!mult128(rows) || !mult128(in) || !mult128(out))
    return "a dimension is not a multiple of the 128-wide tiles (rows: the micro-batch's tokens on this rank)";
  const Fp8Format ff = c.forward_format(), gf = c.grad_format();
  struct Named {
    const char* name;
    ops::Fp8BlockGemm g;
  };
  std::vector<Named> gemms = {{"forward", {rows, out, in, ff, ff, kRows, kBlocks, act, false}},
                              {"data-gradient", {rows, in, out, gf, ff, kRows, kBlocks, act, false}}};
  if (c.wgrad) gemms.push_back({"weight-gradient", {out, in, rows, gf, ff, kRows, kRows, DType::F32, false}});
  for (const Named& n : gemms)
    if (!ops::fp8_block_gemm_supported(d, n.g))
      return fmt::format(
          "cuBLASLt offers no block-scaled FP8 algorithm for its {} GEMM ({} x {} x {}, {} x {}; it needs Hopper and "
          "CUDA 12.9 or newer{})",
          n.name, n.g.m, n.g.n, n.g.k, fp8_format_name(n.g.a_format), fp8_format_name(n.g.b_format),
          c.hybrid ? "; with E5M2 gradients refused, --fp8-format e4m3 is blockwise's usual format" : "");
  return {};
}

// One GEMM's operand: codes and their scale_invs in a tiling.
struct Codes {
  const Tensor& q;
  const Tensor& scale_inv;
  Fp8Format format;
  Fp8Tiles tiles;
};

// d = a . b^T (+ c), c in cuBLASLt's epilogue where it offers that for this GEMM, else added after
// the GEMM (through a fresh product where c is d itself: the weight gradient's accumulation).
void block_gemm(const Codes& a, const Codes& b, const Tensor* c, Tensor& d) {
  auto gemm = [&](const Tensor* with, Tensor& into) {
    ops::fp8_block_gemm_into(a.q, a.format, a.tiles, a.scale_inv, b.q, b.format, b.tiles, b.scale_inv, with, into);
  };
  const ops::Fp8BlockGemm g{a.q.dim(0), b.q.dim(0), a.q.dim(1), a.format, b.format, a.tiles, b.tiles, d.dtype(), true};
  if (!c || ops::fp8_block_gemm_supported(d.device(), g)) return gemm(c, d);
  if (c != &d) {
    gemm(nullptr, d);
    ops::add_inplace(d, *c);
    return;
  }
  Tensor p = Tensor::empty(d.shape(), d.dtype(), d.device());
  gemm(nullptr, p);
  ops::add_inplace(d, p);
}

// The weight's codes in 128x128 tiles and their scale_invs, cached per optimizer step in
// training; evaluation casts with nothing cached (as the per-tensor path's weight_codes).
void weight_tiles(Fp8LinearState& s, const Fp8Store& store, const Tensor& w, const PassContext& ctx, Tensor& q,
                  Tensor& q_scale_inv) {
  if (ctx.training && s.weight_epoch == store.epoch() && s.weight_codes.defined()) {
    q = s.weight_codes;
    q_scale_inv = s.weight_scale_inv;
    return;
  }
  q = codes(w.dim(0), w.dim(1), w.device());
  q_scale_inv = scales(kBlocks, w.dim(0), w.dim(1), w.device());
  ops::fp8_block_cast_tiles(w, store.config().forward_format(), q, q_scale_inv, nullptr, nullptr);
  if (ctx.training) {
    s.weight_codes = q;
    s.weight_scale_inv = q_scale_inv;
    s.weight_epoch = store.epoch();
  }
}

}  // namespace

bool Fp8Linear::block_real_gemms(const Tensor& x, const Tensor& w) const {
  if (w.ndim() != 2 || x.dim(-1) != w.dim(1)) return false;
  const Fp8Config& c = store->config();
  const int64_t rows = x.numel() / x.dim(-1), in = w.dim(1), out = w.dim(0);
  // Asked once per shape: cuBLASLt's answer does not change, and a refusal is worth one warning.
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool>;
  const Key key{static_cast<int>(x.device()), static_cast<int>(x.dtype()), rows, in, out, c.hybrid, c.wgrad};
  static std::mutex mu;
  static std::map<Key, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it == known.end()) {
    const std::string why = refusal(x.device(), rows, in, out, x.dtype(), c);
    if (!why.empty())
      log_warn(
          "--fp8-recipe blockwise: {} and every linear of its shape ({} rows x {} -> {}) run emulated (operands "
          "quantized and read back, {} GEMMs): {}",
          state->name, rows, in, out, dtype_name(x.dtype()), why);
    it = known.emplace(key, why.empty()).first;
  }
  return it->second;
}

Tensor Fp8Linear::block_gemm_forward(const Tensor& x, const Tensor& w, const Tensor* residual, bool keep_x_t,
                                     PassContext& ctx) const {
  const Fp8Format ff = store->config().forward_format();
  const Tensor x2 = rows2d(x);
  const int64_t rows = x2.dim(0), in = x2.dim(1), out = w.dim(0);
  MT_CHECK(w.dim(1) == in, "{}: an FP8 GEMM of input {} and weight {}", state->name, x.shape_str(), w.shape_str());
  const Device dev = x.device();
  Tensor q = codes(rows, in, dev), q_si = scales(kRows, rows, in, dev);
  Tensor x_t, x_t_si;
  if (keep_x_t) {
    x_t = codes(in, rows, dev);
    x_t_si = scales(kRows, in, rows, dev);
  }
  Tensor wq, w_si;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    ops::fp8_block_cast_rows(x2, ff, q, q_si, keep_x_t ? &x_t : nullptr, keep_x_t ? &x_t_si : nullptr);
    if (ctx.recomputing) {
      // The re-run of a forward whose backward comes next: now (if asked) it keeps the transposed
      // codes that the first run, inside a recomputed group, did not.
      MT_CHECK(!state->saved.empty(), "{}: an FP8 recomputation without its first forward", state->name);
      if (keep_x_t) {
        state->saved.front().x_t = x_t;
        state->saved.front().x_t_scale_inv = x_t_si;
      }
    } else if (ctx.training) {
      state->saved.push_back(Fp8Saved{Tensor(), Tensor(), x_t, x_t_si});
    }
    weight_tiles(*state, *store, w, ctx, wq, w_si);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  Tensor y = Tensor::empty({rows, out}, x.dtype(), dev);
  block_gemm({q, q_si, ff, kRows}, {wq, w_si, ff, kBlocks}, residual, y);
  return y;
}

Tensor Fp8Linear::block_gemm_backward(const Fp8Saved& e, const Tensor& dy2, const Tensor& x, const Tensor& w,
                                      Tensor& dw, bool accumulate_dw, PassContext& ctx) const {
  const Fp8Config& c = store->config();
  const Fp8Format ff = c.forward_format(), gf = c.grad_format();
  const int64_t rows = dy2.dim(0), out = dy2.dim(1), in = w.dim(1);
  const Device dev = dy2.device();
  Tensor dq = codes(rows, out, dev), dq_si = scales(kRows, rows, out, dev), dq_t, dq_t_si;
  if (c.wgrad) {
    dq_t = codes(out, rows, dev);
    dq_t_si = scales(kRows, out, rows, dev);
  }
  Tensor w_t = codes(in, out, dev), w_t_si = scales(kBlocks, in, out, dev);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    ops::fp8_block_cast_rows(dy2, gf, dq, dq_si, c.wgrad ? &dq_t : nullptr, c.wgrad ? &dq_t_si : nullptr);
    Tensor none, none_si;
    ops::fp8_block_cast_tiles(w, ff, none, none_si, &w_t, &w_t_si);
  }
  Tensor dx = Tensor::empty({rows, in}, dy2.dtype(), dev);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    block_gemm({dq, dq_si, gf, kRows}, {w_t, w_t_si, ff, kBlocks}, nullptr, dx);
  }
  w_t = w_t_si = Tensor();
  if (!c.wgrad) {
    MT_CHECK(x.defined(), "{}: --no-fp8-wgrad needs the forward's input", state->name);
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    ops::linear_backward_weight(dy2, rows2d(x), dw, nullptr, accumulate_dw);
    return dx;
  }
  Tensor x_t = e.x_t, x_t_si = e.x_t_scale_inv;
  if (!x_t.defined()) {
    MT_CHECK(x.defined(), "{}: an FP8 backward with neither the input nor its codes", state->name);
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    x_t = codes(in, rows, dev);
    x_t_si = scales(kRows, in, rows, dev);
    Tensor none, none_si;
    ops::fp8_block_cast_rows(rows2d(x), ff, none, none_si, &x_t, &x_t_si);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  block_gemm({dq_t, dq_t_si, gf, kRows}, {x_t, x_t_si, ff, kRows}, accumulate_dw ? &dw : nullptr, dw);
  return dx;
}

}  // namespace mt::model
