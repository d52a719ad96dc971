#pragma once
// All parameters of a model live in one contiguous fp32 "main" buffer with a matching fp32
// main-grad buffer (DESIGN.md), so the optimizer, grad clipping, DDP buckets and the
// distributed optimizer work on flat ranges. With --bf16 (--fp16) a separate "model" buffer holds
// the bf16- (fp16-) rounded copy that forward/backward compute with; otherwise it aliases the
// main buffer.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "model/config.h"
#include "optim/optimizer.h"

namespace mt::model {

struct Fp8Linear;

enum class Init { Normal, ScaledNormal, Zeros, Ones };

// How a parameter is split across tensor-parallel ranks. The full tensor's dimension `dim` is
// `blocks` equal blocks, each cut into `size` equal parts; this rank holds part `rank` of every
// block, concatenated (fc1 under SwiGLU: blocks 2 gives [gate_r; up_r]). dim -1: replicated.
struct TPSplit {
  int dim = -1;
  int blocks = 1;
  int rank = 0, size = 1;
  bool sharded() const { return dim >= 0 && size > 1; }
};

struct Param {
  std::string name;  // Megatron-style name, e.g. decoder.layers.0.self_attention.linear_qkv.weight
  Shape shape;
  Init init = Init::Normal;
  bool weight_decay = true;
  int64_t offset = 0;  // into the flat buffers
  Tensor main;         // fp32 master value
  Tensor grad;         // fp32 main grad (accumulated over micro-batches)
  Tensor value;        // what kernels read: == main (fp32) or its bf16/fp16-rounded copy
  // Tensor parallelism: `shape` is this rank's shard of `full_shape` (equal when not split).
  Shape full_shape;
  TPSplit tp;
  // Replicated across TP ranks, but under sequence parallelism each rank sees only its sequence
  // shard, so its gradient is partial and must be summed over TP (Megatron's
  // `sequence_parallel` attribute: norm weights, and the position embedding here).
  bool sequence_parallel = false;
  // Tied word embedding under pipeline parallelism (Megatron's `shared_embedding`): the first
  // stage's embedding and the last stage's output weight are copies of one parameter, named
  // alike, whose gradients are summed over the embedding group so both take the same step.
  // The last stage's copy is `replica` (Megatron's `shared`): the grad norm counts it once,
  // and checkpoints need to save it once.
  bool shared_embedding = false;
  bool replica = false;
  // The word embedding and the output layer's weight on whichever stage holds them (Megatron's
  // is_embedding_or_output_parameter): the optimizer's decoupled learning-rate group.
  bool embedding_or_output = false;
  // A routed expert's weight (Megatron's `allreduce = False` expert params): it differs across
  // expert-parallel ranks, so its gradient is reduced over the expert-data-parallel group rather
  // than DP, the grad norm counts it once per expert, and checkpoints save it from EDP rank 0.
  // Its `tp` split (if any) is over the expert-tensor-parallel group.
  bool expert = false;
  // Gradients that only a weight GEMM writes (Linear weights) are not zeroed between steps:
  // zero_grad sets overwrite_grad instead, and the step's first GEMM takes it (beta = 0), so most
  // of the grad buffer is written once per step rather than zeroed and then read back.
  bool gemm_only_grad = false;
  bool overwrite_grad = false;
  // --fp8-param-gather: the FP8 linear whose weight this is. The distributed optimizer casts its
  // updated fp32 shard to FP8 and all-gathers the codes (parallel/fp8_param_gather.h), so the
  // model copy (and, off this rank's shard, the fp32 main copy) is not kept current for it.
  const Fp8Linear* fp8_gathered = nullptr;
  // Whether the next gradient write accumulates (false once after zero_grad, for gemm_only_grad).
  bool take_accumulate() {
    const bool acc = !overwrite_grad;
    overwrite_grad = false;
    return acc;
  }
  int64_t numel() const { return shape_numel(shape); }
};

// Where each parameter (in registration order) starts in the flat buffers, and their size.
// The data-parallel layer uses it to pad gradient buckets for the distributed optimizer.
struct BufferLayout {
  std::vector<int64_t> offsets;
  int64_t total = 0;
};
using LayoutFn = std::function<BufferLayout(const std::deque<Param>&)>;

// Copies this rank's shard out of a full tensor (`full` laid out as p.full_shape), and back.
void extract_shard(const Param& p, const float* full, float* shard);
void insert_shard(const Param& p, const float* shard, float* full);

class ParamStore {
 public:
  // Registers a parameter; allowed only before allocate(). Returned reference stays valid.
  // `full_shape` is the unsplit shape; `tp` says which shard this rank holds.
  Param& add(const std::string& name, const Shape& full_shape, Init init, bool weight_decay, TPSplit tp = {});
  // Default layout: registration order, no gaps. `layout` may place parameters elsewhere
  // (gaps read as zero and never change).
  void allocate(Half model_copy, const LayoutFn& layout = {});
  // Megatron's init: N(0, std) for weights, N(0, std / sqrt(2 * num_layers)) for the output
  // projections of attention and MLP, zeros for biases, ones for norm weights. Each parameter
  // draws from its own Philox stream keyed by its name, so init depends neither on the other
  // parameters nor on which pipeline stage holds it. A tensor-parallel shard is cut from the
  // full tensor drawn the same way, so every layout starts from the single-rank weights.
  void initialize(uint64_t seed, float std, int64_t num_layers);
  // Moves every buffer to device d (CUDA: fp32 main params and grads, bf16/fp16 compute copy);
  // views are rebuilt at the same offsets. Host-side code (checkpoints) then needs copies.
  void to_device(Device d);
  Device device() const { return main_.device(); }
  Tensor& model_buffer() { return model_; }
  // Refreshes the compute copy after the optimizer changed the main params.
  void sync_model_from_main();
  void sync_model_from_main(int64_t begin, int64_t end);  // a flat range only
  // Zeroes the gradients for a new step, except gemm_only_grad ones (marked overwrite_grad);
  // after the step's backward passes, zero_unwritten_grads() zeroes those no GEMM wrote.
  void zero_grad();
  void zero_unwritten_grads();

  int64_t numel() const { return total_; }
  Tensor& main_buffer() { return main_; }
  Tensor& grad_buffer() { return grad_; }
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  std::vector<optim::ParamSpan> spans() const;
  bool bf16() const { return half_ == Half::BF16; }
  Half half() const { return half_; }

 private:
  std::deque<Param> params_;
  Tensor main_, grad_, model_;
  int64_t total_ = 0;
  bool allocated_ = false;
  Half half_ = Half::None;
};

}  // namespace mt::model
