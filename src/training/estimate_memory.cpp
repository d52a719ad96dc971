// The memory half of `megatron estimate`: this engine's per-rank bytes, module by module.
// Sizes are doubles (bytes of real runs reach 1e11; the shapes were range-checked by
// validation, so nothing here can overflow a double's exact integer range in practice).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/pipeline_layout.h"
#include "parallel/schedule.h"
#include "training/estimate.h"
#include "training/estimate_dims.h"
#include "training/estimate_fp8.h"

namespace mt::estimate {
namespace {

// Query heads and key/value groups of one TP rank (Megatron replicates a group over TP / G
// ranks when TP > G).
double local_heads(const Arguments& a) {
  return static_cast<double>(a.model.num_attention_heads) / static_cast<double>(a.tensor_model_parallel_size);
}
double local_groups(const Arguments& a) {
  const int64_t tp = a.tensor_model_parallel_size, g = a.model.num_query_groups;
  return tp > g ? 1.0 : static_cast<double>(g) / static_cast<double>(tp);
}

// Parameters of one layer on one rank; `expert` gets the routed experts' share.
int64_t layer_params(const Arguments& a, int64_t layer, int64_t& expert) {
  const auto& c = a.model;
  const int64_t tp = a.tensor_model_parallel_size, h = c.hidden_size, norm = c.rmsnorm() ? h : 2 * h;
  const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
  const int64_t qkv = c.qkv_out();
  int64_t n = 2 * norm + qkv * h / tp + (c.add_qkv_bias ? qkv / tp : 0) + c.num_attention_heads * c.kv_channels * h / tp +
              (c.add_bias_linear ? h : 0);
  if (c.qk_layernorm) n += 2 * (c.rmsnorm() ? c.kv_channels : 2 * c.kv_channels);
  // An MLP of width f split over `split` ranks: fc1 (and its bias) column-, fc2 row-parallel.
  auto mlp = [&](int64_t f, int64_t split) {
    const int64_t fc1 = (c.swiglu ? 2 : 1) * f;
    return fc1 * h / split + (c.add_bias_linear ? fc1 / split + h : 0) + f * h / split;
  };
  expert = 0;
  if (!c.moe.is_moe_layer(layer)) return n + mlp(c.ffn_hidden_size, tp);
  const auto& m = c.moe;
  n += m.num_experts * h + (m.enable_expert_bias ? m.num_experts : 0);
  expert = m.num_experts / a.expert_model_parallel_size * mlp(m.moe_ffn_hidden_size, etp);
  if (m.shared_expert_intermediate_size > 0) n += mlp(m.shared_expert_intermediate_size, tp);
  if (m.shared_expert_gate) n += h;
  return n + expert;
}

double rows_to_experts(const Arguments& a, const Dims& d) {
  // Routed rows a rank's experts receive: each of the group's tokens goes to top-k experts; the
  // expert-TP members each see their whole group's rows. The allgather dispatcher keeps the
  // rows of every expert of the EP group (its plan), the alltoall one only its own.
  return d.tsp * static_cast<double>(a.model.moe.topk) * d.etp;
}

// The attention half of a layer and its two norms: what Norm, SelfAttention keep in Saved.
double attention_bytes(const Arguments& a, const Dims& d) {
  const auto& c = a.model;
  const double D = static_cast<double>(c.kv_channels), hl = local_heads(a), gl = local_groups(a);
  const double stats = d.tsp * 4.0 * (c.rmsnorm() ? 1.0 : 2.0);  // rstd (and mean) in fp32
  double b = 3 * d.tsp * d.h * d.e + 2 * stats;  // the two norms' inputs (and statistics), linear_qkv's input
  b += d.t * (hl + 2 * gl) * D * d.e;                                // q, k, v
  if (c.qk_layernorm) b += d.t * (hl + gl) * D * d.e + d.t * (hl + gl) * 4.0 * (c.rmsnorm() ? 1.0 : 2.0);
  if (!c.recomputes("core_attn"))  // the core's output and log-sum-exp
    b += d.t * hl * D * d.e + static_cast<double>(a.micro_batch_size) * hl * static_cast<double>(c.seq_length) * 4.0;
  return b;
}

// The MLP half: the dense MLP's input, fc1 output and activation, or the MoE layer's router,
// dispatch and experts.
double mlp_bytes(const Arguments& a, const Dims& d, bool moe_layer) {
  const auto& c = a.model;
  const double in = d.tsp * d.h * d.e;
  if (!moe_layer) {
    const double f = static_cast<double>(c.ffn_hidden_size) / d.tp;
    return in + d.t * f * (c.swiglu ? 3.0 : 2.0) * d.e;
  }
  if (c.recomputes("moe")) return in;  // the layer keeps its input only
  const auto& m = c.moe;
  const double E = static_cast<double>(m.num_experts), rows = rows_to_experts(a, d);
  const double f = static_cast<double>(m.moe_ffn_hidden_size) / d.etp;
  double b = in + d.tsp * E * 16.0;  // the router's fp32 logits and probabilities, the dispatch plan's rows and weights
  const double plan_rows = m.token_dispatcher == "allgather" ? rows * d.ep : rows;
  b += plan_rows * d.h * d.e;                          // the experts' outputs before unpermute
  b += rows * d.h * d.e + rows * f * (c.swiglu ? 2.0 : 1.0) * d.e;  // experts' input and fc1 output
  if (!c.recomputes("moe_act")) b += rows * f * d.e;               // the activation's output
  if (m.shared_expert_intermediate_size > 0)
    b += d.t * static_cast<double>(m.shared_expert_intermediate_size) / d.tp * (c.swiglu ? 3.0 : 2.0) * d.e;
  return b;
}

// Transient bytes of one layer's backward on top of what is saved: the MLP's activation and fc1
// gradients, and the gathered input / output gradient of the residual stream.
double layer_backward_workspace(const Arguments& a, const Dims& d, bool moe_layer) {
  const auto& c = a.model;
  double w = 2 * d.t * d.h * d.e;
  if (!moe_layer) return w + d.t * static_cast<double>(c.ffn_hidden_size) / d.tp * (c.swiglu ? 3.0 : 2.0) * d.e;
  const double f = static_cast<double>(c.moe.moe_ffn_hidden_size) / d.etp;
  return w + rows_to_experts(a, d) * (f * (c.swiglu ? 3.0 : 2.0) + d.h) * d.e;
}

// The head's logits per micro-batch in flight, and the transient of its backward. The GPU
// without TP forms the loss gradient inside the forward, over the logits (fused cross-entropy):
// one [tokens, V] half tensor lives from forward to backward. Otherwise (vocab-parallel or CPU
// cross-entropy) the backward allocates the gradient beside the kept logits.
struct HeadBytes {
  double kept = 0, transient = 0;
};
HeadBytes head_bytes(const Arguments& a, const Dims& d) {
  const double v = static_cast<double>(a.model.vocab_size) / d.tp;
  const double logits = d.t * v * d.e;
  HeadBytes hb;
  hb.kept = logits + 2 * (d.tsp * d.h * d.e);  // + the final norm's input and output
  const bool fused = d.gpu && a.tensor_model_parallel_size == 1;
  hb.transient = (fused ? 0.0 : logits) + d.t * d.h * d.e;
  return hb;
}

// Activations one pass of a chunk of `n` layers (from global index `first`) keeps, with full
// recomputation applied, and the extra bytes its backward rebuilds at once. `fp8` sums the
// chunk's FP8 bytes: the persistent ones over its layers, the per-pass ones as one pass keeps
// them (input codes of the layers that keep their activations), the backward's the largest.
struct ChunkBytes {
  double kept = 0, rebuild = 0, workspace = 0;
  double workspace_without_fp8 = 0;  // the same without FP8's backward casts (for the report)
  Fp8LayerBytes fp8;
};
ChunkBytes chunk_bytes(const Arguments& a, const Dims& d, int64_t first, int64_t n) {
  const auto& c = a.model;
  ChunkBytes cb;
  const double input = d.tsp * d.h * d.e;
  const int64_t N = c.recompute_full() ? c.recompute_num_layers : 0;
  double group = 0, biggest_group = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t l = first + j;
    const bool moe = c.moe.is_moe_layer(l);
    // configure_recompute's groups: uniform recomputes every layer, block the first N.
    const bool recomputed = c.recompute_full() && (c.recompute_method == "uniform" || j < N);
    const Fp8LayerBytes f = fp8_layer_bytes(a, l, d.gpu, recomputed, d.gpu);
    cb.fp8.weight_codes += f.weight_codes;
    cb.fp8.emulated_weights += f.emulated_weights;
    cb.fp8.state += f.state;
    cb.fp8.pass_scales += f.pass_scales;
    cb.fp8.backward = std::max(cb.fp8.backward, f.backward);
    cb.kept += f.pass_scales;
    // What the layer keeps when it keeps its activations (FP8: input codes for bf16 inputs).
    const double full = layer_activation_bytes(a, l, d.gpu) + f.codes_for_inputs();
    const double ws = layer_backward_workspace(a, d, moe);
    cb.workspace = std::max(cb.workspace, ws + f.backward);
    cb.workspace_without_fp8 = std::max(cb.workspace_without_fp8, ws);
    if (!recomputed) {
      cb.fp8.input_codes += f.input_codes;
      cb.fp8.inputs_dropped += f.inputs_dropped;
    }
    if (!c.recompute_full()) {
      cb.kept += full;
      // Selective recomputation rebuilds one layer's core output in its backward.
      if (c.recomputes("core_attn"))
        cb.rebuild = std::max(cb.rebuild, d.t * local_heads(a) * static_cast<double>(c.kv_channels) * d.e);
      continue;
    }
    if (c.recompute_method == "uniform") {
      if (j % N == 0) {
        cb.kept += input;
        group = 0;
      }
      group += full;
      biggest_group = std::max(biggest_group, group);
    } else if (j < N) {  // block: the first N layers of the chunk, one group each
      cb.kept += input;
      biggest_group = std::max(biggest_group, full);
    } else {
      cb.kept += full;
    }
  }
  cb.rebuild = std::max(cb.rebuild, biggest_group);
  return cb;
}

// Passes (micro-batch, chunk) holding activations at once on pipeline rank r, by walking its
// schedule (1F1B: PP - r; interleaved: Megatron's warm-up + 1), weighted by each chunk's bytes:
// the largest sum, and how many passes of each chunk it counts.
struct InFlight {
  double bytes = 0;
  int64_t passes = 0;
  std::vector<int64_t> of_chunk;
};
InFlight in_flight(const Arguments& a, int r, const std::vector<double>& per_chunk) {
  const int pp = static_cast<int>(a.pipeline_model_parallel_size), vpp = static_cast<int>(per_chunk.size());
  const int64_t M = a.global_batch_size / (a.micro_batch_size * a.data_parallel_size);
  parallel::ScheduleSpec spec{.pp = pp, .vpp = vpp, .rank = r, .microbatches = M,
                              .group = a.microbatch_group_size_per_vp_stage};
  InFlight best;
  best.of_chunk.assign(per_chunk.size(), 0);
  // Walking the schedule is linear in M x VPP; beyond a million passes the steady state is
  // reached long before: warm-up + 1 passes of the largest chunk.
  if (M * vpp > (int64_t{1} << 20)) {
    const int64_t n = std::min(parallel::warmup_passes(spec) + 1, M * vpp);
    const auto big = std::max_element(per_chunk.begin(), per_chunk.end());
    best.bytes = static_cast<double>(n) * *big;
    best.passes = n;
    best.of_chunk[static_cast<size_t>(big - per_chunk.begin())] = n;
    return best;
  }
  InFlight live = best;
  for (const parallel::Action& act : parallel::build_schedule(spec)) {
    const size_t k = static_cast<size_t>(act.chunk);
    const int64_t step = act.kind == parallel::Action::Forward ? 1 : -1;
    live.bytes += static_cast<double>(step) * per_chunk[k];
    live.passes += step;
    live.of_chunk[k] += step;
    if (step > 0 && live.bytes > best.bytes) best = live;
  }
  return best;
}

}  // namespace

double layer_activation_bytes(const Arguments& a, int64_t layer, bool gpu) {
  const Dims d = dims_of(a, gpu);
  return attention_bytes(a, d) + mlp_bytes(a, d, a.model.moe.is_moe_layer(layer));
}

// The workspace of cuDNN's deterministic attention backward, B*Hq/TP*ceil64(S)^2*2 bytes (its
// "dP workspace" algorithm), where `auto` picks cuDNN for a layer's attention: bf16 on the GPU
// (fp16 runs the generic kernels), no attention dropout, plain causal attention (not packed documents or CP chunks, which run
// the ranged flash kernels), the deterministic backward, and the workspace within the limit of
// kernels/cuda/attention_cudnn_graph.cpp (a quarter of the card), above which the flash kernels
// run and need none.
double cudnn_attention_workspace(const Arguments& a, const Options& o) {
  const auto& c = a.model;
  if (a.attention_backend == "flash" || a.nondeterministic_attention || !c.bf16) return 0;
  if (c.attention_dropout > 0.f || a.context_parallel_size > 1 || a.reset_attention_mask) return 0;
  const auto ceil64 = [](int64_t v) { return static_cast<double>((v + 63) / 64 * 64); };
  const double S = ceil64(c.seq_length);
  const double bytes = static_cast<double>(a.micro_batch_size) *
                       static_cast<double>(c.num_attention_heads / a.tensor_model_parallel_size) * S * S * 2.0;
  const double limit = o.gpu_memory_gib * double(1 << 30) / 4.0;
  return bytes > limit && a.attention_backend != "fused" ? 0.0 : bytes;
}

Estimate estimate(const Arguments& a, const Options& o) {
  Estimate e;
  e.gpu = a.device == "cuda";
  e.tp = a.tensor_model_parallel_size;
  e.pp = a.pipeline_model_parallel_size;
  e.vpp = a.virtual_pipeline_model_parallel_size;
  e.cp = a.context_parallel_size;
  e.dp = a.data_parallel_size;
  e.world_size = e.tp * e.pp * e.cp * e.dp;
  e.ep = a.expert_model_parallel_size;
  e.etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : e.tp;
  e.edp = e.tp * e.cp * e.dp / (e.ep * e.etp);
  e.microbatches = a.global_batch_size / (a.micro_batch_size * a.data_parallel_size);
  const Dims d = dims_of(a, e.gpu);
  const auto& c = a.model;
  const parallel::PipelineLayout layout(c.num_layers, pipeline_options(a));
  const bool half = c.bf16 || c.fp16;
  // Optimizer state per parameter: Adam's two fp32 moments, SGD's momentum (if any).
  const double state = a.optimizer.type == "adam" ? 8.0 : a.optimizer.sgd_momentum != 0 ? 4.0 : 0.0;
  for (int r = 0; r < layout.pp(); ++r) {
    StageMemory s;
    s.rank = r;
    s.embedding = r == 0;
    s.head = r == layout.pp() - 1;
    int64_t params = 0, expert = 0;
    std::vector<double> per_chunk;
    std::vector<Fp8LayerBytes> fp8_chunk;
    double rebuild = 0, workspace = 0, workspace_without_fp8 = 0;
    const auto chunks = layout.chunks(r);
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const auto [b, en] = chunks[ci];
      s.layers += en - b;
      for (int64_t l = b; l < en; ++l) {
        int64_t ex = 0;
        params += layer_params(a, l, ex);
        expert += ex;
      }
      const ChunkBytes cb = chunk_bytes(a, d, b, en - b);
      per_chunk.push_back(cb.kept);
      fp8_chunk.push_back(cb.fp8);
      s.fp8_weights += cb.fp8.weight_codes;
      s.fp8_emulated_weights += cb.fp8.emulated_weights;
      s.fp8_state += cb.fp8.state;
      rebuild = std::max(rebuild, cb.rebuild);
      workspace = std::max(workspace, cb.workspace);
      workspace_without_fp8 = std::max(workspace_without_fp8, cb.workspace_without_fp8);
      if (en > b) {
        const Fp8LayerBytes f = fp8_layer_bytes(a, b, e.gpu, false, e.gpu);
        s.layer_activation = layer_activation_bytes(a, b, e.gpu) + f.codes_for_inputs() + f.pass_scales;
      }
    }
    const int64_t h = c.hidden_size, V = c.vocab_size / e.tp;
    if (s.embedding)
      params += V * h + (c.position_embedding_type == "learned_absolute" ? c.max_position_embeddings * h : 0);
    const HeadBytes hb = head_bytes(a, d);
    if (s.head) {
      params += c.rmsnorm() ? h : 2 * h;  // the final norm
      // The output layer; a tied one is the embedding itself unless the pipeline splits them.
      if (c.untie_embeddings_and_output_weights || layout.pp() > 1) params += V * h;
      per_chunk.back() += hb.kept;  // the last chunk of the last rank holds the head
    }
    s.params = params;
    s.expert_params = expert;
    const double n = static_cast<double>(params), ne = static_cast<double>(expert);
    s.main_params = 4.0 * n;
    s.grads = 4.0 * n;
    s.weights = half ? (e.gpu ? 2.0 : 4.0) * n : 0.0;  // fp32: the weights are the main params
    // The distributed optimizer shards the state over DP (dense) and expert-DP (experts); the
    // fp32 main params stay whole on every rank here (Megatron shards them too).
    const double dense_shards = a.use_distributed_optimizer ? static_cast<double>(e.dp * e.cp) : 1.0;
    const double expert_shards = a.use_distributed_optimizer ? static_cast<double>(e.edp) : 1.0;
    s.optimizer = state * ((n - ne) / dense_shards + ne / expert_shards);
    const InFlight live = in_flight(a, r, per_chunk);
    s.in_flight = live.passes;
    for (size_t k = 0; k < fp8_chunk.size(); ++k) {
      const double passes = static_cast<double>(live.of_chunk[k]);
      s.fp8_input_codes += passes * (fp8_chunk[k].input_codes + fp8_chunk[k].pass_scales);
      s.fp8_inputs_dropped += passes * fp8_chunk[k].inputs_dropped;
    }
    // At the peak: the passes in flight, then the next backward's transients. The head's
    // backward comes first (its logits still alive); a layer's backward comes after the logits
    // of that pass are freed, on top of what recomputation rebuilt for it. (Where an interleaved
    // schedule holds several passes of the head's chunk, the others' logits count under
    // activations.)
    const double kept_logits = s.head ? hb.kept : 0.0;
    s.activations = live.bytes - kept_logits;
    s.logits = kept_logits;
    auto peak_workspace = [&](double layer_ws) {
      return std::max({s.head ? hb.transient : 0.0, rebuild + layer_ws - kept_logits, 0.0});
    };
    s.workspace = peak_workspace(workspace);
    s.fp8_backward = s.workspace - peak_workspace(workspace_without_fp8);
    e.stages.push_back(s);
  }
  if (e.gpu) {
    // Outside the tensor pool (not in the "peak GPU memory" line): the CUDA context and kernels
    // (~0.5 GiB), cuBLASLt's 32 MiB workspaces and cuDNN's plans, and NCCL's buffers per
    // communicator. Allowances, not measurements.
    int comms = 0;
    for (int64_t g : {e.tp, e.pp, e.cp, e.dp, e.ep > 1 ? e.ep * e.etp : int64_t{1}})
      if (g > 1) ++comms;
    e.outside_pool = (0.6 + 0.3 * comms) * double(1 << 30);
    e.slack_fraction = 0.05;  // the stream-ordered pool's fragmentation
    e.attention_workspace = cudnn_attention_workspace(a, o);
    e.fp8_gemm_workspace = fp8_gemm_workspace(a, e.gpu);
  } else {
    // The process itself (binary, libraries, OpenBLAS): the quickstart shape measured 677 MiB of
    // resident memory with a CPU-only build against 635 MiB of tensors here, and 831-867 MiB
    // with a CUDA build on the GPU machine's host (BENCHMARKS.md).
    e.outside_pool = (45.0 + (o.cuda_build ? 160.0 : 0.0)) * double(1 << 20);
    // Resident memory of the same shape with 2, 6 and 12 layers (BENCHMARKS.md, estimate
    // calibration) exceeded the tensors by 2-9% of the activations more than the process' own.
    e.slack_fraction = 0.10;
  }
  e.comm = comm_volumes(a, e);
  return e;
}

bool Options::built_with_cuda() {
#ifdef MT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

double Estimate::slack(const StageMemory& s) const {
  return slack_fraction * (gpu ? s.pool_peak() : s.activations + s.workspace);
}

const StageMemory& Estimate::peak_stage() const {
  MT_CHECK(!stages.empty(), "an estimate without stages");
  return *std::max_element(stages.begin(), stages.end(),
                           [this](const StageMemory& x, const StageMemory& y) { return needed(x) < needed(y); });
}

}  // namespace mt::estimate
