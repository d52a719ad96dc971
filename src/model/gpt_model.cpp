#include "model/gpt_model.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/vocab_parallel.h"

namespace mt::model {

GPTModel::GPTModel(const TransformerConfig& cfg, const ModelOptions& opts) : cfg_(cfg) {
  cfg_.finalize();
  tp_.comm = opts.tp;
  tp_.sequence_parallel = opts.sequence_parallel;
  if (tp_.on()) check_tensor_parallel(cfg_, tp_.size(), tp_.sp());
  const int64_t h = cfg_.hidden_size;
  word_emb_ = &params_.add("embedding.word_embeddings.weight", {cfg_.vocab_size, h}, Init::Normal, true, tp_.split(0));
  if (cfg_.position_embedding_type == "learned_absolute") {
    pos_emb_ = &params_.add("embedding.position_embeddings.weight", {cfg_.max_position_embeddings, h}, Init::Normal,
                            true);
    pos_emb_->sequence_parallel = tp_.sp();  // added on sequence shards under SP
  }
  if (cfg_.rope()) rope_.build(cfg_.seq_length, cfg_.rotary_dim(), cfg_.rotary_base);
  layers_.resize(static_cast<size_t>(cfg_.num_layers));
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    layers_[static_cast<size_t>(i)].build(params_, "decoder.layers." + std::to_string(i), cfg_,
                                          cfg_.rope() ? &rope_ : nullptr, &tp_);
  final_norm_.build(params_, "decoder.final_layernorm", cfg_, &tp_);
  output_ = cfg_.untie_embeddings_and_output_weights
                ? &params_.add("output_layer.weight", {cfg_.vocab_size, h}, Init::Normal, true, tp_.split(0))
                : word_emb_;
  emb_drop_.p = cfg_.hidden_dropout;
  emb_drop_.tp_region = tp_.sp();
  params_.allocate(cfg_.bf16, opts.layout);
  params_.initialize(cfg_.seed, cfg_.init_method_std, cfg_.num_layers);
}

Tensor GPTModel::embed(const std::vector<int32_t>& ids_sb, int64_t S, int64_t B, Saved& s, PassContext& ctx) {
  const int64_t n = S * B;
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = ids_sb[static_cast<size_t>(i)];
    if (id < 0 || id >= cfg_.vocab_size)
      fail("token id {} is outside the model's vocabulary of {} (wrong --vocab-size or tokenizer?)", id,
           cfg_.vocab_size);
  }
  ctx.before_use(word_emb_);
  ctx.before_use(pos_emb_);
  if (pos_emb_ && S > cfg_.max_position_embeddings)
    fail("sequence of {} tokens exceeds --max-position-embeddings {}", S, cfg_.max_position_embeddings);
  Tensor x;
  if (tp_.on()) {
    // Vocab-parallel lookup, summed over TP (reduce-scattered to this rank's sequence shard
    // under SP); position embeddings are then added to the rows this rank holds.
    x = vocab_parallel_embedding_forward(ids_sb, word_emb_->value, tp_);
    if (tp_.sp()) x = reduce_scatter_rows(x, tp_);
    else all_reduce_tp(x, tp_);
    if (pos_emb_) {
      const int64_t s_local = tp_.sp() ? S / tp_.size() : S;
      ops::add_position_embedding(x, pos_emb_->value.slice(tp_.sp() ? tp_.rank() * s_local : 0, s_local), s_local, B);
    }
  } else {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.ids = Tensor::from_vector(ids_sb, {n});
    x = ops::embedding_forward(s.ids, word_emb_->value);
    if (pos_emb_) ops::add_position_embedding(x, pos_emb_->value, S, B);
  }
  Tensor y = emb_drop_.forward(x, s.emb_drop, ctx);
  if (cfg_.bf16) {
    if (y.raw() == x.raw()) y = x;
    round_to_bf16_inplace(y);
  }
  return y;
}

Tensor GPTModel::run_layers(Tensor x, int64_t S, int64_t B, Saved& s, PassContext& ctx) {
  s.layers.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i].forward(x, S, B, s.layers[i], ctx);
  return final_norm_.forward(x, s.final_norm, ctx);
}

LossSums GPTModel::forward(const Batch& batch, Saved& s, PassContext& ctx) {
  const int64_t B = batch.B, S = batch.S, n = B * S, V = cfg_.vocab_size;
  if (S > cfg_.seq_length) fail("micro-batch sequence length {} exceeds --seq-length {}", S, cfg_.seq_length);
  s.B = B;
  s.S = S;
  s.ids_sb.resize(static_cast<size_t>(n));
  s.labels_sb.resize(static_cast<size_t>(n));
  s.mask_sb.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si) {
      size_t src = static_cast<size_t>(b * S + si), dst = static_cast<size_t>(si * B + b);
      s.ids_sb[dst] = batch.tokens[src];
      s.labels_sb[dst] = batch.labels[src];
      s.mask_sb[dst] = batch.loss_mask[src];
      if (batch.labels[src] < 0 || batch.labels[src] >= V) fail("label id {} outside the vocabulary", batch.labels[src]);
    }
  if (tp_.sp() && S % tp_.size() != 0)
    fail("--sequence-parallel: sequence length {} is not divisible by --tensor-model-parallel-size {}", S, tp_.size());
  Tensor x = embed(s.ids_sb, S, B, s, ctx);
  s.final_x = run_layers(x, S, B, s, ctx);
  s.logits = output_linear().forward(s.final_x, ctx);
  ScopedOpTimer t(ctx.times, &OpTimes::loss);
  Tensor losses;
  if (tp_.on()) {
    vocab_parallel_cross_entropy_forward(s.logits, s.labels_sb, tp_, losses, s.lse);
  } else {
    s.labels = Tensor::from_vector(s.labels_sb, {n});
    ops::cross_entropy_forward(s.logits, s.labels, losses, s.lse);
  }
  LossSums r;
  const float* l = losses.data<float>();
  for (int64_t i = 0; i < n; ++i) {  // fixed order: deterministic
    r.loss_sum += static_cast<double>(l[i]) * s.mask_sb[static_cast<size_t>(i)];
    r.tokens += s.mask_sb[static_cast<size_t>(i)];
  }
  return r;
}

void GPTModel::backward(Saved& s, float loss_grad_scale, PassContext& ctx) {
  const int64_t B = s.B, S = s.S, n = B * S;
  Tensor dlogits;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::loss);
    std::vector<float> dloss(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) dloss[static_cast<size_t>(i)] = s.mask_sb[static_cast<size_t>(i)] * loss_grad_scale;
    dlogits = tp_.on() ? vocab_parallel_cross_entropy_backward(s.logits, s.labels_sb, s.lse, dloss, tp_)
                       : ops::cross_entropy_backward(s.logits, s.labels, s.lse, Tensor::from_vector(dloss, {n}));
  }
  s.logits = Tensor();
  Tensor dx = output_linear().backward(dlogits, s.final_x, ctx);
  dlogits = Tensor();
  dx = final_norm_.backward(dx, s.final_norm, ctx);
  for (size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(dx, S, B, s.layers[i], ctx);
  dx = emb_drop_.backward(dx, s.emb_drop);
  if (tp_.on()) {
    if (pos_emb_) {
      const int64_t s_local = tp_.sp() ? S / tp_.size() : S;
      Tensor pg = pos_emb_->grad.slice(tp_.sp() ? tp_.rank() * s_local : 0, s_local);
      ops::position_embedding_backward(dx, pg, s_local, B);
    }
    Tensor dfull = tp_.sp() ? all_gather_rows(dx, tp_) : dx;
    vocab_parallel_embedding_backward(s.ids_sb, dfull, word_emb_->grad, tp_);
  } else {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::embedding_backward(s.ids, dx, word_emb_->grad);
    if (pos_emb_) ops::position_embedding_backward(dx, pos_emb_->grad, S, B);
  }
  ctx.grad_ready(pos_emb_);
  ctx.grad_ready(word_emb_);
  s = Saved{};
}

Tensor GPTModel::logits(const std::vector<int32_t>& tokens, int64_t B, int64_t S) {
  MT_CHECK(!tp_.on(), "inference logits with tensor parallelism are not offered yet");
  PassContext ctx;
  ctx.training = false;
  Saved s;
  std::vector<int32_t> ids_sb(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si) ids_sb[static_cast<size_t>(si * B + b)] = tokens[static_cast<size_t>(b * S + si)];
  Tensor x = run_layers(embed(ids_sb, S, B, s, ctx), S, B, s, ctx);
  Tensor l_sb = output_linear().forward(x, ctx);
  Tensor l = Tensor::empty({B * S, cfg_.vocab_size});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si)
      std::copy_n(l_sb.data<float>() + (si * B + b) * cfg_.vocab_size, cfg_.vocab_size,
                  l.data<float>() + (b * S + si) * cfg_.vocab_size);
  return l;
}

Linear GPTModel::output_linear() const {
  Linear l{output_, nullptr, cfg_.hidden_size, cfg_.vocab_size};
  l.mode = tp_.on() ? ParallelMode::Column : ParallelMode::None;  // logits split over the vocabulary
  l.tp = &tp_;
  l.report_weight_grad = output_ != word_emb_;  // a tied weight is complete after the embedding
  return l;
}

void check_tensor_parallel(const TransformerConfig& c, int64_t tp, bool sp) {
  const char* fix = "; change --tensor-model-parallel-size or the model shape";
  if (c.num_attention_heads % tp != 0)
    fail("--num-attention-heads ({}) must be divisible by --tensor-model-parallel-size ({}){}", c.num_attention_heads,
         tp, fix);
  if (c.num_query_groups % tp != 0)
    fail("--num-query-groups ({}) must be divisible by --tensor-model-parallel-size ({}): Megatron gives each TP rank "
         "whole query groups{}",
         c.num_query_groups, tp, fix);
  if (c.ffn_hidden_size % tp != 0)
    fail("--ffn-hidden-size ({}) must be divisible by --tensor-model-parallel-size ({}){}", c.ffn_hidden_size, tp, fix);
  if (c.vocab_size % tp != 0)
    fail("padded vocabulary ({}) must be divisible by --tensor-model-parallel-size ({}); the vocabulary is padded to "
         "a multiple of --make-vocab-size-divisible-by x TP",
         c.vocab_size, tp);
  if (sp && c.seq_length % tp != 0)
    fail("--sequence-parallel needs --seq-length ({}) divisible by --tensor-model-parallel-size ({})", c.seq_length, tp);
}

}  // namespace mt::model
