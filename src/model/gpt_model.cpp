#include "model/gpt_model.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace mt::model {

GPTModel::GPTModel(const TransformerConfig& cfg) : cfg_(cfg) {
  cfg_.finalize();
  const int64_t h = cfg_.hidden_size;
  word_emb_ = &params_.add("embedding.word_embeddings.weight", {cfg_.vocab_size, h}, Init::Normal, true);
  if (cfg_.position_embedding_type == "learned_absolute")
    pos_emb_ = &params_.add("embedding.position_embeddings.weight", {cfg_.max_position_embeddings, h}, Init::Normal,
                            true);
  if (cfg_.rope()) rope_.build(cfg_.seq_length, cfg_.rotary_dim(), cfg_.rotary_base);
  layers_.resize(static_cast<size_t>(cfg_.num_layers));
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    layers_[static_cast<size_t>(i)].build(params_, "decoder.layers." + std::to_string(i), cfg_,
                                          cfg_.rope() ? &rope_ : nullptr);
  final_norm_.build(params_, "decoder.final_layernorm", cfg_);
  output_ = cfg_.untie_embeddings_and_output_weights
                ? &params_.add("output_layer.weight", {cfg_.vocab_size, h}, Init::Normal, true)
                : word_emb_;
  emb_drop_.p = cfg_.hidden_dropout;
  params_.allocate(cfg_.bf16);
  params_.initialize(cfg_.seed, cfg_.init_method_std, cfg_.num_layers);
}

Tensor GPTModel::embed(const std::vector<int32_t>& ids_sb, int64_t S, int64_t B, Saved& s, PassContext& ctx) {
  const int64_t h = cfg_.hidden_size, n = S * B;
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = ids_sb[static_cast<size_t>(i)];
    if (id < 0 || id >= cfg_.vocab_size)
      fail("token id {} is outside the model's vocabulary of {} (wrong --vocab-size or tokenizer?)", id,
           cfg_.vocab_size);
  }
  Tensor x = Tensor::empty({n, h});
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    cpu::embedding_forward(ids_sb.data(), word_emb_->value.data<float>(), x.data<float>(), n, h);
    if (pos_emb_) {
      if (S > cfg_.max_position_embeddings)
        fail("sequence of {} tokens exceeds --max-position-embeddings {}", S, cfg_.max_position_embeddings);
      const float* pe = pos_emb_->value.data<float>();
      float* xd = x.data<float>();
      for (int64_t si = 0; si < S; ++si)
        for (int64_t b = 0; b < B; ++b) cpu::add_inplace(xd + (si * B + b) * h, pe + si * h, h);
    }
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
  Tensor x = embed(s.ids_sb, S, B, s, ctx);
  s.final_x = run_layers(x, S, B, s, ctx);
  Linear out{output_, nullptr, cfg_.hidden_size, V};
  s.logits = out.forward(s.final_x, ctx);
  ScopedOpTimer t(ctx.times, &OpTimes::loss);
  Tensor losses = Tensor::empty({n});
  s.lse = Tensor::empty({n});
  cpu::cross_entropy_forward(s.logits.data<float>(), s.labels_sb.data(), losses.data<float>(), s.lse.data<float>(), n,
                             V, V);
  LossSums r;
  const float* l = losses.data<float>();
  for (int64_t i = 0; i < n; ++i) {  // fixed order: deterministic
    r.loss_sum += static_cast<double>(l[i]) * s.mask_sb[static_cast<size_t>(i)];
    r.tokens += s.mask_sb[static_cast<size_t>(i)];
  }
  return r;
}

void GPTModel::backward(Saved& s, float loss_grad_scale, PassContext& ctx) {
  const int64_t B = s.B, S = s.S, n = B * S, V = cfg_.vocab_size, h = cfg_.hidden_size;
  Tensor dlogits = Tensor::empty({n, V});
  {
    ScopedOpTimer t(ctx.times, &OpTimes::loss);
    std::vector<float> dloss(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) dloss[static_cast<size_t>(i)] = s.mask_sb[static_cast<size_t>(i)] * loss_grad_scale;
    cpu::cross_entropy_backward(s.logits.data<float>(), s.labels_sb.data(), s.lse.data<float>(), dloss.data(),
                                dlogits.data<float>(), n, V, V);
  }
  s.logits = Tensor();
  Linear out{output_, nullptr, h, V};
  Tensor dx = out.backward(dlogits, s.final_x, ctx);
  dlogits = Tensor();
  dx = final_norm_.backward(dx, s.final_norm, ctx);
  for (size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(dx, S, B, s.layers[i], ctx);
  dx = emb_drop_.backward(dx, s.emb_drop);
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  cpu::embedding_backward(s.ids_sb.data(), dx.data<float>(), word_emb_->grad.data<float>(), n, h);
  if (pos_emb_) {
    float* pg = pos_emb_->grad.data<float>();
    const float* d = dx.data<float>();
    for (int64_t si = 0; si < S; ++si)
      for (int64_t b = 0; b < B; ++b) cpu::add_inplace(pg + si * h, d + (si * B + b) * h, h);
  }
  s = Saved{};
}

Tensor GPTModel::logits(const std::vector<int32_t>& tokens, int64_t B, int64_t S) {
  PassContext ctx;
  ctx.training = false;
  Saved s;
  std::vector<int32_t> ids_sb(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si) ids_sb[static_cast<size_t>(si * B + b)] = tokens[static_cast<size_t>(b * S + si)];
  Tensor x = run_layers(embed(ids_sb, S, B, s, ctx), S, B, s, ctx);
  Linear out{output_, nullptr, cfg_.hidden_size, cfg_.vocab_size};
  Tensor l_sb = out.forward(x, ctx);
  Tensor l = Tensor::empty({B * S, cfg_.vocab_size});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si)
      std::copy_n(l_sb.data<float>() + (si * B + b) * cfg_.vocab_size, cfg_.vocab_size,
                  l.data<float>() + (b * S + si) * cfg_.vocab_size);
  return l;
}

}  // namespace mt::model
