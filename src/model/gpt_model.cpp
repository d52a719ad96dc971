#include "model/gpt_model.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/profiler.h"
#include "model/vocab_parallel.h"

namespace mt::model {

namespace {

// The transformer layer's linears in FP8 (Transformer Engine's default recipe covers these and
// no others): QKV, projection, fc1 and fc2, or an MoE layer's experts and shared expert. The
// experts' amaxes are their own rank's (their weights are whole unless expert TP splits them).
void attach_fp8(TransformerLayer& l, Fp8Store& store) {
  // --fp8-param-gather: the dense linears' weights are cast and gathered by the distributed
  // optimizer (parallel/fp8_param_gather.h); routed experts keep the cast per step (theirs
  // all-gather over expert DP, beside the dense buckets).
  auto attach = [&](Linear& lin, const TensorParallel* tp) {
    lin.fp8 = make_fp8_linear(store, lin.weight->name, tp);
    if (!store.config().param_gather || lin.weight->expert) return;
    lin.fp8.state->param_gathered = true;
    lin.weight->fp8_gathered = &lin.fp8;
  };
  for (Linear* lin : {&l.attn.qkv, &l.attn.proj}) attach(*lin, lin->tp);
  if (!l.is_moe) {
    for (Linear* lin : {&l.mlp.fc1, &l.mlp.fc2}) attach(*lin, lin->tp);
    return;
  }
  for (auto* group : {&l.moe.experts.fc1, &l.moe.experts.fc2})
    for (Linear& lin : *group) {
      attach(lin, nullptr);
      lin.fp8.state->group_amax = false;
    }
  if (l.moe.has_shared)
    for (Linear* lin : {&l.moe.shared.fc1, &l.moe.shared.fc2}) attach(*lin, lin->tp);
}

}  // namespace

Fp8Store& GPTModel::fp8_store() {
  if (!fp8_) fp8_ = std::make_unique<Fp8Store>(cfg_.fp8);
  return *fp8_;
}

GPTModel::GPTModel(const TransformerConfig& cfg, const ModelOptions& opts) : cfg_(cfg) {
  cfg_.finalize();
  tp_.comm = opts.tp;
  tp_.sequence_parallel = opts.sequence_parallel;
  tp_.overlap_comm = opts.tp_comm_overlap && tp_.sp();
  expert_ = opts.expert;
  cp_ = opts.cp;
  if (tp_.on()) check_tensor_parallel(cfg_, tp_.size(), tp_.sp());
  const PipelinePart& part = opts.pipeline;
  auto ranges = part.chunks;
  if (ranges.empty()) ranges = {{0, cfg_.num_layers}};
  const int64_t h = cfg_.hidden_size;
  if (part.first_stage) {
    word_emb_ =
        &params_.add("embedding.word_embeddings.weight", {cfg_.vocab_size, h}, Init::Normal, true, tp_.split(0));
    if (cfg_.position_embedding_type == "learned_absolute") {
      pos_emb_ = &params_.add("embedding.position_embeddings.weight", {cfg_.max_position_embeddings, h}, Init::Normal,
                              true);
      pos_emb_->sequence_parallel = tp_.sp();  // added on sequence shards under SP
    }
  }
  if (cfg_.rope()) {
    rope_.build(cfg_.seq_length, cfg_.rotary_dim(), cfg_);
    rope_host_cos_ = rope_.cos;  // shared until to_device moves rope_
    rope_host_sin_ = rope_.sin;
  }
  size_t total = 0;
  for (auto [b, e] : ranges) {
    MT_CHECK(0 <= b && b <= e && e <= cfg_.num_layers, "layer range [{}, {}) outside {} layers", b, e, cfg_.num_layers);
    total += static_cast<size_t>(e - b);
  }
  layers_.resize(total);  // built in place: layers keep pointers into themselves
  size_t k = 0;
  for (size_t c = 0; c < ranges.size(); ++c) {
    Chunk ch{k, k + static_cast<size_t>(ranges[c].second - ranges[c].first), c == 0 && part.first_stage,
             c + 1 == ranges.size() && part.last_stage};
    for (int64_t i = ranges[c].first; i < ranges[c].second; ++i) {  // global index in the name
      layers_[k].build(params_, i, cfg_, cfg_.rope() ? &rope_ : nullptr, &tp_, &expert_);
      if (cfg_.fp8.layer_in_fp8(i, cfg_.num_layers)) attach_fp8(layers_[k], fp8_store());
      ++k;
    }
    configure_recompute(&layers_[ch.first], ch.last - ch.first, cfg_);  // per chunk, as Megatron's blocks
    chunks_.push_back(ch);
  }
  if (part.last_stage) {
    final_norm_.build(params_, "decoder.final_layernorm", cfg_, &tp_);
    if (cfg_.untie_embeddings_and_output_weights) {
      output_ = &params_.add("output_layer.weight", {cfg_.vocab_size, h}, Init::Normal, true, tp_.split(0));
      output_->gemm_only_grad = true;  // untied: only the output layer's weight GEMM writes it
    } else if (part.first_stage) {
      output_ = word_emb_;
    } else {
      // The last stage's copy of the tied embedding: same name, so the same init stream and the
      // same checkpoint entry as the first stage's.
      output_ =
          &params_.add("embedding.word_embeddings.weight", {cfg_.vocab_size, h}, Init::Normal, true, tp_.split(0));
      output_->shared_embedding = output_->replica = true;
    }
  }
  if (word_emb_ && !part.last_stage && !cfg_.untie_embeddings_and_output_weights) word_emb_->shared_embedding = true;
  for (Param* p : {word_emb_, output_})
    if (p) p->embedding_or_output = true;
  emb_drop_.p = cfg_.hidden_dropout;
  emb_drop_.tp_region = tp_.sp();
  params_.allocate(cfg_.half(), opts.layout);
  params_.initialize(cfg_.seed, cfg_.init_method_std, cfg_.num_layers);
}

namespace {
// Rows [r0, r0 + n) of the pass's learned-position ids, or undefined when positions are 0..S-1.
Tensor position_rows(const GPTModel::Saved& s, int64_t r0, int64_t n) {
  if (!s.seq || !s.seq->position_ids.defined()) return Tensor();
  return s.seq->position_ids.slice(r0, n);
}
}  // namespace

std::shared_ptr<const SequenceLayout> GPTModel::layout(const Batch& batch) const {
  const bool docs = !batch.cu_seqlens.empty(), reset = !batch.position_ids.empty();
  if (!cp_.on() && !docs && !reset) return nullptr;
  const int64_t B = batch.B, S = batch.S;
  auto L = std::make_shared<SequenceLayout>();
  L->B = B;
  L->S = S;
  L->S_local = S / cp_.size();
  if (cp_.on()) L->cp = &cp_;
  if (docs) {
    const auto& cu = batch.cu_seqlens;
    MT_CHECK(cu.front() == 0 && cu.back() == B * S && std::is_sorted(cu.begin(), cu.end()),
             "cu_seqlens must rise from 0 to B*S = {}", B * S);
    L->cu_host = cu;
    L->cu_seqlens = upload(cu);
  }
  // This rank's tokens (storage order) and their positions.
  std::vector<int32_t> local = cp_.on() ? cp_positions(S, cp_.size(), cp_.rank()) : std::vector<int32_t>();
  if (local.empty())
    for (int32_t i = 0; i < S; ++i) local.push_back(i);
  auto position = [&](int64_t b, int64_t i) {
    const int32_t t = local[static_cast<size_t>(i)];
    return reset ? batch.position_ids[static_cast<size_t>(b * S + t)] : t;
  };
  const int64_t Sl = L->S_local;
  // Positions that differ between samples need a table row per token (on the GPU, RoPE then
  // runs per sample: SelfAttention::rotate).
  const bool per_sample = reset && B > 1;
  if (cfg_.rope()) {
    // The rows of the host tables (the device's may be elsewhere), uploaded as this pass's.
    const int64_t half = rope_host_cos_.dim(1);
    std::vector<float> cos, sin;
    for (int64_t b = 0; b < (per_sample ? B : 1); ++b)
      for (int64_t i = 0; i < Sl; ++i) {
        const int64_t r = position(b, i);
        cos.insert(cos.end(), rope_host_cos_.data<float>() + r * half, rope_host_cos_.data<float>() + (r + 1) * half);
        sin.insert(sin.end(), rope_host_sin_.data<float>() + r * half, rope_host_sin_.data<float>() + (r + 1) * half);
      }
    // [B, S_local, rot/2] when per sample: the RoPE ops then read a table per sample.
    const Shape shape = per_sample ? Shape{B, Sl, half} : Shape{Sl, half};
    L->rope_cos = upload(cos).view(shape);
    L->rope_sin = upload(sin).view(shape);
  }
  if (pos_emb_) {
    std::vector<int32_t> sb(static_cast<size_t>(Sl * B));
    for (int64_t i = 0; i < Sl; ++i)
      for (int64_t b = 0; b < B; ++b) sb[static_cast<size_t>(i * B + b)] = position(b, i);
    L->position_ids = upload(sb);
  }
  return L;
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
  s.ids = upload(ids_sb);
  Tensor x;
  if (tp_.on()) {
    // Vocab-parallel lookup, summed over TP (reduce-scattered to this rank's sequence shard
    // under SP); position embeddings are then added to the rows this rank holds. On the GPU the
    // sum is in bf16, exact here: each row is non-zero on one rank only.
    x = vocab_parallel_embedding_forward(s.ids, word_emb_->value, tp_);
    if (tp_.sp()) x = reduce_scatter_rows(x, tp_);
    else all_reduce_tp(x, tp_);
    if (pos_emb_) {
      const int64_t s_local = tp_.sp() ? S / tp_.size() : S;
      if (const Tensor ids = position_rows(s, tp_.sp() ? tp_.rank() * s_local * B : 0, s_local * B); ids.defined())
        ops::add_inplace(x, ops::embedding_forward(ids, pos_emb_->value));
      else
        ops::add_position_embedding(x, pos_emb_->value.slice(tp_.sp() ? tp_.rank() * s_local : 0, s_local), s_local, B);
    }
  } else {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    x = ops::embedding_forward(s.ids, word_emb_->value);
    if (pos_emb_) {
      if (const Tensor ids = position_rows(s, 0, S * B); ids.defined())
        ops::add_inplace(x, ops::embedding_forward(ids, pos_emb_->value));
      else
        ops::add_position_embedding(x, pos_emb_->value, S, B);
    }
  }
  Tensor y = emb_drop_.forward(x, s.emb_drop, ctx);
  if (cfg_.half() != Half::None) {
    if (y.raw() == x.raw()) y = x;
    round_to_half_inplace(y, cfg_.half());
  }
  return y;
}

Tensor GPTModel::run_layers(Tensor x, const Chunk& ch, int64_t S, int64_t B, Saved& s, PassContext& ctx) {
  s.layers.resize(ch.last - ch.first);
  for (size_t i = ch.first; i < ch.last; ++i) {
    const ops::NvtxRange range("layer {} forward", layers_[i].number);
    x = layers_[i].forward(x, S, B, s.layers[i - ch.first], ctx);
  }
  return x;
}

LossSums GPTModel::forward(const Batch& batch, Saved& s, PassContext& ctx) {
  MT_CHECK(chunks_.size() == 1 && chunks_[0].embedding && chunks_[0].head,
           "GPTModel::forward runs the whole model; a pipeline stage runs forward_chunk");
  LossSums r;
  forward_chunk(0, batch, Tensor(), s, ctx, &r);
  return r;
}

void GPTModel::backward(Saved& s, float loss_grad_scale, PassContext& ctx) {
  backward_chunk(0, s, Tensor(), loss_grad_scale, ctx);
}

Tensor GPTModel::forward_chunk(int c, const Batch& batch, const Tensor& input, Saved& s, PassContext& ctx,
                               LossSums* loss) {
  MT_CHECK(c >= 0 && c < num_chunks(), "no model chunk {} on this rank ({} chunks)", c, num_chunks());
  const Chunk& ch = chunks_[static_cast<size_t>(c)];
  const int64_t B = batch.B, S_full = batch.S;
  if (S_full > cfg_.seq_length) fail("micro-batch sequence length {} exceeds --seq-length {}", S_full, cfg_.seq_length);
  if (cp_.on() && S_full % (2 * cp_.size()) != 0)
    fail("--context-parallel-size {}: the sequence length {} must be divisible by 2 x CP = {} (Megatron's load-balanced "
         "chunks)",
         cp_.size(), S_full, 2 * cp_.size());
  const int64_t S = S_full / cp_.size(), n = B * S;  // this rank's tokens per sample
  if (tp_.sp() && S % tp_.size() != 0)
    fail("--sequence-parallel: sequence length {} (per context-parallel rank) is not divisible by "
         "--tensor-model-parallel-size {}",
         S, tp_.size());
  s.B = B;
  s.S = S;
  s.seq = layout(batch);
  ctx.seq = s.seq;
  const std::vector<int32_t> local = cp_.on() ? cp_positions(S_full, cp_.size(), cp_.rank()) : std::vector<int32_t>();
  // The data's [b, s] order to the model's [s, b] order, for what this chunk reads (this rank's
  // chunks of the sequence under CP).
  auto to_sb = [&](const auto& src, auto& dst) {
    dst.resize(static_cast<size_t>(n));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t si = 0; si < S; ++si) {
        const int64_t t = local.empty() ? si : local[static_cast<size_t>(si)];
        dst[static_cast<size_t>(si * B + b)] = src[static_cast<size_t>(b * S_full + t)];
      }
  };
  Tensor x;
  if (ch.embedding) {
    to_sb(batch.tokens, s.ids_sb);
    x = embed(s.ids_sb, S, B, s, ctx);
  } else {
    MT_CHECK(input.numel() == activation_rows(B, S_full) * cfg_.hidden_size,
             "chunk {} input of {} elements, expected {} x {}", c, input.numel(), activation_rows(B, S_full),
             cfg_.hidden_size);
    x = input;
  }
  x = run_layers(x, ch, S, B, s, ctx);
  if (!ch.head) return x;
  for (int32_t l : batch.labels)
    if (l < 0 || l >= cfg_.vocab_size) fail("label id {} outside the vocabulary", l);
  to_sb(batch.labels, s.labels_sb);
  to_sb(batch.loss_mask, s.mask_sb);
  LossSums r = head_forward(x, s, ctx);
  if (loss) *loss = r;
  return Tensor();
}

LossSums GPTModel::head_forward(const Tensor& x, Saved& s, PassContext& ctx) {
  s.final_x = final_norm_.forward(x, s.final_norm, ctx);
  if (fused_cpu_head(ctx)) return head_forward_cpu(s, ctx);
  s.logits = output_linear().forward(s.final_x, ctx);
  ScopedOpTimer t(ctx.times, &OpTimes::loss);
  s.labels = upload(s.labels_sb);
  Tensor losses;
  if (tp_.on()) {
    vocab_parallel_cross_entropy_forward(s.logits, s.labels, tp_, losses, s.lse);
  } else if (device_ != Device::CPU && ctx.loss_grad_scale) {
    // Training with the backward's scale known: the loss and dlogits = mask * scale * (softmax -
    // onehot) in one pass over the logits, written over them (the backward reads only dlogits).
    s.mask = upload(s.mask_sb);
    s.grad_scale = *ctx.loss_grad_scale;
    s.logits = ops::cross_entropy_fused(s.logits, s.labels, ops::scaled_mask(s.mask, s.grad_scale), losses, s.lse);
    s.logits_are_grad = true;
  } else {
    ops::cross_entropy_forward(s.logits, s.labels, losses, s.lse);
  }
  return loss_sums(losses, s);
}

LossSums GPTModel::loss_sums(const Tensor& losses, Saved& s) {
  const int64_t n = s.B * s.S;
  // The token count comes from the host mask. The loss sum goes into this micro-batch's result on
  // the CPU; on the GPU it stays in the device accumulator until collect_device_loss(), so
  // nothing here waits for the device.
  if (!s.mask.defined()) s.mask = upload(s.mask_sb);
  LossSums r;
  for (int64_t i = 0; i < n; ++i) r.tokens += s.mask_sb[static_cast<size_t>(i)];
  Tensor acc = device_ == Device::CPU ? Tensor::zeros({1}, DType::I64) : loss_acc_;
  ops::accumulate_masked_loss(losses, s.mask, acc);
  if (device_ == Device::CPU) std::memcpy(&r.loss_sum, acc.raw(), sizeof r.loss_sum);
  return r;
}

Tensor GPTModel::backward_chunk(int c, Saved& s, const Tensor& dy, float loss_grad_scale, PassContext& ctx) {
  MT_CHECK(c >= 0 && c < num_chunks(), "no model chunk {} on this rank ({} chunks)", c, num_chunks());
  const Chunk& ch = chunks_[static_cast<size_t>(c)];
  ctx.seq = s.seq;  // recomputed forwards see the layout of their micro-batch
  Tensor dx = ch.head ? head_backward(s, loss_grad_scale, ctx) : dy;
  MT_CHECK(dx.defined(), "backward of chunk {} without the gradient of its output", c);
  for (size_t i = ch.last; i-- > ch.first;) {
    const ops::NvtxRange range("layer {} backward", layers_[i].number);
    dx = layers_[i].backward(dx, s.S, s.B, s.layers[i - ch.first], ctx);
  }
  join_deferred_expert_grads(ctx);  // before the pass ends, anything reads the expert gradients
  if (ch.embedding) {
    embedding_backward(dx, s, ctx);
    dx = Tensor();
  }
  s = Saved{};
  return dx;
}

Tensor GPTModel::head_backward(Saved& s, float loss_grad_scale, PassContext& ctx) {
  Tensor dx;
  if (s.head_dx.defined()) {  // formed in the forward (fused CPU head)
    MT_CHECK(loss_grad_scale == s.grad_scale,
             "head backward with loss gradient scale {} after a forward that formed the gradient for {}",
             loss_grad_scale, s.grad_scale);
    dx = std::move(s.head_dx);
    if (output_linear().report_weight_grad) ctx.grad_ready(output_);
  } else {
    dx = output_layer_backward(s, loss_grad_scale, ctx);
  }
  Tensor dy = final_norm_.backward(dx, s.final_norm, ctx);
  if (cfg_.fp16) round_to_half_inplace(dy, Half::FP16);  // the residual stream's gradient, as in the layers
  return dy;
}

Tensor GPTModel::output_layer_backward(Saved& s, float loss_grad_scale, PassContext& ctx) {
  Tensor dlogits;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::loss);
    if (s.logits_are_grad) {  // formed in the forward (fused cross-entropy)
      MT_CHECK(loss_grad_scale == s.grad_scale,
               "head backward with loss gradient scale {} after a forward that formed the gradient for {}",
               loss_grad_scale, s.grad_scale);
      dlogits = s.logits;
    } else {
      const Tensor dloss = ops::scaled_mask(s.mask, loss_grad_scale);  // from the mask uploaded in forward
      dlogits = tp_.on() ? vocab_parallel_cross_entropy_backward(s.logits, s.labels, s.lse, dloss, tp_)
                         : ops::cross_entropy_backward(s.logits, s.labels, s.lse, dloss);
    }
    if (cfg_.fp16) round_to_half_inplace(dlogits, Half::FP16);  // fp16 logits have fp16 gradients
  }
  s.logits = Tensor();
  return output_linear().backward(dlogits, s.final_x, ctx);
}

void GPTModel::embedding_backward(const Tensor& dx_in, Saved& s, PassContext& ctx) {
  const int64_t B = s.B, S = s.S;
  Tensor dx = emb_drop_.backward(dx_in, s.emb_drop);
  if (tp_.on()) {
    if (pos_emb_) {
      const int64_t s_local = tp_.sp() ? S / tp_.size() : S;
      if (const Tensor ids = position_rows(s, tp_.sp() ? tp_.rank() * s_local * B : 0, s_local * B); ids.defined()) {
        ops::embedding_backward(ids, dx, pos_emb_->grad);
      } else {
        Tensor pg = pos_emb_->grad.slice(tp_.sp() ? tp_.rank() * s_local : 0, s_local);
        ops::position_embedding_backward(dx, pg, s_local, B);
      }
    }
    Tensor dfull = tp_.sp() ? all_gather_rows(dx, tp_) : dx;
    vocab_parallel_embedding_backward(s.ids, dfull, word_emb_->grad, tp_);
  } else {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::embedding_backward(s.ids, dx, word_emb_->grad);
    if (pos_emb_) {
      if (const Tensor ids = position_rows(s, 0, S * B); ids.defined()) ops::embedding_backward(ids, dx, pos_emb_->grad);
      else ops::position_embedding_backward(dx, pos_emb_->grad, S, B);
    }
  }
  ctx.grad_ready(pos_emb_);
  ctx.grad_ready(word_emb_);
}

Tensor GPTModel::logits(const std::vector<int32_t>& tokens, int64_t B, int64_t S) {
  MT_CHECK(!tp_.on(), "inference logits with tensor parallelism are not offered yet");
  MT_CHECK(chunks_.size() == 1 && chunks_[0].embedding && chunks_[0].head,
           "inference logits need the whole model (no pipeline split)");
  PassContext ctx;
  ctx.training = false;
  Saved s;
  std::vector<int32_t> ids_sb(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si) ids_sb[static_cast<size_t>(si * B + b)] = tokens[static_cast<size_t>(b * S + si)];
  Tensor x = run_layers(embed(ids_sb, S, B, s, ctx), chunks_[0], S, B, s, ctx);
  Tensor l_sb = output_linear().forward(final_norm_.forward(x, s.final_norm, ctx), ctx);
  if (l_sb.device() != Device::CPU) l_sb = l_sb.to_device(Device::CPU).to(DType::F32);
  Tensor l = Tensor::empty({B * S, cfg_.vocab_size});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t si = 0; si < S; ++si)
      std::copy_n(l_sb.data<float>() + (si * B + b) * cfg_.vocab_size, cfg_.vocab_size,
                  l.data<float>() + (b * S + si) * cfg_.vocab_size);
  return l;
}

void GPTModel::to_device(Device d) {
  if (d == device_) return;
  params_.to_device(d);
  if (fp8_) fp8_->to_device(d);
  if (rope_.cos.defined()) {
    rope_.cos = rope_.cos.to_device(d);
    rope_.sin = rope_.sin.to_device(d);
  }
  loss_acc_ = d == Device::CPU ? Tensor() : Tensor::zeros({1}, DType::I64, d);
  device_ = d;
}

double GPTModel::collect_device_loss() {
  if (device_ == Device::CPU || !loss_acc_.defined()) return 0.0;
  double v = 0.0;
  // The copy hook waits for the compute stream, where the accumulating kernels ran; the zeroing
  // is ordered on that stream before any later head forward.
  device_copy(&v, Device::CPU, loss_acc_.raw(), loss_acc_.device(), sizeof v);
  device_zero(loss_acc_.raw(), loss_acc_.device(), sizeof v);
  return v;
}

template <typename T>
Tensor GPTModel::upload(const std::vector<T>& v) const {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>, "uploads are f32 or i32");
  const int64_t n = static_cast<int64_t>(v.size());
  return ops::upload(v.data(), {n}, std::is_same_v<T, float> ? DType::F32 : DType::I32, device_);
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
  check_query_groups_tp(c, tp);  // whole query groups per rank, or (TP > groups) replicated ones
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
