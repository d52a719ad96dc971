// FP8-weight inference (model/fp8_inference.h): the weights quantised at load, and the forward of
// a frozen FP8 linear.
#include "model/fp8_inference.h"

#include <fmt/format.h>

#include <set>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/gpt_model.h"

namespace mt::model {

namespace {

constexpr Fp8Format kFormat = Fp8Format::E4M3;  // forward operands: E4M3 under both --fp8-format choices
constexpr int64_t kAlign = 16;                  // cuBLASLt's FP8 GEMMs: every dimension a multiple of 16

Tensor scalar(Device d) { return Tensor::zeros({1}, DType::F32, d); }
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The layer's linears that FP8 was attached to (GPTModel's attach_fp8 picks them).
std::vector<const Linear*> fp8_linears(const TransformerLayer& l) {
  std::vector<const Linear*> v = {&l.attn.qkv, &l.attn.proj};
  if (!l.is_moe) {
    v.insert(v.end(), {&l.mlp.fc1, &l.mlp.fc2});
  } else {
    for (auto* group : {&l.moe.experts.fc1, &l.moe.experts.fc2})
      for (const Linear& lin : *group) v.push_back(&lin);
    if (l.moe.has_shared) v.insert(v.end(), {&l.moe.shared.fc1, &l.moe.shared.fc2});
  }
  std::erase_if(v, [](const Linear* lin) { return !lin->fp8.on(); });
  return v;
}

// The current-scaling scale of x: fp8_max / amax, the amax reduced over TP (a sharded operand:
// one scale on every rank, as a single rank would use). Into s.amax and s.scale.
void current_scale(const Tensor& x, Fp8TensorState& s, const Fp8Linear& f) {
  ops::fp8_amax(x, s.amax);
  f.store->reduce_amax(s.amax, f.tp, *f.state);
  ops::fp8_current_scale(s.amax, s.scale, fp8_max(kFormat));
}

// Whether the weight runs through cuBLASLt's FP8 GEMM (codes kept) or the emulation.
bool real_gemm(const Tensor& w, const Fp8Store& store) {
  return (w.device() == Device::CUDA || store.real_gemms_on_cpu) && w.dim(0) % kAlign == 0 && w.dim(1) % kAlign == 0;
}

}  // namespace

std::string Fp8WeightMemory::describe() const {
  return fmt::format("FP8 weights (e4m3, per-tensor scales): {} linears, {:.1f}M parameters in FP8 ({:.1f}M as 1-byte "
                     "codes), {:.1f}M in the activation type; weight memory {:.1f} MiB",
                     linears, fp8_params / 1e6, code_params / 1e6, other_params / 1e6,
                     static_cast<double>(bytes) / (1 << 20));
}

namespace {

// ParamStore's buffers replaced through its accessors (see freeze_fp8_weights): the parameters
// `drop` names lose every copy, the others move into buffers of their own size; returns the
// elements kept.
int64_t keep_for_inference(ParamStore& ps, const std::set<const Param*>& drop) {
  const bool separate = ps.half() != Half::None;  // else the compute copy is the main value itself
  const Device d = ps.device();
  int64_t n_model = 0, n_main = 0;
  for (const Param& p : ps.params()) {
    if (drop.count(&p)) continue;
    n_model += p.numel();
    if (!separate || p.shape.size() == 1) n_main += p.numel();
  }
  Tensor model = Tensor::empty({n_model}, ps.model_buffer().dtype(), d);
  Tensor main = separate ? Tensor::empty({n_main}, DType::F32, d) : model;
  int64_t at = 0, at_main = 0;
  for (Param& p : ps.params()) {
    p.grad = Tensor();
    if (drop.count(&p)) {
      p.main = p.value = Tensor();
      continue;
    }
    Tensor v = model.flat_range(at, p.shape);
    ops::copy_into(v, p.value);
    if (!separate) {
      p.main = v;
    } else if (p.shape.size() == 1) {
      Tensor mv = main.flat_range(at_main, p.shape);
      ops::copy_into(mv, p.main);
      p.main = mv;
      at_main += p.numel();
    } else {
      p.main = Tensor();
    }
    p.value = v;
    p.offset = at;
    at += p.numel();
  }
  ps.model_buffer() = model;
  ps.main_buffer() = main;
  ps.grad_buffer() = Tensor();
  return n_model;
}

}  // namespace

Fp8WeightMemory freeze_fp8_weights(GPTModel& m) {
  MT_CHECK(m.fp8() && m.fp8()->config().recipe == Fp8Recipe::Tensorwise,
           "FP8 inference weights need a model built with --fp8-format and the tensorwise recipe");
  Fp8Store& store = *m.fp8();
  Fp8WeightMemory r;
  std::set<const Param*> frozen;
  for (const TransformerLayer& layer : m.layers())
    for (const Linear* lin : fp8_linears(layer)) {
      Fp8LinearState& st = *lin->fp8.state;
      const Tensor& w = lin->weight->value;
      current_scale(w, st.weight, lin->fp8);
      if (real_gemm(w, store)) {
        st.weight_codes = Tensor::empty({w.dim(0), w.dim(1)}, DType::U8, w.device());
        ops::fp8_cast_transpose(w, st.weight.scale, kFormat, st.weight_codes, nullptr, st.weight.amax,
                                st.weight.saturated);
        st.weight_scale = scalar(w.device());
        st.weight_scale_inv = scalar(w.device());
        ops::fp8_snapshot_scale(st.weight.scale, st.weight_scale, st.weight_scale_inv);
        r.code_params += w.numel();
        r.bytes += w.numel();
      } else {
        st.weight_q = ops::fp8_fake_quantize(w, st.weight.scale, kFormat, st.weight.saturated);
        r.bytes += w.numel() * static_cast<int64_t>(dtype_size(w.dtype()));
      }
      st.weight_epoch = kFp8FrozenEpoch;
      frozen.insert(lin->weight);
      ++r.linears;
      r.fp8_params += w.numel();
    }
  ParamStore& ps = m.params();
  r.other_params = keep_for_inference(ps, frozen);
  r.bytes += r.other_params * static_cast<int64_t>(dtype_size(ps.model_buffer().dtype()));
  if (ps.half() != Half::None) r.bytes += ps.main_buffer().numel() * 4;  // the vectors' fp32 main values
  return r;
}

Tensor fp8_inference_forward(const Fp8Linear& f, const Tensor& x, const Tensor* bias, const Tensor* residual,
                             PassContext& ctx) {
  MT_CHECK(fp8_frozen(f), "fp8_inference_forward of a linear whose weight was not quantised at load");
  Fp8LinearState* state = f.state;
  const Tensor x2 = x.view({x.numel() / x.dim(-1), x.dim(-1)});
  const int64_t rows = x2.dim(0), in = x2.dim(1);
  const Device dev = x.device();
  const bool real = state->weight_codes.defined();
  const int64_t out = real ? state->weight_codes.dim(0) : state->weight_q.dim(0);
  MT_CHECK(in == (real ? state->weight_codes.dim(1) : state->weight_q.dim(1)), "{}: FP8 inference input {}",
           state->name, x.shape_str());
  if (rows == 0) return Tensor::empty({0, out}, x.dtype(), dev);  // an expert that got no tokens
  Fp8TensorState& s = state->input;
  if (!real) {  // the emulation: x rounded through FP8 and read back, the dequantised weight, an fp32 GEMM
    Tensor xq;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
      current_scale(x2, s, f);
      xq = ops::fp8_fake_quantize(x2, s.scale, kFormat, s.saturated);
    }
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    return residual ? ops::linear_forward_residual(xq, state->weight_q, bias, *residual)
                    : ops::linear_forward(xq, state->weight_q, bias);
  }
  // cuBLASLt documents its FP8 GEMMs for 16-aligned dimensions (the training path runs them only
  // with every dimension a multiple of 16, Fp8Linear::real_gemms), which decode's 1..16 rows
  // seldom are: the codes are padded with zero rows (a zero code is 0.0), the GEMM runs on rows_p
  // rows, and the output's first `rows` rows are the answer (rows are independent). Every decode
  // batch of 1..16 then shares one GEMM shape (one heuristic query, one plan).
  const int64_t rows_p = round_up(rows, kAlign);
  Tensor q = rows_p == rows ? Tensor::empty({rows, in}, DType::U8, dev) : Tensor::zeros({rows_p, in}, DType::U8, dev);
  Tensor q_rows = rows_p == rows ? q : q.slice(0, rows);
  Tensor scale_used = scalar(dev), scale_inv = scalar(dev);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    current_scale(x2, s, f);
    ops::fp8_cast_transpose(x2, s.scale, kFormat, q_rows, nullptr, s.amax, s.saturated);
    ops::fp8_snapshot_scale(s.scale, scale_used, scale_inv);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  Tensor y;
  const Tensor* c = nullptr;  // what the GEMM's epilogue adds
  if (bias) {
    // cuBLASLt's FP8 bias epilogue is not used (layers.h): the bias broadcast to every row (an
    // embedding lookup of row 0) is the epilogue's addend, written over by the GEMM in place.
    y = ops::embedding_forward(Tensor::zeros({rows_p}, DType::I32, dev), bias->view({1, out}));
    c = &y;
  } else {
    y = Tensor::empty({rows_p, out}, x.dtype(), dev);
    if (residual && rows_p == rows) c = residual;
  }
  // Fast accumulation, as Transformer Engine's forward GEMMs.
  ops::fp8_gemm_into(q, kFormat, scale_inv, state->weight_codes, kFormat, state->weight_scale_inv, c, y, true);
  if (rows_p != rows) y = y.slice(0, rows);
  if (residual && c != residual) ops::add_inplace(y, *residual);
  return y;
}

}  // namespace mt::model
