#pragma once
// Basic layers: Linear, Norm (LayerNorm/RMSNorm), Dropout. Activations are [rows, features]
// fp32 tensors with rows = seq * batch (Megatron's [s, b, h] order flattened).
#include <string>

#include "core/tensor.h"
#include "model/config.h"
#include "model/context.h"
#include "model/fp8.h"
#include "model/params.h"
#include "model/tensor_parallel.h"
#include "model/tp_regions.h"

namespace mt::model {

// None: a plain linear layer. Column: the output features are split over TP ranks (weight
// rows; `blocks` > 1 splits each of that many stacked blocks, as fc1's [gate; up]); the input
// enters the TP region (TPMapping::ColumnInput). Row: the input features are split (weight
// columns); the partial outputs leave the region summed over TP (TPMapping::RowOutput) and the
// bias, replicated, is added once.
enum class ParallelMode { None, Column, Row };

struct Linear {
  Param* weight = nullptr;  // [out, in] (this rank's shard under TP)
  Param* bias = nullptr;    // [out] or null
  int64_t in = 0, out = 0;  // full sizes
  ParallelMode mode = ParallelMode::None;
  const TensorParallel* tp = nullptr;
  void build(ParamStore& ps, const std::string& prefix, int64_t in, int64_t out, bool bias, Init init,
             ParallelMode mode = ParallelMode::None, const TensorParallel* tp = nullptr, int blocks = 1);
  // y = x w^T (+ b). x saved by caller. With a residual (shaped as y; only where
  // fuses_residual): y = x w^T + residual in one GEMM.
  // x_amax: max |x| (f32 [1]) from x's producer, where wants_input_amax said so (consumed).
  Tensor forward(const Tensor& x, PassContext& ctx, const Tensor* residual = nullptr,
                 const Tensor* x_amax = nullptr) const;
  // Whether forward can add a residual inside the GEMM (cuBLASLt's epilogue, no add kernel):
  // without TP, where the GEMM's output is the final value (a row-parallel GEMM gives partial
  // sums), and without a bias (with the bias epilogue too, bf16 outputs measured more than one
  // ulp from the fp32 sum on an H100: not the single rounding the fusion is for).
  bool fuses_residual() const { return mode == ParallelMode::None && bias == nullptr; }
  // Returns dx. dy_amax: max |dy| from dy's producer, where wants_grad_amax said so (consumed).
  Tensor backward(const Tensor& dy, const Tensor& x, PassContext& ctx, const Tensor* dy_amax = nullptr) const;
  // The FP8 producer fusion (model/fp8.h, fp8_producer_amax): whether forward's FP8 cast of an
  // input of `rows` rows on `d` (backward's of the output gradient that is due) takes its amax
  // from the tensor's producer. Not where the tensor is gathered over TP first (sequence
  // parallelism): the producer sees a shard.
  bool wants_input_amax(int64_t rows, Device d, const PassContext& ctx) const;
  bool wants_grad_amax(const PassContext& ctx) const;
  // Delayed scaling's: whether the producer of forward's input (backward's output gradient)
  // writes its FP8 codes (Fp8Linear::producer_cast), which forward_codes (backward_codes) then
  // take in place of the tensor. Where forward would keep the input as codes anyway.
  bool wants_input_codes(int64_t rows, Device d, const PassContext& ctx) const;
  bool wants_grad_codes(const PassContext& ctx) const;
  Tensor forward_codes(const Fp8Linear::ProducerCast& pc, PassContext& ctx, const Tensor* residual = nullptr) const;
  Tensor backward_codes(const Fp8Linear::ProducerCast& pc, const Tensor& x, PassContext& ctx) const;
  // Whether forward(x, ctx) keeps what backward needs of x itself (the GPU FP8 path's transposed
  // codes, half a bf16 copy): the caller then saves no x and passes an undefined one to backward.
  bool keeps_input(const Tensor& x, const PassContext& ctx) const;
  // Whether grad_ready hooks fire for the weight (off for the output layer when it shares the
  // word embedding, whose gradient is complete only after the embedding's backward).
  bool report_weight_grad = true;
  // The caller keeps the input for its own backward anyway (linear_proj's, the attention core's
  // output): the GPU FP8 path re-casts it then rather than keep FP8 codes of it too.
  bool input_kept_by_caller = false;
  // FP8 GEMMs (model/fp8.h): set for the transformer layers' linears when --fp8-format is on.
  Fp8Linear fp8{};

 private:
  // The input's way into the GEMM and the output's way out, from the mode (also for a Linear
  // made without build, as GPTModel's output layer): identity both, unless column (input) or
  // row (output) parallel.
  TPRegion input_region() const { return {mode == ParallelMode::Column ? TPMapping::ColumnInput : TPMapping::None, tp}; }
  TPRegion output_region() const { return {mode == ParallelMode::Row ? TPMapping::RowOutput : TPMapping::None, tp}; }
  // Column-parallel under SP with TensorParallel::overlap_comm (--tp-comm-overlap).
  // Not with FP8: a per-tensor scale needs the whole gathered input before the first GEMM.
  bool overlaps_comm() const { return mode == ParallelMode::Column && tp->sp() && tp->overlap_comm && !fp8.on(); }
  Tensor forward_column_overlapped(const Tensor& x, PassContext& ctx) const;
  Tensor backward_column_overlapped(const Tensor& dy, const Tensor& x, PassContext& ctx) const;
  Tensor backward_fp8(const Tensor& dyf, const Tensor& xf, PassContext& ctx) const;
  // The GPU FP8 path: no bias (cuBLASLt's FP8 epilogues are not used), real FP8 GEMMs possible.
  bool fp8_gemms(const Tensor& x) const { return bias == nullptr && fp8.real_gemms(x, weight->value); }
  // The gradient hooks of the weight and bias, then dx. wgrad_deferred: the weight gradient's GEMM
  // is still running (Fp8Linear::defers_wgrad): the weight goes to ctx.deferred_grads instead.
  Tensor finish_backward(const Tensor& dx, PassContext& ctx, bool wgrad_deferred = false) const;
  // Whether the real FP8 backward defers the weight gradient (only where its hook is this layer's).
  bool defers_wgrad() const { return report_weight_grad && fp8.defers_wgrad(weight->grad.device()); }
  // The bias forward adds: a row-parallel layer's joins the sum once, from TP rank 0.
  const Tensor* forward_bias() const;
};

struct Norm {
  Param* weight = nullptr;
  Param* bias = nullptr;  // LayerNorm only
  bool rms = false;
  float eps = 1e-5f;
  // --apply-layernorm-1p: `weight` holds w - 1 (zero at init) and the kernels scale by 1 + w.
  bool one_plus = false;
  Half half = Half::None;  // the compute copy's type: the scale is rounded to it, as a weight is
  struct Saved {
    Tensor x, mean, rstd;
    Tensor scale;  // what forward scaled by (1 + w under one_plus), for backward
  };
  // Under sequence parallelism the norm sees a sequence shard: its parameters are marked so
  // their partial gradients are summed over TP.
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& cfg,
             const TensorParallel* tp = nullptr);
  // amax (f32 [1], optional): set to max |y| as stored, for the FP8 cast of the linear that reads
  // y (Linear::wants_input_amax); RMSNorm finds it in its own pass, LayerNorm in a pass after.
  Tensor forward(const Tensor& x, Saved& s, PassContext& ctx, Tensor* amax = nullptr) const;
  // The residual add before the norm, fused with it: sum = x + residual, stored at activation
  // precision `half` (the residual stream the caller keeps), returns norm(sum).
  Tensor forward_residual(const Tensor& x, const Tensor& residual, Tensor& sum, Half half, Saved& s, PassContext& ctx,
                          Tensor* amax = nullptr) const;
  // dx (+ dx_add, the residual branch's gradient, in the same pass on the GPU).
  Tensor backward(const Tensor& dy, Saved& s, PassContext& ctx, const Tensor* dx_add = nullptr) const;
  // The scale the kernels multiply by: the weight's compute copy, or under one_plus 1 + w formed
  // in fp32 from the main weight and then rounded once to the compute type (the kernels read
  // the scale in the activations' type). d(1 + w)/dw = 1, so the kernels' dw is w's gradient.
  Tensor scale() const;
  mutable Tensor ones_;  // one_plus: a [hidden] tensor of ones on the weight's device (made on first use)
};

// Dropout whose mask is a pure function of (seed, offset): nothing is stored but the offset.
struct Dropout {
  float p = 0.f;
  bool tp_region = false;  // draws from the model-parallel stream (PassContext::tp_rng)
  struct Saved {
    uint64_t seed = 0, offset = 0;
    bool active = false;
  };
  Tensor forward(const Tensor& x, Saved& s, PassContext& ctx) const;  // may return x itself
  Tensor backward(const Tensor& dy, const Saved& s, OpTimes* times = nullptr) const;
};

// Whether t's storage is emulated: a CPU tensor of a half-precision model (fp32 values rounded
// to the half type by round_to_half_inplace); GPU tensors are stored in the half type itself.
bool emulates_half(const Tensor& t, Half h);

// Rounds activations in place to the half precision the model runs in (none: unchanged).
void round_to_half_inplace(Tensor& t, Half h);

}  // namespace mt::model
