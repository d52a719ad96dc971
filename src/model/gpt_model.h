#pragma once
// GPTModel: embedding (+ learned positions) -> TransformerLayers -> final norm -> output layer
// (tied to the word embedding unless --untie-embeddings-and-output-weights) -> cross-entropy.
#include <memory>
#include <vector>

#include "model/transformer_layer.h"

namespace mt::model {

// A micro-batch in the data's [batch, seq] order; the model works in [seq, batch] internally.
struct Batch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens;   // [B*S]
  std::vector<int32_t> labels;   // [B*S]
  std::vector<float> loss_mask;  // [B*S]
};

struct LossSums {
  double loss_sum = 0;  // sum over tokens of mask * token loss
  double tokens = 0;    // sum of the mask
};

// How this rank's copy of the model is split: its TP group (null: no tensor parallelism),
// sequence parallelism, and the flat-buffer layout the data-parallel layer wants.
struct ModelOptions {
  comm::Communicator* tp = nullptr;
  bool sequence_parallel = false;
  LayoutFn layout;
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

  struct Saved {
    int64_t B = 0, S = 0;
    std::vector<int32_t> ids_sb, labels_sb;
    std::vector<float> mask_sb;
    Dropout::Saved emb_drop;
    std::vector<TransformerLayer::Saved> layers;
    Norm::Saved final_norm;
    Tensor ids, labels;  // I32 [S*B] on the model's device
    Tensor final_x, logits, lse;
  };

  LossSums forward(const Batch& batch, Saved& s, PassContext& ctx);
  // Backward of sum_t(mask_t * loss_t) * loss_grad_scale; accumulates into the main grads.
  void backward(Saved& s, float loss_grad_scale, PassContext& ctx);
  // Inference logits [B*S, V] in (b, s) row order for tokens [B, S] (no dropout, nothing kept).
  Tensor logits(const std::vector<int32_t>& tokens, int64_t B, int64_t S);

  const TransformerConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const TensorParallel& tensor_parallel() const { return tp_; }

 private:
  Tensor embed(const std::vector<int32_t>& ids_sb, int64_t S, int64_t B, Saved& s, PassContext& ctx);
  Tensor run_layers(Tensor x, int64_t S, int64_t B, Saved& s, PassContext& ctx);
  Linear output_linear() const;

  TransformerConfig cfg_;
  TensorParallel tp_;  // layers keep pointers to it: GPTModel never moves
  ParamStore params_;
  Param* word_emb_ = nullptr;
  Param* pos_emb_ = nullptr;
  Param* output_ = nullptr;  // == word_emb_ when tied
  Dropout emb_drop_;
  std::vector<TransformerLayer> layers_;
  Norm final_norm_;
  RopeTables rope_;
};

}  // namespace mt::model
