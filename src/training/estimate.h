#pragma once
// `megatron estimate`: per-rank memory, communication and FLOPs of a pretrain run, computed from
// its flags alone (no GPU, no data). The memory model follows what this engine allocates (the
// ParamStore's flat buffers, the tensors each module's Saved keeps between forward and backward,
// the pipeline schedule's in-flight passes), so it predicts the trainer's "peak GPU memory" line
// rather than a generic transformer formula; tests/training/estimate_test.cpp holds it to the
// peaks measured in BENCHMARKS.md, estimate_fp8_test.cpp its FP8 part (training/estimate_fp8.h).
#include <cstdint>
#include <string>
#include <vector>

#include "training/arguments.h"

namespace mt::estimate {

// What the user gives beyond pretrain's flags.
struct Options {
  double gpu_memory_gib = 80.0;  // --gpu-memory-gib (default: an 80 GB H100)
  int64_t world_size = 0;        // --world-size (0: TP x PP x CP, i.e. DP 1)
  // CPU runs: whether the binary links the CUDA libraries, which the process then maps (about
  // 160 MiB of resident memory); default: how this binary was built.
  bool cuda_build = built_with_cuda();
  static bool built_with_cuda();
};

// One pipeline rank's memory in bytes (every TP/CP/DP/EP rank of a stage holds the same).
struct StageMemory {
  int rank = 0;                       // pipeline rank
  int64_t layers = 0;                 // transformer layers it holds (all its chunks)
  bool embedding = false, head = false;
  int64_t params = 0;                 // this rank's parameters (its shard)
  int64_t expert_params = 0;          // of which routed experts' (sharded over expert-DP)
  double weights = 0;                 // the compute copy (bf16/fp16; fp32 on the CPU)
  double main_params = 0;             // fp32 main params (aliases the weights in fp32 runs)
  double grads = 0;                   // fp32 main grads
  double optimizer = 0;               // Adam moments / SGD momentum, sharded by the distributed optimizer
  double activations = 0;             // saved for backward by the passes in flight at the peak
  int64_t in_flight = 0;              // those passes (micro-batches x chunks)
  double logits = 0;                  // the head's logits (and their gradient) at the peak
  double workspace = 0;               // transient buffers of the backward at the peak
  double layer_activation = 0;        // one layer, one micro-batch (for the report)
  // FP8 (--fp8-format; training/estimate_fp8.h), all zero without it. Kept for the whole run:
  double fp8_weights = 0;           // weight codes cached per step (--fp8-param-gather: its buffers)
  double fp8_emulated_weights = 0;  // emulated linears' quantized weights, read back and cached per step
  double fp8_state = 0;             // amax histories, scales
  // Parts of `activations` and `workspace` (already counted there), for the report:
  double fp8_input_codes = 0;     // the transposed input codes (and scales) the passes in flight keep
  double fp8_inputs_dropped = 0;  // the bf16 inputs those codes replace (not in activations)
  double fp8_backward = 0;        // the backward's casts (output gradient codes, transposed weight)

  double states() const { return weights + main_params + grads + optimizer; }
  double fp8_persistent() const { return fp8_weights + fp8_emulated_weights + fp8_state; }
  double pool_peak() const { return states() + fp8_persistent() + activations + logits + workspace; }
};

// One communication group's traffic per training step, per rank (bytes this rank sends).
struct CommVolume {
  std::string group;        // TP, SP, CP, PP, DP, EP, ...
  std::string what;         // the collectives
  double bytes = 0;
  int64_t size = 1;         // ranks in the group
};

struct Estimate {
  bool gpu = true;
  int64_t world_size = 1, tp = 1, pp = 1, vpp = 1, cp = 1, dp = 1, ep = 1, etp = 1, edp = 1;
  int64_t microbatches = 1;       // per step per DP rank
  std::vector<StageMemory> stages;
  double outside_pool = 0;        // CUDA context, cuBLASLt/cuDNN workspaces, NCCL buffers (GPU)
  // cuDNN's deterministic attention backward: a B*Hq*S*S*2-byte workspace (one layer at a time),
  // drawn from the pool but outside the tensor peak line. 0 where the flash kernels run instead.
  double attention_workspace = 0;
  double fp8_gemm_workspace = 0;  // cuBLASLt's FP8 handle workspace (cudaMalloc'd, outside the pool)
  double slack_fraction = 0;      // allocator fragmentation allowance (see slack())
  std::vector<CommVolume> comm;   // for the busiest pipeline rank
  double flops_per_step = 0;      // model FLOPs of one global batch (Megatron's formula)

  // The allocator's fragmentation on top of a stage's tensors: on the GPU a share of the pool
  // peak (stream-ordered pool); on the CPU a share of the activations and workspaces, the many
  // mid-sized blocks glibc's heap keeps mapped after they are freed.
  double slack(const StageMemory& s) const;
  double needed(const StageMemory& s) const {
    return s.pool_peak() + slack(s) + outside_pool + attention_workspace + fp8_gemm_workspace;
  }
  // The stage needing the most, and what one GPU (or the host) needs for it.
  const StageMemory& peak_stage() const;
  double needed_bytes() const { return needed(peak_stage()); }
};

// Pretrain's arguments for an estimate: parsed (by the caller), then completed where estimate
// needs no input (no data, no iteration count), given the world size and validated by
// pretrain's own rules. `vocab` is the tokenizer's vocabulary. Throws mt::Error naming the flag.
Arguments validated(Arguments a, const Options& o, int64_t vocab);

// The estimate of a validated run.
Estimate estimate(const Arguments& a, const Options& o = {});

// Layout changes that would make the run fit (each tried through validated() and estimate()):
// one line each, best first; empty when it fits already or nothing was found.
struct Suggestion {
  std::string change;  // the flags, as a user would write them
  double needed = 0;   // bytes per GPU with the change
  bool fits = false;
};
std::vector<Suggestion> suggestions(const Arguments& parsed, const Options& o, int64_t vocab, double budget_bytes);

// The report `megatron estimate` prints.
std::string report(const Arguments& a, const Estimate& e, const Options& o, const std::vector<Suggestion>& s);

// Parts of the model, exposed for the tests.
double layer_activation_bytes(const Arguments& a, int64_t layer_index, bool gpu);
std::vector<CommVolume> comm_volumes(const Arguments& a, const Estimate& e);

}  // namespace mt::estimate
