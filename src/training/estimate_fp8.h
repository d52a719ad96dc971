#pragma once
// FP8's part of `megatron estimate`: what the FP8 linears of one transformer layer keep alive on a
// rank beyond what the same layer keeps in bf16 (model/fp8.h, fp8_gemms.cpp, fp8_block_gemms.cpp,
// parallel/fp8_param_gather.h). Measured on GPUs (docs/estimate_fp8.md), the weight codes and the
// input codes that replace bf16 inputs explain FP8's peaks to within a few hundred MiB.
#include <cstdint>

#include "training/arguments.h"

namespace mt::estimate {

// One layer on one rank, in bytes; all zero for a layer that runs in bf16 (no --fp8-format, or
// --first-last-layers-bf16's first and last layers).
struct Fp8LayerBytes {
  // Kept for the whole run:
  double weight_codes = 0;      // E4M3 weight codes cached for the optimizer step (--fp8-param-gather:
                                // its all-gathered buffers); blockwise adds the 128x128 tiles' scale_invs
  double emulated_weights = 0;  // weights quantized and read back in the activation type, cached per step
                                // where a linear runs the emulation (routed experts, biased linears,
                                // shapes cuBLASLt's FP8 GEMMs refuse, the CPU)
  double state = 0;             // amax histories, scales, amaxes, clipped counters, the weights' scale pairs
  // Per pass (micro-batch, chunk) in flight, where the layer keeps its activations (a forward
  // outside full recomputation, or its rebuild):
  double input_codes = 0;     // the inputs' transposed codes kept for the weight gradient (blockwise: and
                              // their 1x128 scale_invs)
  double inputs_dropped = 0;  // the activation-type inputs the layer then does not save
  // Per pass in flight, always: the scale (and inverse) each forward keeps for its backward, also
  // where full recomputation drops everything else.
  double pass_scales = 0;
  // Transient: the most one linear's backward allocates beyond the bf16 backward's tensors (the
  // output gradient's codes and their transpose, the weight's transposed codes or the input re-cast).
  double backward = 0;

  double codes_for_inputs() const { return input_codes - inputs_dropped; }
  double persistent() const { return weight_codes + emulated_weights + state; }
};

// Transformer layer `layer` (0-based, global) of a validated run. `gpu`: the model's device.
// `recomputed`: the layer sits in a full-recomputation group (its first forward keeps no codes,
// its rebuild re-casts the inputs: input_codes then count in the rebuild only). `real_gemms`: whether the device runs the cuBLASLt path
// (the GPU; tests set it for the CPU reference of that path, as Fp8Store::real_gemms_on_cpu).
Fp8LayerBytes fp8_layer_bytes(const Arguments& a, int64_t layer, bool gpu, bool recomputed,
                              bool real_gemms);

// cuBLASLt's FP8 handle workspace (kernels/cuda/fp8_lt.h), cudaMalloc'd once per process outside
// the tensor pool: 0 without FP8 or off the GPU.
double fp8_gemm_workspace(const Arguments& a, bool gpu);

}  // namespace mt::estimate
