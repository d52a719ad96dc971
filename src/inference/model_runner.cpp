#include "inference/model_runner.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "model/gpt_model.h"
#include "model/tensor_parallel.h"
#include "model/vocab_parallel.h"

namespace mt::inference {

using model::Norm;
using model::PassContext;

ModelRunner::ModelRunner(model::GPTModel& m, int64_t slots, int64_t max_len, bool cuda_graphs, bool small_rows_gemv)
    : m_(m),
      slots_(slots),
      max_len_(max_len),
      vocab_(m.config().orig_vocab_size),
      device_(m.device()),
      gemv_(small_rows_gemv) {
  // A switch set to "0" in the environment (every switch below is on unless so).
  auto off = [](const char* name) {
    const char* e = std::getenv(name);
    return e && std::strcmp(e, "0") == 0;
  };
  // The decode kernels (ops::DecodeKernels, kernels/device.h) for this runner's passes: on by
  // default since session 16 (H200, llama-1.5b batch 1 with graphs: 1.704 -> 1.454 ms per token);
  // MT_DECODE_FUSED=0 runs the general kernels. Read here, not per step, so that one process
  // (bench/generate_bench.cpp) can build a runner of each kind.
  decode_kernels_ = !off("MT_DECODE_FUSED");
  // The decode graphs' temporaries in an arena of their own, so that the captures have no memory
  // nodes (ops::DeviceArena): on by default since session 16, when with the fusions it saved the
  // host gap between replays (H200, batch 1: 1.188 -> 1.162 ms per token); MT_DECODE_ARENA=0
  // captures with the pool's memory nodes.
  arena_ = !off("MT_DECODE_ARENA");
  // The decode fusions (fused_linear_forward, fused_qkv_forward, qkv_split_to_cache, the attention's
  // split merge): part of the decode kernels on the GEMV; MT_DECODE_FUSIONS=0 leaves them out
  // alone (A/B runs).
  fusions_ = decode_kernels_ && small_rows_gemv && device_ == Device::CUDA && !off("MT_DECODE_FUSIONS");
  // The whole-stack decode kernel (ops::decode_layer_stack, kernels/cuda/decode_stack.cu): one
  // kernel for every layer of a batch-1 decode step, the same bits as the fused layers one by
  // one. Opt-in (MT_DECODE_STACK=1): on an H200 at llama-1.5b's shape it measured 1.09-1.10 ms of
  // GPU time per token against the layers' 0.96 (session 18; docs/decode_batch1_accounting.md).
  // On the CPU the op is the ops it fuses, one by one: the same logits, and CI's check of how the
  // runner hands the layers to it (DecodeStack.CpuRunnerGivesTheLayersLogits).
  const char* st = std::getenv("MT_DECODE_STACK");
  stack_ = (fusions_ || device_ == Device::CPU) && st && std::strcmp(st, "1") == 0;
  // MT_GEMV_KERNEL=wide|base: the GEMV kernel (kernels/device.h, InferenceGemv), for A/B runs.
  if (const char* k = std::getenv("MT_GEMV_KERNEL"); k && *k) {
    if (std::strcmp(k, "base") == 0) gemv_kernel_ = ops::InferenceGemv::Kernel::Base;
    else if (std::strcmp(k, "wide") != 0) fail("MT_GEMV_KERNEL={}: expected wide or base", k);
  }
  const auto& c = m.config();
  // Tensor parallelism: each rank runs its heads and its ffn and vocabulary shards, and caches its
  // own key/value groups; every rank gets the whole logits (gathered), so all ranks pick the same
  // tokens and stay in step. Whole groups per rank (no KV replication), no sequence split.
  const model::TensorParallel& tp = m.tensor_parallel();
  if (tp.sp()) fail("generation runs without --sequence-parallel (each rank needs every token's rows)");
  if (tp.on() && c.num_query_groups % tp.size() != 0)
    fail("generation with --tensor-model-parallel-size {} needs it to divide the {} query groups (each rank caches "
         "whole key/value groups)",
         tp.size(), c.num_query_groups);
  if (!m.word_embedding() || m.layers().size() != static_cast<size_t>(c.num_layers))
    fail("generation needs the whole model on one rank (no pipeline split)");
  MT_CHECK(slots >= 1 && max_len >= 1, "KV cache of {} slots x {} tokens", slots, max_len);
  if (m.position_embedding() && max_len > c.max_position_embeddings)
    fail("a context of {} tokens exceeds the model's {} learned positions (--max-position-embeddings)", max_len,
         c.max_position_embeddings);
  // The cache holds activations: the compute copy's dtype on the GPU, fp32 on the CPU.
  const DType dt = device_ == Device::CPU ? DType::F32 : m.word_embedding()->value.dtype();
  const int64_t G = c.num_query_groups / tp.size(), D = c.kv_channels;
  checked_product({c.num_layers, 2, slots, G, max_len, D, static_cast<int64_t>(dtype_size(dt))}, "KV cache bytes");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_cache_.push_back(Tensor::zeros({slots, G, max_len, D}, dt, device_));
    v_cache_.push_back(Tensor::zeros({slots, G, max_len, D}, dt, device_));
  }
  if (c.rope()) rope_.build(max_len, c.rotary_dim(), c);
  // Not under TP: the collectives would have to be captured too.
  graphs_on_ = cuda_graphs && device_ == Device::CUDA && c.moe.num_experts == 0 && !tp.on();
}

template <typename T>
Tensor ModelRunner::upload(const std::vector<T>& v) const {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>, "uploads are f32 or i32");
  return ops::upload(v.data(), {static_cast<int64_t>(v.size())}, std::is_same_v<T, float> ? DType::F32 : DType::I32,
                     device_);
}

// As TransformerLayer::forward_layer in evaluation (no dropout), with the attention core over the
// cache: the same modules, the same residual fusions.
Tensor ModelRunner::layer_forward(size_t li, const Tensor& x, const Inputs& in) {
  const Tensor &slot = in.slot, &pos = in.pos, &cos = in.cos, &sin = in.sin;
  const model::TransformerLayer& L = m_.layers()[li];
  const model::SelfAttention& A = L.attn;
  const auto& c = m_.config();
  const int64_t N = x.dim(0), G = c.num_query_groups / m_.tensor_parallel().size(), D = c.kv_channels;
  PassContext ctx;
  ctx.training = false;
  Tensor q, k, v;
  // RoPE inside the split where nothing runs between them (no qk-norm), as the training forward.
  const bool fused = A.rope && !c.qk_layernorm;
  const ops::RopeRef rope = fused ? ops::RopeRef{&cos, &sin, rope_.rot_dim} : ops::RopeRef{};
  // The decode fusions: k and v straight into the cache (no qk-norm between), and the input
  // norm inside the QKV GEMV where it is RMSNorm; both: norm, product, RoPE and split in one GEMV.
  const bool to_cache = !c.qk_layernorm && fusions_ && !in.fresh_prompt;
  const bool norm_in_gemv = L.input_norm.rms && fusable(A.qkv, in);
  const Tensor* qkv_bias = A.qkv.bias ? &A.qkv.bias->value : nullptr;
  const Tensor in_scale = norm_in_gemv ? L.input_norm.scale() : Tensor();
  const ops::LinearFusion in_norm{&in_scale, L.input_norm.eps};
  if (to_cache && norm_in_gemv) {
    q = ops::fused_qkv_forward(x, A.qkv.weight->value, qkv_bias, in_norm, k_cache_[li], v_cache_[li], slot, pos, G,
                               c.q_per_group(), D, rope);
  } else {
    Norm::Saved ns;
    const Tensor qkv = norm_in_gemv ? ops::fused_linear_forward(x, A.qkv.weight->value, qkv_bias, in_norm)
                                    : A.qkv.forward(L.input_norm.forward(x, ns, ctx), ctx);
    if (to_cache) {
      q = ops::qkv_split_to_cache(qkv, k_cache_[li], v_cache_[li], slot, pos, G, c.q_per_group(), D, rope);
    } else {
      ops::qkv_split(qkv, q, k, v, N, 1, G, c.q_per_group(), D, rope);
      if (c.qk_layernorm) {
        Norm::Saved qs, ks;
        q = A.q_norm.forward(q.view({-1, D}), qs, ctx).view(q.shape());
        k = A.k_norm.forward(k.view({-1, D}), ks, ctx).view(k.shape());
      }
      if (A.rope && !fused) {
        ops::rope_forward(q, cos, sin, rope_.rot_dim);
        ops::rope_forward(k, cos, sin, rope_.rot_dim);
      }
      ops::kv_cache_write(k_cache_[li], v_cache_[li], k, v, slot, pos);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensor core;
  if (in.fresh_prompt) {  // the rows see only each other: q, k, v as they are, causal
    const int64_t Hq = q.dim(1);
    ops::AttentionShape p{1, Hq, G, N, D, scale};
    core = Tensor::empty({N, Hq * D}, q.dtype(), q.device());
    Tensor lse = Tensor::empty({1, Hq, N}, DType::F32, q.device());
    ops::attention_forward_rows(p, q, k, v, core, lse);
  } else {
    core = ops::cached_attention(q, k_cache_[li], v_cache_[li], slot, pos, scale);
  }
  Tensor h;
  if (A.proj.fuses_residual()) {
    h = A.proj.forward(core, ctx, &x);
  } else {
    h = A.proj.forward(core, ctx);
    ops::add_inplace(h, x);
  }
  // The pre-MLP norm and SwiGLU inside linear_fc1's GEMV, the residual in linear_fc2's.
  if (!L.is_moe && c.swiglu && L.pre_mlp_norm.rms && L.mlp.fc2.fuses_residual() && fusable(L.mlp.fc1, in) &&
      fusable(L.mlp.fc2, in)) {
    const Tensor mlp_scale = L.pre_mlp_norm.scale();
    const Tensor a = ops::fused_linear_forward(h, L.mlp.fc1.weight->value,
                                               L.mlp.fc1.bias ? &L.mlp.fc1.bias->value : nullptr,
                                               {&mlp_scale, L.pre_mlp_norm.eps, true});
    return L.mlp.fc2.forward(a, ctx, &h);
  }
  Norm::Saved ns2;
  const Tensor hn = L.pre_mlp_norm.forward(h, ns2, ctx);
  if (!L.is_moe && L.mlp.fc2.fuses_residual()) {
    model::MLP::Saved ms;
    return L.mlp.forward(hn, ms, ctx, &h);
  }
  Tensor y;
  if (L.is_moe) {
    model::MoELayer::Saved ms;
    y = L.moe.forward(hn, 1, ms, ctx);
  } else {
    model::MLP::Saved ms;
    y = L.mlp.forward(hn, ms, ctx);
  }
  ops::add_inplace(y, h);
  return y;
}

Tensor ModelRunner::stack_forward(const Tensor& x, const Inputs& in) {
  const auto& c = m_.config();
  if (!stack_ || in.fresh_prompt || x.dim(0) != 1 || c.qk_layernorm || !c.swiglu) return Tensor();
  // What layer_forward would run: the QKV fusion into the cache, the residual inside proj's and
  // fc2's GEMVs, the pre-MLP norm and SwiGLU inside fc1's; each linear the plain product (no TP
  // split, no FP8), on the GPU the GEMV with its fusions. One RoPE (or none) for every layer: the
  // op takes one.
  auto fits = [&](const model::Linear& l) {
    return l.mode == model::ParallelMode::None && !l.fp8.on() && (device_ == Device::CPU || fusable(l, in));
  };
  const bool rope = m_.layers().front().attn.rope != nullptr;
  for (const model::TransformerLayer& L : m_.layers())
    if (L.is_moe || (L.attn.rope != nullptr) != rope || !L.input_norm.rms || !L.pre_mlp_norm.rms ||
        !L.attn.proj.fuses_residual() || !L.mlp.fc2.fuses_residual() || !fits(L.attn.qkv) || !fits(L.attn.proj) ||
        !fits(L.mlp.fc1) || !fits(L.mlp.fc2))
      return Tensor();
  const int64_t D = c.kv_channels;
  std::vector<Tensor> scales;  // the norms' scales, alive for the call
  scales.reserve(2 * m_.layers().size());
  ops::DecodeStackRef s;
  s.G = c.num_query_groups;
  s.qpg = c.q_per_group();
  s.D = D;
  s.slot = &in.slot;
  s.pos = &in.pos;
  s.scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (rope) s.rope = {&in.cos, &in.sin, rope_.rot_dim};
  for (size_t li = 0; li < m_.layers().size(); ++li) {
    const model::TransformerLayer& L = m_.layers()[li];
    scales.push_back(L.input_norm.scale());
    scales.push_back(L.pre_mlp_norm.scale());
    ops::DecodeLayerRef r;
    r.input_norm = &scales[scales.size() - 2];
    r.input_eps = L.input_norm.eps;
    r.qkv_w = &L.attn.qkv.weight->value;
    r.qkv_b = L.attn.qkv.bias ? &L.attn.qkv.bias->value : nullptr;
    r.proj_w = &L.attn.proj.weight->value;
    r.mlp_norm = &scales.back();
    r.mlp_eps = L.pre_mlp_norm.eps;
    r.fc1_w = &L.mlp.fc1.weight->value;
    r.fc1_b = L.mlp.fc1.bias ? &L.mlp.fc1.bias->value : nullptr;
    r.fc2_w = &L.mlp.fc2.weight->value;
    r.k_cache = &k_cache_[li];
    r.v_cache = &v_cache_[li];
    s.layers.push_back(r);
  }
  ++stack_steps_;
  return ops::decode_layer_stack(x, s);
}

// A decode step's graph at one row count: its inputs and output live in fixed buffers, which
// each step refills before the replay.
struct ModelRunner::Graph {
  bool warmed = false;  // one eager step at this count ran (GEMM plans made)
  Inputs in;
  Tensor logits;
  Tensor ids;  // the replay's greedy ids, I32 [rows] (argmax_rows inside the graph)
  int64_t arena_bytes = 0;                 // what the eager step's tensors took (MT_DECODE_ARENA)
  std::unique_ptr<ops::DeviceArena> arena;  // the replays' temporaries: destroyed after the graph
  ops::StreamGraph graph;
};

ModelRunner::~ModelRunner() = default;

bool ModelRunner::fusable(const model::Linear& l, const Inputs& in) const {
  return fusions_ && !in.fresh_prompt && l.mode == model::ParallelMode::None && !l.fp8.on();
}

Tensor ModelRunner::head_forward(const Tensor& x, const Inputs& in) {
  // Only the rows whose next token is wanted go through the head (a decode step: all, in order).
  const Tensor rows = in.all_rows ? x : ops::embedding_forward(in.rows, x);
  const Norm& fn = m_.final_norm();
  const model::Linear& head = m_.output_layer();
  if (fn.rms && fusable(head, in)) {  // the final norm inside the output layer's GEMV
    const Tensor g = fn.scale();
    return ops::fused_linear_forward(rows, head.weight->value, head.bias ? &head.bias->value : nullptr, {&g, fn.eps});
  }
  PassContext ctx;
  ctx.training = false;
  Norm::Saved ns;
  return head.forward(fn.forward(rows, ns, ctx), ctx);
}

Tensor ModelRunner::device_forward(const Inputs& in) {
  // Decode steps' linears: the GEMV (eager and captured alike), in the kernel MT_GEMV_KERNEL picks.
  const ops::InferenceGemv gemv(gemv_, gemv_kernel_);
  const ops::DecodeKernels decode_kernels(decode_kernels_, fusions_);
  const model::TensorParallel& tp = m_.tensor_parallel();
  Tensor x;
  if (tp.on()) {  // the vocabulary-parallel lookup, summed over TP (each row is non-zero on one rank)
    x = model::vocab_parallel_embedding_forward(in.ids, m_.word_embedding()->value, tp);
    model::all_reduce_tp(x, tp);
  } else {
    x = ops::embedding_forward(in.ids, m_.word_embedding()->value);
  }
  if (const model::Param* pe = m_.position_embedding()) ops::add_inplace(x, ops::embedding_forward(in.pos, pe->value));
  if (Tensor y = stack_forward(x, in); y.defined()) {
    x = y;
  } else {
    for (size_t l = 0; l < m_.layers().size(); ++l) x = layer_forward(l, x, in);
  }
  if (in.rows.numel() == 0) return Tensor();  // a prompt chunk that is not the prompt's end
  const Tensor l = head_forward(x, in);
  return tp.on() ? model::all_gather_last_dim(l, tp) : l;  // this rank's vocabulary columns -> all
}

Tensor ModelRunner::graph_forward(const Inputs& in, int64_t N) {
  std::unique_ptr<Graph>& g = graphs_[N];
  if (!g) g = std::make_unique<Graph>();
  if (!g->warmed) {  // eager, once: cuBLASLt picks and caches its plans outside the capture
    g->warmed = true;
    if (!arena_) return device_forward(in);
    Tensor l;
    g->arena_bytes = ops::DeviceArena::tally([&] { l = device_forward(in); });
    return l;
  }
  if (!g->graph.ready()) {
    auto fixed = [](const Tensor& t) { return t.defined() ? Tensor::empty(t.shape(), t.dtype(), t.device()) : Tensor(); };
    g->in = views(fixed(in.ints), fixed(in.floats), N);
    g->in.all_rows = true;  // graphs run decode steps only
    const int64_t Vp = m_.config().vocab_size;
    g->logits = Tensor::empty({N, Vp}, m_.word_embedding()->value.dtype(), device_);
    g->ids = Tensor::empty({N}, DType::I32, device_);
    auto step = [&] {
      Tensor l = device_forward(g->in);
      // The greedy ids too (what step() would launch after the replay, with the same kernel),
      // so that a step is the replay and one 4-byte copy to the host per row.
      {
        const ops::DecodeKernels decode_kernels(decode_kernels_, fusions_);
        ops::copy_into(g->ids, ops::argmax_rows(l, vocab_));
      }
      ops::copy_into(g->logits, l);
    };
    try {
      if (arena_) {
        // The captured step allocates what the eager one did (the same code at the same count);
        // the slack covers a capture-only request, and a miss still works (a memory node).
        g->arena = std::make_unique<ops::DeviceArena>(g->arena_bytes + g->arena_bytes / 16 + (1 << 20));
        g->graph.capture([&] { g->arena->serve(step); });
        if (g->arena->misses() > 0)
          log_warn("decode graph at {} rows: {} allocations did not fit its {} byte arena", N, g->arena->misses(),
                   g->arena->bytes());
      } else {
        g->graph.capture(step);
      }
    } catch (const Error& e) {
      log_warn("decode steps run without CUDA graphs: {}", e.what());
      graphs_on_ = false;
      graphs_.clear();
      return device_forward(in);
    }
    // MT_DECODE_GRAPH_STATS=1: what a replay runs (memory nodes, programmatic edges; issue #22).
    if (const char* st = std::getenv("MT_DECODE_GRAPH_STATS"); st && std::strcmp(st, "1") == 0)
      log_info("decode graph at {} rows (decode kernels {}, arena {}): {}", N, decode_kernels_ ? "fused" : "default",
               g->arena ? std::to_string(g->arena->used()) + " bytes" : std::string("off"), g->graph.census());
  }
  ops::copy_into(g->in.ints, in.ints);
  if (in.floats.defined()) ops::copy_into(g->in.floats, in.floats);
  g->graph.launch();
  ++replays_;
  graph_ids_ = g->ids;
  return g->logits;
}

double ModelRunner::graph_replay_seconds(int64_t rows, int n) {
  const auto it = graphs_.find(rows);
  if (it == graphs_.end() || !it->second->graph.ready() || n <= 0) return 0.0;
  ops::EventTimeline t(1);
  t.mark(-1);  // the span before this boundary is nobody's
  for (int i = 0; i < n; ++i) it->second->graph.launch();
  t.mark(0);
  double s = 0.0;
  t.resolve(&s);
  return s / n;
}

// A pass's inputs as views of its two packed uploads (device_logits): ints holds N ids, slots
// and positions, then the logit rows; floats (RoPE models) N rows of cos, then N of sin.
ModelRunner::Inputs ModelRunner::views(const Tensor& ints, const Tensor& floats, int64_t N) {
  Inputs in;
  in.ints = ints;
  in.floats = floats;
  in.ids = ints.slice(0, N);
  in.slot = ints.slice(N, N);
  in.pos = ints.slice(2 * N, N);
  in.rows = ints.slice(3 * N, ints.numel() - 3 * N);
  if (floats.defined()) {
    const int64_t half = floats.numel() / (2 * N);
    in.cos = floats.slice(0, N * half).view({N, half});
    in.sin = floats.slice(N * half, N * half).view({N, half});
  }
  return in;
}

Tensor ModelRunner::device_logits(const StepBatch& b) {
  const auto& c = m_.config();
  const int64_t N = static_cast<int64_t>(b.tokens.size());
  MT_CHECK(N > 0 && b.slots.size() == b.tokens.size() && b.positions.size() == b.tokens.size(),
           "step batch of {} tokens, {} slots, {} positions", N, b.slots.size(), b.positions.size());
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = b.tokens[static_cast<size_t>(i)], s = b.slots[static_cast<size_t>(i)],
                  p = b.positions[static_cast<size_t>(i)];
    MT_CHECK(t >= 0 && t < c.vocab_size && s >= 0 && s < slots_ && p >= 0 && p < max_len_,
             "step row {}: token {} slot {} position {} outside the model or cache", i, t, s, p);
  }
  for (int32_t r : b.logit_rows) MT_CHECK(r >= 0 && r < N, "logit row {} of {} rows", r, N);
  const int64_t R = static_cast<int64_t>(b.logit_rows.size());
  // Two uploads per pass (each a staged copy, and a graph replay copies each into its fixed
  // buffers): the ids, slots, positions and logit rows together, and the RoPE rows of the
  // tokens' positions (cos, then sin) together.
  std::vector<int32_t> ints;
  ints.reserve(static_cast<size_t>(3 * N + R));
  for (const auto* v : {&b.tokens, &b.slots, &b.positions, &b.logit_rows}) ints.insert(ints.end(), v->begin(), v->end());
  Tensor floats;
  if (c.rope()) {
    const int64_t half = rope_.cos.dim(1);
    std::vector<float> cs(static_cast<size_t>(2 * N * half));
    for (int64_t i = 0; i < N; ++i) {
      const int64_t p = b.positions[static_cast<size_t>(i)];
      std::memcpy(cs.data() + i * half, rope_.cos.data<float>() + p * half, static_cast<size_t>(half) * 4);
      std::memcpy(cs.data() + (N + i) * half, rope_.sin.data<float>() + p * half, static_cast<size_t>(half) * 4);
    }
    floats = upload(cs);
  }
  graph_ids_ = Tensor();
  Inputs in = views(upload(ints), floats, N);
  // One sequence's first N > 1 tokens (never a decode step, whose rows are one per slot).
  in.fresh_prompt = N > 1;
  for (int64_t i = 0; in.fresh_prompt && i < N; ++i)
    in.fresh_prompt = b.slots[static_cast<size_t>(i)] == b.slots[0] && b.positions[static_cast<size_t>(i)] == i;
  // A decode step: every row's logits, in order.
  bool decode = R == N;
  for (int64_t r = 0; decode && r < R; ++r) decode = b.logit_rows[static_cast<size_t>(r)] == r;
  in.all_rows = decode;
  return graphs_on_ && decode ? graph_forward(in, N) : device_forward(in);
}

Tensor ModelRunner::forward(const StepBatch& b) {
  const int64_t R = static_cast<int64_t>(b.logit_rows.size());
  Tensor l = device_logits(b);
  if (R == 0) return Tensor::empty({0, vocab_});
  return host_logits(l);
}

StepOutput ModelRunner::step(const StepBatch& b, bool want_logits) {
  const int64_t R = static_cast<int64_t>(b.logit_rows.size());
  last_logits_ = Tensor();  // freed before this pass allocates its own
  const Tensor l = device_logits(b);
  last_logits_ = l;
  StepOutput out;
  if (R == 0) return out;
  // The greedy ids on the logits' device: R ids to the host instead of R x V logits, which at
  // batch 64 and a 128k vocabulary cost more host time (copy, widen, scan) than the model.
  const ops::DecodeKernels decode_kernels(decode_kernels_, fusions_);
  const Tensor ids = (graph_ids_.defined() ? graph_ids_ : ops::argmax_rows(l, vocab_)).to_device(Device::CPU);
  out.argmax.assign(ids.data<int32_t>(), ids.data<int32_t>() + R);
  if (want_logits) out.logits = host_logits(l);
  return out;
}

std::vector<float> ModelRunner::token_logprobs(const std::vector<int32_t>& ids) const {
  MT_CHECK(last_logits_.defined() && last_logits_.dim(0) == static_cast<int64_t>(ids.size()),
           "token_logprobs: {} ids for the last step's {} logit rows", ids.size(),
           last_logits_.defined() ? last_logits_.dim(0) : 0);
  if (ids.empty()) return {};
  return ops::token_logprobs(last_logits_, upload(ids), vocab_).to_device(Device::CPU).to_vector();
}

Tensor ModelRunner::host_logits(Tensor l) const {
  const int64_t R = l.dim(0);
  // To the host in the activations' dtype (half the bytes of fp32), then one pass that widens
  // and drops the padded vocabulary columns.
  if (l.device() != Device::CPU) l = l.to_device(Device::CPU);
  const int64_t Vp = l.dim(1);
  if (l.dtype() == DType::F32 && Vp == vocab_) return l;
  Tensor out = Tensor::empty({R, vocab_});
  for (int64_t r = 0; r < R; ++r) {
    float* dst = out.data<float>() + r * vocab_;
    if (l.dtype() == DType::F32) {
      std::memcpy(dst, l.data<float>() + r * Vp, static_cast<size_t>(vocab_) * 4);
    } else if (l.dtype() == DType::BF16) {
      const uint16_t* src = l.data<uint16_t>() + r * Vp;
      for (int64_t v = 0; v < vocab_; ++v) dst[v] = bf16_to_f32(src[v]);
    } else {
      const uint16_t* src = l.data<uint16_t>() + r * Vp;
      for (int64_t v = 0; v < vocab_; ++v) dst[v] = f16_to_f32(src[v]);
    }
  }
  return out;
}

}  // namespace mt::inference
