#pragma once
// FP8 weights for inference (`megatron generate` / `serve` --fp8-format): the transformer layers'
// linears (QKV, projection, fc1, fc2, MoE experts: those FP8 training covers) hold their weight
// as E4M3 codes, quantised once at load with a per-tensor scale from the weight's own amax; each
// call quantises its input with the input's amax (current scaling) and runs the FP8 GEMM. The
// embedding, the norms and the output layer stay in the activation type, as in Transformer
// Engine's inference.
//
// Per-tensor, not per-output-row, weight scales: cuBLASLt's Hopper FP8 GEMMs take one scalar
// scale per operand (A/B_SCALE_POINTER), and a per-row scale would need an epilogue of our own
// after the GEMM; E4M3's range covers a weight matrix's spread at one scale.
//
// On the GPU the codes (1 byte a weight) feed cuBLASLt; where a weight's dimensions are not
// multiples of 16 (cuBLASLt's FP8 rule) and on the CPU, the emulation runs instead: the weight
// kept as its dequantised values, the input rounded through FP8 and read back, then the ordinary
// GEMM (model/fp8.h) - the same arithmetic, testable without a GPU.
#include <cstdint>
#include <string>

#include "model/context.h"
#include "model/fp8.h"

namespace mt::model {

class GPTModel;

// A linear whose weight was quantised at load is marked by this weight_epoch (training's epochs
// count up from 0; -1 is "never cast"). Its forward then reads only the quantised weight:
// weight_codes + weight_scale_inv for cuBLASLt's FP8 GEMM, else weight_q (the dequantised values)
// for the emulation; the Param's own copies are gone. Fp8Store::to_device clears it.
inline constexpr int64_t kFp8FrozenEpoch = -2;
inline bool fp8_frozen(const Fp8Linear& f) { return f.state && f.state->weight_epoch == kFp8FrozenEpoch; }

// y = x w^T (+ bias) (+ residual) for a frozen FP8 linear, x quantised per call with its own amax
// (current scaling). Linear::forward takes this path for every row count.
Tensor fp8_inference_forward(const Fp8Linear& f, const Tensor& x, const Tensor* bias, const Tensor* residual,
                             PassContext& ctx);

struct Fp8WeightMemory {
  int64_t linears = 0;      // linears quantised
  int64_t fp8_params = 0;   // their weights' elements
  int64_t code_params = 0;  // of those, held as 1-byte codes (the rest emulated: dequantised values)
  int64_t other_params = 0; // everything else (embedding, norms, output layer, biases)
  int64_t bytes = 0;        // the weights' bytes as the forward reads them
  std::string describe() const;  // one line for the startup log
};

// Quantises the linears FP8 was attached to (a model built with fp8.enabled, tensorwise recipe),
// on the model's device, and marks them frozen: from then on their forward reads only the
// quantised weight. Then frees what inference never reads: the quantised weights' bf16 (fp32)
// copies, every gradient, and the fp32 main values of matrices (vectors keep theirs: a norm's
// 1 + w and the router's expert bias read it); the rest is repacked into buffers of its size.
// No training after this. Refuses a model built without FP8.
Fp8WeightMemory freeze_fp8_weights(GPTModel& m);

}  // namespace mt::model
