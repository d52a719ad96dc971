// FP8's bytes per transformer layer for `megatron estimate` (training/estimate_fp8.h). Each rule
// below follows a code path of the FP8 linear; the comments name the path.
#include "training/estimate_fp8.h"

#include <algorithm>
#include <vector>

#include "kernels/fp8_blocks.h"
#include "training/estimate_dims.h"

namespace mt::estimate {
namespace {

using model::Fp8Recipe;

// One FP8 linear of the layer on this rank: weight [out, in], its GEMMs of `rows` rows.
struct Gemm {
  int64_t in = 0, out = 0, rows = 0;
  int64_t count = 1;          // identical linears (a rank's routed experts)
  bool bias = false;          // cuBLASLt's FP8 epilogues are not used: a biased linear runs emulated
  bool expert = false;        // routed experts always run emulated (moe/experts.cpp) and are never param-gathered
  bool gathered_input = false;  // column-parallel under SP: backward gathers the input again, keeps no codes
  bool caller_keeps_input = false;  // linear_proj: attention saves the core's output anyway
  double dropped = 0;         // what the caller stops saving when the linear keeps its input's codes
  bool grad_codes = false;    // SwiGLU's fc1: under delayed scaling its backward writes the codes, no bf16 dh
};

// A rank's share of one MLP's two linears (dense, or an MoE layer's shared expert) of width f.
// `input_elsewhere`: the MLP's input stays saved by someone else (the MoE router), so fc1's codes
// replace nothing. `nothing_saved`: the MLP's Saved is dropped anyway (--recompute-modules moe).
void add_mlp(std::vector<Gemm>& g, const Arguments& a, const Dims& d, int64_t rows, int64_t f, bool input_elsewhere,
             bool nothing_saved) {
  const auto& c = a.model;
  const int64_t tp = a.tensor_model_parallel_size, h = c.hidden_size;
  const bool sp = tp > 1 && a.sequence_parallel;
  const double e = d.e;
  Gemm fc1{.in = h, .out = (c.swiglu ? 2 : 1) * f / tp, .rows = rows, .bias = c.add_bias_linear};
  fc1.gathered_input = sp;
  fc1.dropped = input_elsewhere || nothing_saved ? 0.0 : static_cast<double>(rows) * static_cast<double>(h) * e;
  fc1.grad_codes = c.swiglu;
  Gemm fc2{.in = f / tp, .out = h, .rows = rows, .bias = c.add_bias_linear};
  fc2.dropped = nothing_saved ? 0.0 : static_cast<double>(rows) * static_cast<double>(f / tp) * e;
  g.push_back(fc1);
  g.push_back(fc2);
}

// The layer's FP8 linears (model/gpt_model.cpp, attach_fp8): QKV, projection, and fc1/fc2 or the
// MoE layer's experts and shared expert. Router, norms, attention, embedding and head stay bf16.
std::vector<Gemm> layer_gemms(const Arguments& a, const Dims& d, int64_t layer) {
  const auto& c = a.model;
  const int64_t tp = a.tensor_model_parallel_size, h = c.hidden_size;
  const int64_t rows = a.micro_batch_size * c.seq_length / a.context_parallel_size;
  const bool sp = tp > 1 && a.sequence_parallel;
  std::vector<Gemm> g;
  Gemm qkv{.in = h, .out = c.qkv_out() / tp, .rows = rows, .bias = c.add_qkv_bias};
  qkv.gathered_input = sp;
  qkv.dropped = static_cast<double>(rows) * static_cast<double>(h) * d.e;  // linear_qkv's normed input
  g.push_back(qkv);
  Gemm proj{.in = c.num_attention_heads * c.kv_channels / tp, .out = h, .rows = rows, .bias = c.add_bias_linear};
  proj.caller_keeps_input = true;
  g.push_back(proj);
  if (!c.moe.is_moe_layer(layer)) {
    add_mlp(g, a, d, rows, c.ffn_hidden_size, false, false);
    return g;
  }
  const auto& m = c.moe;
  // --recompute-modules moe drops the layer's Saved (the shared expert's included) but its FP8
  // linears still keep their first forward's codes until the backward's re-run replaces them.
  if (m.shared_expert_intermediate_size > 0)
    add_mlp(g, a, d, rows, m.shared_expert_intermediate_size, true, c.recomputes("moe"));
  const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
  const int64_t local = m.num_experts / a.expert_model_parallel_size;
  // Routed rows per local expert on average (the dispatch's rows over the rank's experts); used
  // for the emulation's transient read-back copies only.
  const double routed = d.tsp * static_cast<double>(m.topk) * d.etp;
  const int64_t expert_rows = static_cast<int64_t>(routed / static_cast<double>(local));
  const int64_t f = m.moe_ffn_hidden_size / etp;
  g.push_back({.in = h, .out = (c.swiglu ? 2 : 1) * f, .rows = expert_rows, .count = local, .bias = c.add_bias_linear,
               .expert = true});
  g.push_back({.in = f, .out = h, .rows = expert_rows, .count = local, .bias = c.add_bias_linear, .expert = true});
  return g;
}

bool multiple(int64_t v, int64_t m) { return v > 0 && v % m == 0; }

// Fp8Linear::real_gemms: cuBLASLt's FP8 GEMMs need every dimension a multiple of 16 (per-tensor
// recipes) or of the 128-wide tiles (blockwise; assumed offered by this cuBLASLt, as on Hopper
// with CUDA 12.9+), no bias, and a device that runs them.
bool real(const Gemm& g, const model::Fp8Config& c, bool real_gemms) {
  if (!real_gemms || g.expert || g.bias) return false;
  const int64_t m = c.recipe == Fp8Recipe::Blockwise ? fp8::kBlockTile : 16;
  return multiple(g.rows, m) && multiple(g.in, m) && multiple(g.out, m);
}

double f32s(Fp8Tiles t, int64_t outer, int64_t k) { return 4.0 * static_cast<double>(fp8::tile_scales(t, outer, k)); }

// Bytes of an [outer, k] operand's codes in the recipe's layout (blockwise: with its tiles' scales).
double codes(const model::Fp8Config& c, Fp8Tiles t, int64_t outer, int64_t k) {
  const double b = static_cast<double>(outer) * static_cast<double>(k);
  return c.recipe == Fp8Recipe::Blockwise ? b + f32s(t, outer, k) : b;
}

}  // namespace

Fp8LayerBytes fp8_layer_bytes(const Arguments& a, int64_t layer, bool gpu, bool recomputed, bool real_gemms) {
  Fp8LayerBytes r;
  const model::Fp8Config& c = a.model.fp8;
  if (!c.layer_in_fp8(layer, a.model.num_layers)) return r;
  const Dims d = dims_of(a, gpu);
  const bool per_tensor = c.recipe != Fp8Recipe::Blockwise;
  constexpr auto kRows = Fp8Tiles::Rows1x128, kBlocks = Fp8Tiles::Blocks128x128;
  for (const Gemm& g : layer_gemms(a, d, layer)) {
    const double n = static_cast<double>(g.count), rows = static_cast<double>(g.rows);
    const double in = static_cast<double>(g.in), out = static_cast<double>(g.out);
    const bool is_real = real(g, c, real_gemms);
    const bool gathered = c.param_gather && !g.expert;  // parallel/fp8_param_gather.h
    // Fp8Store::add: input, weight and gradient states, each a history, scale, amax (f32) and an
    // I64 clipped count, whatever the recipe.
    double state = 3.0 * (4.0 * static_cast<double>(c.amax_history_len) + 4 + 4 + 8);
    if (gathered) state += 4;  // the bucket's per-weight amax (Fp8Bucket::amaxes)
    // Per-tensor codes carry their scale and inverse (weight_scale, weight_scale_inv).
    if ((is_real && per_tensor) || gathered) state += 8;
    const bool keeps = is_real && c.wgrad && !g.gathered_input && !g.caller_keeps_input;
    if (is_real) {
      // weight_codes (fp8_gemms.cpp) / weight_tiles (fp8_block_gemms.cpp): cached per step.
      r.weight_codes += n * codes(c, kBlocks, g.out, g.in);
      // recast()'s scratch amax and clipped count (12 bytes), made where an input is cast again:
      // a backward that kept no codes, or a full recomputation's rebuild.
      if (per_tensor && c.wgrad && (!keeps || recomputed)) state += 12;
    } else {
      // forward_weight: the quantized weight read back in the weight's type, cached per step;
      // under --fp8-param-gather also the gathered codes it is read back from.
      r.emulated_weights += n * in * out * d.e;
      if (gathered) r.weight_codes += n * in * out;
    }
    r.state += n * state;
    // The forward's saved entry: per-tensor real GEMMs keep {scale, scale_inv}, the emulation
    // the pending input scale; blockwise keeps its scales with the codes.
    if (per_tensor) r.pass_scales += n * (is_real ? 8.0 : 4.0);
    if (keeps) {
      r.input_codes += n * codes(c, kRows, g.in, g.rows);
      r.inputs_dropped += n * g.dropped;
    }
    // The backward's transients beyond bf16's (its dx and the caller's tensors exist either way).
    double extra = 0;
    if (is_real) {
      // gemm_backward: dy's codes, their transpose (for FP8 wgrad), then w^T's codes until the
      // data gradient is done, after which x^T is re-cast where no codes were kept.
      const double dq = codes(c, kRows, g.rows, g.out), dq_t = c.wgrad ? codes(c, kRows, g.out, g.rows) : 0.0;
      const double w_t = codes(c, kBlocks, g.in, g.out);
      const double x_t = c.wgrad && !keeps ? codes(c, kRows, g.in, g.rows) : 0.0;
      extra = dq + dq_t + std::max(w_t, x_t);
      // Delayed scaling: SwiGLU's backward writes dh's codes itself (MLP::backward, wants_grad_codes)
      // and dh is never stored in the activation type.
      if (g.grad_codes && c.recipe == Fp8Recipe::Delayed && c.wgrad) extra -= rows * out * d.e;
    } else {
      // backward_operands: dy (twice under blockwise, once per tiling) and x read back for the GEMMs.
      const double dy = rows * out * d.e * (c.wgrad && !per_tensor ? 2.0 : 1.0);
      extra = dy + (c.wgrad ? rows * in * d.e : 0.0);
    }
    r.backward = std::max(r.backward, extra);
  }
  return r;
}

double fp8_gemm_workspace(const Arguments& a, bool gpu) {
  return gpu && a.model.fp8.enabled ? 32.0 * (1 << 20) : 0.0;
}

}  // namespace mt::estimate
