#pragma once
// GPTModel: embedding (+ learned positions) -> TransformerLayers -> final norm -> output layer
// (tied to the word embedding unless --untie-embeddings-and-output-weights) -> cross-entropy.
// Under pipeline parallelism a rank builds only its part: one or more chunks of consecutive
// layers (virtual stages), the embedding before its first chunk on the first stage, and the
// final norm, output layer and loss after its last chunk on the last stage.
#include <memory>
#include <utility>
#include <vector>

#include "model/sequence_layout.h"
#include "model/transformer_layer.h"

namespace mt::model {

// A micro-batch in the data's [batch, seq] order; the model works in [seq, batch] internally.
struct Batch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens;   // [B*S]
  std::vector<int32_t> labels;   // [B*S]
  std::vector<float> loss_mask;  // [B*S]
  // Packed documents (Megatron's --reset-position-ids / --reset-attention-mask): the position
  // of every token [B*S] (empty: 0..S-1 in every sample), and the documents attention keeps
  // apart as cumulative lengths over the batch's B*S tokens, sample after sample, every sample
  // border among them (empty: one document per sample).
  std::vector<int32_t> position_ids;
  std::vector<int32_t> cu_seqlens;
};

struct LossSums {
  double loss_sum = 0;  // sum over tokens of mask * token loss
  double tokens = 0;    // sum of the mask
};

// The pipeline part a rank builds. Layer indices are global, so parameter names are the same
// whatever the split. With tied embeddings the last stage (when it is not also the first)
// holds a `replica` of the word embedding as its output weight.
struct PipelinePart {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, end) layers per chunk; empty: all layers, one chunk
  bool first_stage = true;                          // embedding before chunk 0
  bool last_stage = true;                           // final norm, output layer and loss after the last chunk
};

// How this rank's copy of the model is split: its TP group (null: no tensor parallelism),
// sequence parallelism, its pipeline part, and the flat-buffer layout the data-parallel layer
// wants.
struct ModelOptions {
  comm::Communicator* tp = nullptr;
  bool sequence_parallel = false;
  LayoutFn layout;
  PipelinePart pipeline = {};  // default: the whole model
  bool tp_comm_overlap = false;  // --tp-comm-overlap (see TensorParallel::overlap_comm)
  ExpertParallel expert = {};    // MoE layers: expert-parallel groups and token dispatcher
  ContextParallel cp = {};       // context parallelism: each rank holds 2 of 2 x CP sequence chunks
};

// Megatron's rules for splitting a model over `tp` ranks, as errors naming the flags.
void check_tensor_parallel(const TransformerConfig& c, int64_t tp, bool sp);

class GPTModel {
 public:
  // Builds, allocates and initialises params (this rank's shards under TP, cut from the same
  // full tensors a single rank would draw).
  explicit GPTModel(const TransformerConfig& cfg, const ModelOptions& opts = {});
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // What one micro-batch's pass through one chunk keeps for its backward.
  struct Saved {
    int64_t B = 0, S = 0;  // S: this rank's tokens per sample (the whole sequence / CP)
    std::shared_ptr<const SequenceLayout> seq;  // null: plain whole sequences
    std::vector<int32_t> ids_sb, labels_sb;
    std::vector<float> mask_sb;
    Dropout::Saved emb_drop;
    std::vector<TransformerLayer::Saved> layers;
    Norm::Saved final_norm;
    Tensor ids, labels;  // I32 [S*B] on the model's device
    Tensor mask;         // F32 [S*B] loss mask on the model's device (the token count reads mask_sb)
    Tensor final_x, logits, lse;
    // The head's forward formed the logits' gradient for loss_grad_scale `grad_scale` (fused
    // cross-entropy, PassContext::loss_grad_scale): `logits` holds that gradient.
    bool logits_are_grad = false;
    float grad_scale = 0.f;
    // The CPU's fused head (head_forward_cpu) formed the final norm output's gradient in the
    // forward, and the output layer's weight gradient with it: the backward starts from here.
    Tensor head_dx;
  };

  // The whole model (one chunk with embedding and head): loss sums of a micro-batch. On the
  // GPU loss_sum is 0 and the sum is kept on the device instead: see collect_device_loss().
  LossSums forward(const Batch& batch, Saved& s, PassContext& ctx);
  // Backward of sum_t(mask_t * loss_t) * loss_grad_scale; accumulates into the main grads.
  void backward(Saved& s, float loss_grad_scale, PassContext& ctx);

  // Pipeline pieces. Chunk c's forward reads batch.tokens when it holds the embedding, else
  // `input`, the previous stage's output [activation_rows(B, S), h]; it returns its output for
  // the next stage, or, when it holds the head, an empty tensor and the loss in `*loss`.
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  bool chunk_has_embedding(int c) const { return chunks_[static_cast<size_t>(c)].embedding; }
  bool chunk_has_head(int c) const { return chunks_[static_cast<size_t>(c)].head; }
  Tensor forward_chunk(int c, const Batch& batch, const Tensor& input, Saved& s, PassContext& ctx, LossSums* loss);
  // Backward of chunk c from `dy`, the gradient of its output (ignored with the head, which
  // starts from the loss scaled by loss_grad_scale). Returns the gradient of its input for the
  // previous stage (empty with the embedding) and frees `s`.
  Tensor backward_chunk(int c, Saved& s, const Tensor& dy, float loss_grad_scale, PassContext& ctx);
  // Rows of the hidden states passed between stages: S*B, or this rank's sequence shard under SP.
  // S is the batch's sequence length (this rank holds S / CP of it).
  int64_t activation_rows(int64_t B, int64_t S) const {
    const int64_t s = S / cp_.size();
    return (tp_.sp() ? s / tp_.size() : s) * B;
  }
  // Inference logits [B*S, V] in (b, s) row order for tokens [B, S] (no dropout, nothing kept).
  Tensor logits(const std::vector<int32_t>& tokens, int64_t B, int64_t S);

  // The modules themselves, for the inference engine (src/inference), which runs them over a KV
  // cache rather than whole sequences. Whole model on one rank only (no TP, no pipeline split).
  const std::vector<TransformerLayer>& layers() const { return layers_; }
  const Norm& final_norm() const { return final_norm_; }
  const Param* word_embedding() const { return word_emb_; }
  const Param* position_embedding() const { return pos_emb_; }
  Linear output_layer() const { return output_linear(); }

  // On the GPU, head forwards add sum_t(mask_t * loss_t) to a device fp64 accumulator rather
  // than return it, so no micro-batch waits for the device. Returns the sum since the last call
  // (one device sync) and zeroes it; 0 on the CPU, where LossSums.loss_sum carries the sum.
  double collect_device_loss();

  // Moves parameters (and RoPE tables) to device d; batches are then uploaded per pass.
  void to_device(Device d);
  Device device() const { return device_; }
  const TransformerConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // FP8 training's scaling state (--fp8-format), null without it.
  Fp8Store* fp8() { return fp8_.get(); }
  // This rank's MoE layers, in layer order (the step runner's expert-bias update).
  template <typename F>
  void for_each_moe_layer(F&& f) {
    for (auto& l : layers_)
      if (l.is_moe) f(l.moe);
  }

 private:
  struct Chunk {
    size_t first = 0, last = 0;  // local layer indices [first, last)
    bool embedding = false, head = false;
  };
  Tensor embed(const std::vector<int32_t>& ids_sb, int64_t S, int64_t B, Saved& s, PassContext& ctx);
  // The micro-batch's token layout (null when it is plain: no CP, positions 0..S-1, no documents).
  std::shared_ptr<const SequenceLayout> layout(const Batch& batch) const;
  Tensor run_layers(Tensor x, const Chunk& ch, int64_t S, int64_t B, Saved& s, PassContext& ctx);
  LossSums head_forward(const Tensor& x, Saved& s, PassContext& ctx);
  // The CPU head without tensor parallelism: output layer and loss (and in training their
  // gradients) in one chunked pass (gpt_head_cpu.cpp). Whether it applies, and the loss sums.
  bool fused_cpu_head(const PassContext& ctx) const;
  LossSums head_forward_cpu(Saved& s, PassContext& ctx);
  LossSums loss_sums(const Tensor& losses, Saved& s);
  Tensor head_backward(Saved& s, float loss_grad_scale, PassContext& ctx);
  Tensor output_layer_backward(Saved& s, float loss_grad_scale, PassContext& ctx);  // the unfused path
  void embedding_backward(const Tensor& dx, Saved& s, PassContext& ctx);
  Linear output_linear() const;

  // Host values as an [n] tensor on the model's device (on the GPU without waiting for it).
  template <typename T>
  Tensor upload(const std::vector<T>& v) const;

  TransformerConfig cfg_;
  Device device_ = Device::CPU;
  TensorParallel tp_;  // layers keep pointers to it: GPTModel never moves
  ExpertParallel expert_;
  ContextParallel cp_;
  ParamStore params_;
  Param* word_emb_ = nullptr;  // first stage only
  Param* pos_emb_ = nullptr;
  Param* output_ = nullptr;  // last stage only; == word_emb_ when tied on one stage
  Dropout emb_drop_;
  std::unique_ptr<Fp8Store> fp8_;  // before layers_: their linears point into it
  Fp8Store& fp8_store();  // made on first use
  std::vector<TransformerLayer> layers_;  // this rank's layers, chunk after chunk
  std::vector<Chunk> chunks_;
  Norm final_norm_;
  RopeTables rope_;
  Tensor rope_host_cos_, rope_host_sin_;  // the tables on the host: gathered per pass for CP / packed positions
  Tensor loss_acc_;  // GPU: one fp64 (in an 8-byte I64 cell) summing head losses; see collect_device_loss
};

}  // namespace mt::model
