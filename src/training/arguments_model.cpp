// Pretrain's model section: the shape, precision and attention flags, activation recomputation,
// and the model fields derived once the other sections are known.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "model/gpt_model.h"
#include "parallel/pipeline_layout.h"
#include "training/arguments_sections.h"

namespace mt {
namespace {
namespace limits = model::limits;
}  // namespace

void register_model_flags(FlagParser& p, ModelArgs& a, ModelAliases& r) {
  auto& m = a.model;
  p.value("--num-layers", &m.num_layers, "number of transformer layers", {1, limits::kLayers});
  p.value("--hidden-size", &m.hidden_size, "transformer hidden size", {1, limits::kHidden});
  p.value("--ffn-hidden-size", &m.ffn_hidden_size, "MLP hidden size (default 4*h; SwiGLU: 8h/3 rounded to 64)", {1, limits::kFfnHidden});
  p.value("--num-attention-heads", &m.num_attention_heads, "number of attention heads", {1, limits::kHeads});
  p.store_true("--group-query-attention", &a.group_query_attention, "use grouped-query attention");
  p.value("--num-query-groups", &m.num_query_groups, "number of query groups (with --group-query-attention)", {1, limits::kHeads});
  p.value("--kv-channels", &m.kv_channels, "head dimension (default hidden/heads)", {1, limits::kHeadDim});
  p.value("--seq-length", &m.seq_length, "sequence length", {1, limits::kSeqLength});
  p.value("--max-position-embeddings", &m.max_position_embeddings, "positions of the learned position embedding", {1, limits::kSeqLength});
  p.value("--normalization", &m.normalization, "normalization layer", {"LayerNorm", "RMSNorm"});
  p.value("--norm-epsilon", &m.norm_epsilon, "epsilon of the normalization layers (default 1e-5)");
  p.store_true("--swiglu", &m.swiglu, "SwiGLU MLP activation");
  p.store_true("--openai-gelu", &m.openai_gelu, "tanh-approximate GELU");
  p.value("--position-embedding-type", &m.position_embedding_type, "position embedding",
          {"learned_absolute", "rope", "none"});
  p.store_true("--use-rotary-position-embeddings", &r.use_rotary, "same as --position-embedding-type rope");
  p.value("--rotary-base", &m.rotary_base, "RoPE base (default 10000)");
  p.value("--rotary-percent", &m.rotary_percent, "fraction of the head dimension rotated (default 1.0)");
  p.store_true("--disable-bias-linear", &r.disable_bias_linear, "no biases in linear layers");
  p.store_true("--add-qkv-bias", &r.add_qkv_bias, "bias in the QKV projection even with --disable-bias-linear");
  p.store_true("--use-rope-scaling", &m.rope_scaling, "Llama 3.1 RoPE frequency scaling");
  p.value("--rope-scaling-factor", &m.rope_scaling_factor, "RoPE scaling factor (default 8.0)");
  p.store_true("--qk-layernorm", &m.qk_layernorm, "normalize each head's queries and keys (Qwen3)");
  p.store_true("--apply-layernorm-1p", &m.layernorm_zero_centered_gamma,
               "store every norm's weight zero-centred (w - 1, initialised to 0; the norm scales by 1 + w)");
  p.store_true("--untie-embeddings-and-output-weights", &m.untie_embeddings_and_output_weights,
               "separate output layer weights");
  p.value("--init-method-std", &m.init_method_std, "std of the normal init (default 0.02)");
  p.value("--attention-dropout", &m.attention_dropout, "attention dropout (default 0.1)");
  p.value("--hidden-dropout", &m.hidden_dropout, "hidden dropout (default 0.1)");
  p.value("--make-vocab-size-divisible-by", &a.make_vocab_size_divisible_by, "vocab padding multiple (default 128)", {1, kMaxVocabMultiple});
  p.store_true("--bf16", &m.bf16, "bf16 params and activations, fp32 main params and grads");
  p.store_true("--fp16", &m.fp16, "fp16 params and activations with loss scaling, fp32 main params and grads");
  p.custom("--attention-backend", true,
           [&a](const std::string& v) {
             if (v == "unfused" || v == "local")
               fail("--attention-backend {}: megatron.cpp has no '{}' attention; the backends here are auto (cuDNN "
                    "fused attention where it applies, else flash), flash (megatron.cpp's own flash-attention "
                    "kernels) and fused (cuDNN)",
                    v, v);
             if (v != "auto" && v != "flash" && v != "fused")
               fail("--attention-backend got '{}'; expected auto, flash or fused", v);
             a.attention_backend = v;
           },
           "GPU attention: auto (default: cuDNN fused attention where supported, else flash), flash (own "
           "kernels), fused (cuDNN; an error where it does not apply)");
  p.custom("--deterministic-mode", false, [](const std::string&) {},
           "accepted: megatron.cpp's kernels are deterministic unless --nondeterministic-attention is given");
  p.store_true("--nondeterministic-attention", &a.nondeterministic_attention,
               "let cuDNN's attention backward accumulate dQ with atomics (faster; the same seed no longer gives "
               "bit-identical runs). Default: deterministic kernels");
  p.custom("--transformer-impl", true,
           [](const std::string& v) {
             if (v != "local" && v != "transformer_engine")
               fail("--transformer-impl got '{}'; expected local or transformer_engine", v);
           },
           "accepted for compatibility; megatron.cpp has one implementation");
  p.value("--recompute-granularity", &m.recompute_granularity,
          "activation recomputation: full (whole layers) or selective (the attention core)", {"full", "selective"});
  p.store_true("--recompute-activations", &r.recompute_activations, "same as --recompute-granularity selective");
  p.value("--recompute-method", &m.recompute_method,
          "full recomputation: uniform (groups of N layers) or block (the first N layers of each stage)",
          {"uniform", "block"});
  p.value("--recompute-num-layers", &m.recompute_num_layers, "N for --recompute-method", {0, limits::kLayers});
  p.store_true("--distribute-saved-activations", &m.distribute_saved_activations,
               "full recomputation: each tensor-parallel rank keeps 1/TP of a recomputed group's input");
  p.list("--recompute-modules", &m.recompute_modules,
         "selective recomputation's modules: core_attn (default), moe_act, moe");
}

void resolve_model_aliases(ModelArgs& a, const ModelAliases& r) {
  if (a.model.fp16 && a.model.bf16) fail("--fp16 and --bf16 cannot be used together; pick one");
  if (r.use_rotary) a.model.position_embedding_type = "rope";
  if (r.recompute_activations) {
    if (a.model.recompute_granularity == "full")
      fail("--recompute-activations means --recompute-granularity selective; it cannot be combined with "
           "--recompute-granularity full");
    a.model.recompute_granularity = "selective";
  }
  a.model.add_bias_linear = !r.disable_bias_linear;
  a.model.add_qkv_bias = a.model.add_bias_linear || r.add_qkv_bias;
}

void validate_model_args(Arguments& a) {
  if (a.was_given("--num-query-groups") && !a.group_query_attention)
    fail("--num-query-groups needs --group-query-attention (Megatron ignores it otherwise)");
  if (!a.group_query_attention) a.model.num_query_groups = 0;

  // cuDNN's path has no attention dropout matching ours (CPU-identical Philox mask), so fused needs it off.
  if (a.attention_backend == "fused" && a.model.attention_dropout > 0)
    fail("--attention-backend fused (cuDNN) does not apply attention dropout; set --attention-dropout 0 or use "
         "--attention-backend auto (which uses the flash kernels while dropout is on)");
  if (a.was_given("--deterministic-mode") && a.nondeterministic_attention)
    fail("--deterministic-mode and --nondeterministic-attention contradict each other; drop one");
  if (a.attention_backend == "fused" && a.device == "cpu") {
    // A GPU script run where there is no GPU (--device auto): the choice has nothing to select.
    if (!a.was_given("--device"))
      log_warn("--attention-backend fused selects cuDNN attention on the GPU; this run is on the CPU (--device auto "
               "found no GPU), which has one attention implementation");
    else
      fail("--attention-backend fused runs cuDNN on the GPU; it cannot be combined with --device cpu");
  }
}

void finish_model_args(Arguments& a, int64_t tokenizer_vocab_size) {
  if (a.model.seq_length <= 0) fail("--seq-length is required and must be positive");
  a.model.orig_vocab_size = tokenizer_vocab_size;
  a.model.vocab_size = model::padded_vocab_size(tokenizer_vocab_size, a.make_vocab_size_divisible_by,
                                                a.tensor_model_parallel_size);
  a.model.seed = a.seed;
  a.data.seq_length = a.model.seq_length;
  a.data.seed = a.seed;
  a.model.finalize();
}

// Megatron's activation-recomputation rules, after the pipeline split is known (N is bounded
// by the layers a pipeline stage holds).
void validate_recompute_args(Arguments& a) {
  for (const auto& mod : a.model.recompute_modules) {
    if (mod == "core_attn" || mod == "moe_act" || mod == "moe") continue;
    if (mod == "layernorm" || mod == "mla_up_proj" || mod == "mlp" || mod == "shared_experts")
      fail("--recompute-modules {}: megatron.cpp recomputes core_attn, moe_act and moe; '{}' is not implemented yet",
           mod, mod);
    fail("--recompute-modules got '{}'; expected core_attn, moe_act or moe", mod);
  }
  if (a.was_given("--recompute-modules") && a.model.recompute_granularity != "selective")
    fail("--recompute-modules needs --recompute-granularity selective");
  auto& m = a.model;
  const std::string& g = m.recompute_granularity;
  // Megatron's rules (arguments.py, TransformerConfig): TP > 1, full recomputation with a
  // method, and not with sequence parallelism (whose inputs are already split over TP).
  if (m.distribute_saved_activations) {
    if (a.tensor_model_parallel_size == 1)
      fail("--distribute-saved-activations splits saved inputs over tensor-parallel ranks: it needs "
           "--tensor-model-parallel-size > 1");
    if (g != "full")
      fail("--distribute-saved-activations applies to --recompute-granularity full only");
    if (a.sequence_parallel)
      fail("--distribute-saved-activations cannot be combined with --sequence-parallel (the saved inputs are already "
           "split over the tensor-parallel ranks)");
  }
  if (g.empty()) {
    if (a.was_given("--recompute-method") || a.was_given("--recompute-num-layers"))
      fail("--recompute-method and --recompute-num-layers need --recompute-granularity full");
    return;
  }
  if (g == "selective") {
    if (a.was_given("--recompute-method"))
      fail("--recompute-method is not supported with --recompute-granularity selective (it recomputes the attention "
           "core of every layer); drop it, or use --recompute-granularity full");
    if (a.was_given("--recompute-num-layers"))
      fail("--recompute-num-layers is not supported with --recompute-granularity selective; drop it, or use "
           "--recompute-granularity full");
    return;
  }
  if (m.recompute_method.empty())
    fail("--recompute-granularity full needs --recompute-method uniform or block");
  if (!a.was_given("--recompute-num-layers"))
    fail("--recompute-granularity full needs --recompute-num-layers N (uniform: layers per recomputed group; "
         "block: layers recomputed on each pipeline stage)");
  const parallel::PipelineLayout layout(m.num_layers, pipeline_options(a));
  int64_t per_stage = 0;
  for (int r = 0; r < layout.pp(); ++r) {
    int64_t n = 0;
    for (auto [b, e] : layout.chunks(r)) n += e - b;
    per_stage = std::max(per_stage, n);
  }
  if (m.recompute_num_layers < 1 || m.recompute_num_layers > per_stage)
    fail("--recompute-num-layers must be between 1 and the layers per pipeline stage ({}); got {}", per_stage,
         m.recompute_num_layers);
}

}  // namespace mt
