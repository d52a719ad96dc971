#pragma once
// One forward pass of a GPTModel over a batch of new tokens from several sequences, each reading
// and extending its own slot of a KV cache: the engine's prefill and decode are both this pass
// (a prompt's chunk is many rows of one slot, a decode step one row per slot). The model's own
// modules and ops run it (norms, linears, MLP or MoE layer, QKV split with RoPE), on the model's
// device; only the attention core is the cache's (ops::cached_attention).
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/device.h"
#include "model/attention.h"

namespace mt::model {
class GPTModel;
}

namespace mt::inference {

// The new tokens of one pass, row by row.
struct StepBatch {
  std::vector<int32_t> tokens;     // [N]
  std::vector<int32_t> slots;      // [N] the KV cache slot of each token's sequence
  std::vector<int32_t> positions;  // [N] its position in that sequence (0-based)
  std::vector<int32_t> logit_rows; // rows (indices into tokens) whose next-token logits are wanted
};

// One step's answer for the engine: every logit row's greedy token, worked out on the model's
// device, and the full host logits only where a row samples.
struct StepOutput {
  std::vector<int32_t> argmax;  // [rows]: the largest logit's id (lowest id on ties)
  Tensor logits;                // fp32 host [rows, V] when asked for, else undefined
};

class ModelRunner {
 public:
  // A cache of `slots` sequences of up to `max_len` tokens per layer, on the model's device in its
  // activation dtype. Fails (mt::Error) where the model is split over ranks.
  // `cuda_graphs`: on the GPU, decode steps (every row's logits wanted: one token per sequence)
  // replay a CUDA graph captured per row count, after one eager step at that count (which sets
  // up the GEMM plans). Not for MoE models (their expert counts go through the host). A capture
  // that fails turns graphs off with a warning and the step runs eagerly.
  // `small_rows_gemv`: on the GPU, the passes' linears of at most 16 rows (decode steps) run the
  // bandwidth-bound GEMV instead of cuBLASLt (ops::InferenceGemv); off: cuBLASLt throughout.
  ModelRunner(model::GPTModel& m, int64_t slots, int64_t max_len, bool cuda_graphs = false,
              bool small_rows_gemv = true);
  ~ModelRunner();
  // Writes every row's K and V into the cache and returns the fp32 host logits [rows, V] of
  // batch.logit_rows over the real (unpadded) vocabulary V.
  Tensor forward(const StepBatch& batch);
  // The same step, returning the rows' greedy tokens, plus their logits when `want_logits`.
  StepOutput step(const StepBatch& batch, bool want_logits);
  // After step(): log p(ids[r]) under row r of that step's logits (temperature 1, the real
  // vocabulary), worked out on the model's device (ops::token_logprobs): R numbers to the host.
  std::vector<float> token_logprobs(const std::vector<int32_t>& ids) const;
  int64_t slots() const { return slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t vocab() const { return vocab_; }
  const model::GPTModel& model() const { return m_; }
  bool cuda_graphs() const { return graphs_on_; }
  bool decode_kernels() const { return decode_kernels_; }  // unless MT_DECODE_FUSED=0 at construction
  bool graph_arena() const { return arena_; }                // unless MT_DECODE_ARENA=0 at construction
  // The decode fusions (norm -> GEMV, GEMV -> SwiGLU, QKV split -> KV cache; issue #22): with the
  // decode kernels on the GPU's GEMV, unless MT_DECODE_FUSIONS=0 at construction.
  bool decode_fusions() const { return fusions_; }
  // The whole-stack decode kernel (ops::decode_layer_stack) for batch-1 decode steps of
  // Llama-family stacks: where MT_DECODE_STACK=1 at construction, on the GPU with the decode
  // fusions (on the CPU the op runs the layers' ops one by one: the same logits).
  bool decode_stack() const { return stack_; }
  int64_t decode_stack_steps() const { return stack_steps_; }  // passes that went through it
  int64_t graph_replays() const { return replays_; }
  // Benches (issue #22): the decode graph of `rows` rows replayed `n` times back to back, with no
  // host work between, timed by compute-stream events: the GPU seconds of one replay, to set
  // beside the end-to-end time per token (the difference is host time between replays). 0 where
  // no graph of that row count was captured. The replays redo the last step: they rewrite its KV
  // cache position and its logits with the same values.
  double graph_replay_seconds(int64_t rows, int n);

 private:
  struct Inputs {  // one pass's inputs on the device
    Tensor ids, slot, pos, cos, sin, rows;  // views of the two below
    Tensor ints, floats;                    // ids, slot, pos, rows packed; cos, sin packed (one upload each)
    // The pass is one sequence's first tokens (rows 0..N-1 of one slot, N > 1): its attention is
    // the plain causal attention of those rows (training's flash / cuDNN kernels), not the decode
    // kernel over the cache, which walks the cache a query row at a time. Never a decode step.
    bool fresh_prompt = false;
    // Every row's logits are wanted, in row order (a decode step): the head reads the rows as
    // they are, without gathering them.
    bool all_rows = false;
  };
  struct Graph;
  // The pass on the device: logits [rows, padded vocab] in the activations' dtype.
  Tensor device_forward(const Inputs& in);
  Tensor device_logits(const StepBatch& b);  // checks the batch, runs it: [rows, V'] on the device
  Tensor host_logits(Tensor l) const;         // those as fp32 on the host, the padded columns dropped
  Tensor graph_forward(const Inputs& in, int64_t N);
  static Inputs views(const Tensor& ints, const Tensor& floats, int64_t N);
  Tensor layer_forward(size_t l, const Tensor& x, const Inputs& in);
  // Every layer through ops::decode_layer_stack where the pass is one decode row of a stack that
  // it takes (decode_stack()); else an undefined tensor and the layers run one by one.
  Tensor stack_forward(const Tensor& x, const Inputs& in);
  Tensor head_forward(const Tensor& x, const Inputs& in);  // the final norm and the output layer
  // Whether a decode pass's linear `l` may go through ops::fused_linear_forward: fusions on, and
  // the plain bf16/fp16 product (no TP split, no FP8).
  bool fusable(const model::Linear& l, const Inputs& in) const;
  template <typename T>
  Tensor upload(const std::vector<T>& v) const;

  model::GPTModel& m_;
  int64_t slots_, max_len_, vocab_;
  Device device_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [slots, G, max_len, D]
  model::RopeTables rope_;                 // host tables for positions 0..max_len-1 (RoPE models)
  bool graphs_on_ = false;
  bool gemv_ = true;
  bool decode_kernels_ = true;  // unless MT_DECODE_FUSED=0 (the constructor says why)
  bool arena_ = true;            // the decode graphs' temporaries in a DeviceArena (unless MT_DECODE_ARENA=0)
  bool fusions_ = false;         // decode_fusions()
  bool stack_ = false;           // decode_stack()
  int64_t stack_steps_ = 0;
  ops::InferenceGemv::Kernel gemv_kernel_ = ops::InferenceGemv::Kernel::Wide;  // MT_GEMV_KERNEL
  int64_t replays_ = 0;
  std::map<int64_t, std::unique_ptr<Graph>> graphs_;  // per row count
  Tensor last_logits_;  // the last step's [rows, V'] on the device, for token_logprobs()
  Tensor graph_ids_;    // the last step's greedy ids I32 [rows] where its graph found them, else undefined
};

}  // namespace mt::inference
