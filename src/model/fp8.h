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
  // --fp8-param-gather (parallel/fp8_param_gather.h): weight_codes, weight_scale and
  // weight_scale_inv are the distributed optimizer's all-gathered cast of the fp32 main weight,
  // used by every pass (training or not) instead of a cast of the model's copy; weight_q is read
  // back from them on first use after each gather.
  bool param_gathered = false;
  // Delayed scaling there: the gathered cast's amax (weight.amax) joins the history right before
  // the next cast rather than after this one, so that a checkpoint holds the scale this cast used.
  bool weight_roll_pending = false;
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
  // Whether the real-GEMM path will cast an operand of `rows` rows on device `d` under current
  // scaling with a fresh amax, which the operand's producer can then compute in its own pass
  // (fp8_producer_amax): the forward's input (not in a recomputation, which reuses the first
  // run's scale), or with `grad` the output gradient of the backward that is due.
  bool takes_producer_amax(int64_t rows, Device d, const Tensor& w, const PassContext& ctx, bool grad) const;
  // Delayed scaling's producer fusion: the operand's producer writes its FP8 codes itself (the
  // scale comes from the amax history, known before the tensor exists), joining its amax and
  // clipped count into the state, and the operand is never stored in the activation type.
  struct ProducerCast {
    Tensor scale, amax, saturated;  // the state's: the producer reads, max-joins (zeroed), adds to
    Fp8Format format = Fp8Format::E4M3;
    DType dtype = DType::BF16;      // the activation type (of the GEMMs' outputs)
    Tensor q, qt;                   // U8 [rows, cols] and, where a GEMM reads it, [cols, rows]
    // Current scaling (MT_FP8_SWIGLU_GRAD_CODES): the scale is not known yet. The producer first
    // writes the operand's amax into `amax` in a pass that stores nothing, then
    // producer_current_scale sets the scale from it, then the producer writes the codes.
    bool current = false;
  };
  // Whether the producer casts: the forward's input (a first training forward that keeps the
  // transposed codes: nothing else reads the tensor), or with `grad` the due backward's output
  // gradient (with FP8 wgrad). Delayed scaling; current scaling the gradient only, with
  // MT_FP8_SWIGLU_GRAD_CODES (its producer then takes two passes: amax, codes).
  bool producer_casts(int64_t rows, Device d, const Tensor& w, const PassContext& ctx, bool grad) const;
  // Where the producer writes, and with which scale: an operand [rows, cols].
  ProducerCast producer_cast(int64_t rows, int64_t cols, DType dtype, bool grad) const;
  // pc.current: the scale from the amax its producer found (reduced over TP), and pc.amax moved to
  // a scratch tensor for the codes' pass (the state's amax is final).
  void producer_current_scale(ProducerCast& pc, bool grad) const;
  // y = x w^T (+ residual, in the GEMM's epilogue). x is cast once, row-major for this GEMM and,
  // with keep_x_t, transposed for the weight gradient (kept instead of the caller's x). x_amax:
  // max |x| from x's producer (takes_producer_amax), consumed; else the cast finds it itself.
  // pc: x's codes as its producer wrote them (producer_cast; x is then not read).
  Tensor gemm_forward(const Tensor& x, const Tensor& w, const Tensor* residual, bool keep_x_t, PassContext& ctx,
                      const Tensor* x_amax = nullptr, const ProducerCast* pc = nullptr) const;
  // Whether the oldest forward whose backward is due ran gemm_forward.
  bool backward_is_real() const { return state && !state->saved.empty(); }
  // dx = dy w and dw (+)= dy^T x (fp32, accumulate_dw: beta 1). x: the forward's input, read only
  // where the forward kept no transposed codes (or with --no-fp8-wgrad).
  // dy_amax, pc: dy's amax or codes from its producer, as gemm_forward's.
  // defer_wgrad (defers_wgrad): dw's GEMM is left running (ops::fp8_gemm_into_deferred); the
  // caller hands dw's parameter to ctx.deferred_grads, whose join reports it ready.
  Tensor gemm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, bool accumulate_dw,
                       PassContext& ctx, const Tensor* dy_amax = nullptr, const ProducerCast* pc = nullptr,
                       bool defer_wgrad = false) const;
  // Whether gemm_backward may defer the weight gradient of a dw on device d (MT_FP8_WGRAD_OVERLAP,
  // the GPU, FP8 wgrad, a per-tensor recipe).
  bool defers_wgrad(Device d) const;

 private:
  // --fp8-param-gather: the gathered codes read back (weight_q, made once per gather).
  Tensor gathered_weight(const Tensor& w) const;
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

// The FP8 producer fusion: the kernels that produce an FP8 linear's operand (RMSNorm for
// linear_qkv's and linear_fc1's inputs, SwiGLU for linear_fc2's, SwiGLU's backward for
// linear_fc1's output gradient) do the cast's work in their own pass.
// - Delayed scaling knows the scale before the tensor exists (from the amax history): SwiGLU and
//   its backward write the FP8 codes, row-major and transposed, and the amax and clipped count,
//   and the tensor is never stored in bf16 (Fp8Linear::producer_cast). RMSNorm does not: its
//   one-warp-per-row kernel has no tile of rows to transpose.
// - Current (tensorwise) scaling needs the amax of the whole tensor before its first code, which
//   cost a pass of its own over the bf16 tensor: the producers compute it in the pass that writes
//   the tensor (a max per warp, one atomicMax on a device float) and the cast reads the tensor
//   once (Fp8Linear::takes_producer_amax). Why not the codes too: the scale depends on every
//   element, known only when the whole grid is done; the codes would have to wait on chip for a
//   grid-wide barrier (a cooperative launch holding the whole tensor in registers and shared
//   memory: not for tensors of hundreds of MB), so the second read stays.
// The codes, amaxes and scales are the unfused path's bit for bit. On by default; MT_FP8_UNFUSED=1
// in the environment or set_fp8_producer_amax(false) (tests) runs every cast unfused.
bool fp8_producer_amax();
void set_fp8_producer_amax(bool on);
// The casts that took their amax or their codes from a producer, since the process started (tests).
int64_t fp8_producer_fusions();

// Changes to the GPU path's casts (issue #18), each giving the default path's bits. Read from the
// environment once; tests set them with set_fp8_switches. Measured on an H200 (session 16, 8
// iterations of llama-1.5b tensorwise: bench/gpu_fp8_bench.sh MT_FP8_OPTIN=1 A/Bs each):
//   MT_FP8_FUSED_SCALE (on; "0" turns it off, +0.4%): under current scaling the cast kernel
//     computes the scale from the amax and writes the scale, its copy and inverse itself: one
//     launch per cast, not three (fp8_current_scale and fp8_snapshot_scale were one-thread kernels
//     around every cast).
//   MT_FP8_WT_FROM_CODES (on; "0" turns it off, +0.4%): the data gradient's transposed weight is
//     the transpose of the step's cached weight codes (1 byte read per element), not a re-cast of
//     the bf16 weight (2 bytes).
//   MT_FP8_SWIGLU_GRAD_CODES (off; "1" turns it on, -1.5%: its amax-only pass costs more than the
//     bf16 round trip it saves): under current scaling SwiGLU's backward takes the amax of
//     linear_fc1's output gradient in a pass that stores nothing, then writes its FP8 codes (and
//     transpose) itself from dy and h, as under delayed scaling.
//   MT_FP8_WGRAD_OVERLAP (off; "1" turns it on; not measured yet): on the GPU, the per-tensor
//     recipes' weight-gradient GEMMs run on the deferred side streams (ops::fp8_gemm_into_deferred),
//     joined when the chunk's backward pass ends (join_deferred_expert_grads, which then reports
//     those gradients ready): compute-bound GEMMs beside the memory-bound casts, norms and
//     activations of the layers after them. Their operands (dy^T and x^T codes) stay allocated
//     until the join. Whether Hopper's cuBLASLt kernels leave room to overlap is for the GPU to say.
struct Fp8Switches {
  bool fused_scale = false, wt_from_codes = false, swiglu_grad_codes = false;  // {}: every switch off
  bool wgrad_overlap = false;
};
Fp8Switches fp8_switches();
void set_fp8_switches(const Fp8Switches& s);

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
