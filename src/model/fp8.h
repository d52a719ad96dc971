#pragma once
// FP8 training state and the quantization of a linear layer's GEMM operands (model/fp8_config.h
// for the settings). Each FP8 linear has three operands (Transformer Engine's fprop input,
// weight, and the output gradient), each with its own scaling state held in f32 tensors on the
// model's device: the ops that read and update it (kernels/ops.def, FP8) run in the stream, so
// nothing waits for the host. The CPU emulates the FP8 GEMMs exactly: each operand is rounded to
// its FP8 format with the recipe's scale and read back, then the fp32 GEMM runs as before.
#include <cstdint>
#include <deque>
#include <string>

#include "core/tensor.h"
#include "model/context.h"
#include "model/fp8_config.h"
#include "model/tensor_parallel.h"

namespace mt::model {

// One operand's scaling state.
struct Fp8TensorState {
  Tensor history;    // f32 [amax_history_len]: delayed scaling's amaxes (slot 0 is the next one's)
  Tensor scale;      // f32 [1]: the scale the next quantization uses (delayed) / the last one used
  Tensor amax;       // f32 [1]: the last quantization's amax (reduced over TP)
  Tensor saturated;  // I64 [1]: elements clipped to the format's max since the log last read it
};

// What the real-GEMM path (model/fp8_gemms.cpp) keeps from a training forward for its backward.
struct Fp8Saved {
  Tensor scale, scale_inv;  // f32 [1]: the input's scale as the forward cast it, and its inverse
  Tensor x_t;               // U8 [in, rows]: the input's codes transposed (undefined: re-cast from x)
  Tensor x_t_scale_inv;     // blockwise: x_t's per-tile scale_invs (the per-tensor pair unused)
};

// The three operands of one linear layer, named after its parameters' prefix.
struct Fp8LinearState {
  std::string name;  // e.g. decoder.layers.0.self_attention.linear_qkv
  Fp8TensorState input, weight, grad;
  // The weight as the step's GEMMs read it: quantized once per optimizer step (the weight does
  // not change within one), as Transformer Engine caches its FP8 weight over micro-batches.
  Tensor weight_q;
  int64_t weight_epoch = -1;
  // The input scales of the forwards whose backwards are still to come (oldest first: schedules
  // run each layer's backwards in the order of its forwards), so that the weight gradient reads
  // the input exactly as the forward GEMM did, under any pipeline schedule and recomputation.
  std::deque<Tensor> pending_input_scales;
  // The real-GEMM path's weight codes [out, in] (E4M3) for the step and the scale they were cast
  // with (the delayed recipe moves the state's scale on right after), and its saved forwards.
  // Blockwise: weight_scale_inv holds the codes' 128x128 tiles' scale_invs (weight_scale unused).
  Tensor weight_codes, weight_scale, weight_scale_inv;
  std::deque<Fp8Saved> saved;
  // Whether its amaxes join the store's amax group: not the MoE experts', whose casts a rank
  // skips when its expert gets no tokens (a collective there would wait forever).
  bool group_amax = true;
  // Where casts with an already-used scale put the amax and clipped count nobody reads (made once:
  // no allocation or zeroing per cast).
  Tensor recast_amax, recast_saturated;
};

class Fp8Store {
 public:
  explicit Fp8Store(const Fp8Config& c) : cfg_(c) {}
  Fp8Store(const Fp8Store&) = delete;
  Fp8Store& operator=(const Fp8Store&) = delete;
  const Fp8Config& config() const { return cfg_; }
  // A linear's state (stable address), its tensors on the CPU until to_device.
  Fp8LinearState& add(const std::string& name);
  void to_device(Device d);
  // The weights changed (an optimizer step): the next training forward quantizes them again.
  void weights_changed() { ++epoch_; }
  int64_t epoch() const { return epoch_; }
  std::deque<Fp8LinearState>& linears() { return linears_; }
  // Delayed scaling's amax reduction group beyond TP (Transformer Engine's fp8_group: Megatron
  // passes data x context parallel): every rank then keeps the same histories and scales, as one
  // rank that saw all the micro-batches' maxima at once. Null or one rank: none.
  void set_amax_group(comm::CommPtr g) { amax_group_ = std::move(g); }
  // amax [1] max-reduced over `tp` (sharded operands: one scale for all TP ranks) and, under the
  // delayed recipe, over the amax group when `l` joins it.
  void reduce_amax(Tensor& amax, const TensorParallel* tp, const Fp8LinearState& l) const;
  // Tests: run the real-GEMM path for CPU tensors too (its ops have CPU references), so that it
  // can be checked against the emulation without a GPU.
  bool real_gemms_on_cpu = false;
  // Tests: the emulation for CUDA tensors too (the real path's reference on the same device).
  bool real_gemms_off = false;

 private:
  Fp8Config cfg_;
  comm::CommPtr amax_group_;
  std::deque<Fp8LinearState> linears_;
  int64_t epoch_ = 0;
};

// What one FP8 linear needs at run time: its state, the store's settings, and the TP group over
// which sharded operands' amaxes are reduced (so every rank uses one scale, as TE's amax
// reduction group; null: nothing to reduce).
struct Fp8Linear {
  Fp8LinearState* state = nullptr;
  const Fp8Store* store = nullptr;
  const TensorParallel* tp = nullptr;
  bool on() const { return state != nullptr; }
  // The operands of y = x w^T (x [rows, in], w [out, in]) as the forward GEMM reads them.
  Tensor forward_input(const Tensor& x, const PassContext& ctx) const;
  Tensor forward_weight(const Tensor& w, const PassContext& ctx) const;
  // Backward: the operands of dx = dy w (dy_dgrad, with forward_weight's w) and dw = dy^T x
  // (dy_wgrad, x_wgrad: in FP8 unless --no-fp8-wgrad, then dy and x as they are). x is the
  // forward's input; the per-tensor recipes read it back as that forward quantized it.
  struct Backward {
    Tensor dy_dgrad, dy_wgrad, x_wgrad;
  };
  Backward backward_operands(const Tensor& dy, const Tensor& x) const;

  // The GPU path (model/fp8_gemms.cpp): real FP8 GEMMs through cuBLASLt, fp32 accumulation,
  // outputs in the activation type. Used for x on the GPU under the per-tensor recipes, with every
  // GEMM dimension (rows, in, out) a multiple of 16 (cuBLASLt's FP8 rule); under blockwise scaling
  // (model/fp8_block_gemms.cpp) with every dimension a multiple of 128 and the three GEMMs offered
  // by this cuBLASLt (else the emulation, with a warning once per shape).
  bool real_gemms(const Tensor& x, const Tensor& w) const;
  // y = x w^T (+ residual, in the GEMM's epilogue). x is cast once, row-major for this GEMM and,
  // with keep_x_t, transposed for the weight gradient (kept instead of the caller's x).
  Tensor gemm_forward(const Tensor& x, const Tensor& w, const Tensor* residual, bool keep_x_t,
                      PassContext& ctx) const;
  // Whether the oldest forward whose backward is due ran gemm_forward.
  bool backward_is_real() const { return state && !state->saved.empty(); }
  // dx = dy w and dw (+)= dy^T x (fp32, accumulate_dw: beta 1). x: the forward's input, read only
  // where the forward kept no transposed codes (or with --no-fp8-wgrad).
  Tensor gemm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, bool accumulate_dw,
                       PassContext& ctx) const;

 private:
  // The weight's codes for this pass (cached per optimizer step in training) and their scales.
  void weight_codes(const Tensor& w, const PassContext& ctx, Tensor& codes, Tensor& scale, Tensor& scale_inv) const;
  // The blockwise recipe's real-GEMM path (model/fp8_block_gemms.cpp).
  bool block_real_gemms(const Tensor& x, const Tensor& w) const;
  Tensor block_gemm_forward(const Tensor& x, const Tensor& w, const Tensor* residual, bool keep_x_t,
                            PassContext& ctx) const;
  // e: the forward's saved entry (taken off the queue by gemm_backward), dy2: dy as [rows, out].
  Tensor block_gemm_backward(const Fp8Saved& e, const Tensor& dy2, const Tensor& x, const Tensor& w, Tensor& dw,
                             bool accumulate_dw, PassContext& ctx) const;
};

// FP8's health over a log interval: the elements clipped to the formats' max (scales too large:
// a saturating recipe) and the range of the per-tensor scales (a huge one: FP8's range wasted on
// tiny values). Reading waits for the device; the counters restart at zero.
struct Fp8Health {
  int64_t saturated = 0;
  float min_scale = 0, max_scale = 0;
  bool has_scales = false;  // per-tensor recipes (blockwise scales are per tile and not kept)
};
Fp8Health take_fp8_health(Fp8Store& store);

// A new FP8 linear for the layer whose weight is `weight_name` (its state named without the
// ".weight"), its amaxes reduced over `tp` (null: not reduced).
Fp8Linear make_fp8_linear(Fp8Store& store, const std::string& weight_name, const TensorParallel* tp);

}  // namespace mt::model
