#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "core/checked.h"
#include "core/error.h"

namespace mt::model {

int64_t padded_vocab_size(int64_t orig, int64_t divisible_by, int64_t tp) {
  if (divisible_by <= 0) fail("--make-vocab-size-divisible-by must be positive (got {})", divisible_by);
  const int64_t m = checked_mul(divisible_by, tp, "--make-vocab-size-divisible-by x --tensor-model-parallel-size");
  if (m <= 0) fail("--tensor-model-parallel-size must be at least 1 (got {})", tp);
  return checked_mul(orig / m + (orig % m != 0), m, "padded vocabulary size");
}

int64_t TransformerConfig::rotary_dim() const {
  int64_t d = static_cast<int64_t>(static_cast<double>(kv_channels) * rotary_percent);
  return d - d % 2;
}

namespace {

// A size read from a flag, a checkpoint or a config file: within [lo, hi], or the flag is named.
// lo is 0 where the field takes 0 as "derive the default"; the message still asks for >= 1, as
// a user must leave such a flag out rather than pass 0.
void check_size(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    fail("{}: value out of range (got {}; expected {} to {})", flag, v, std::max<int64_t>(lo, 1), hi);
}

// NaN fails every comparison, so each test is written as "not in the good range".
void check_positive(const char* flag, double v) {
  if (!(v > 0.0 && std::isfinite(v))) fail("{} must be a positive finite number (got {})", flag, v);
}

void check_probability(const char* flag, double v) {
  if (!(v >= 0.0 && v < 1.0)) fail("{} must be in [0, 1) (got {})", flag, v);
}

void check_non_negative(const char* flag, double v) {
  if (!(v >= 0.0 && std::isfinite(v))) fail("{} must be a non-negative finite number (got {})", flag, v);
}

void check_choice(const char* flag, const std::string& v, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (v == c) return;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  fail("{} got '{}'; expected one of: {}", flag, v.substr(0, 40), list);
}

// The MoE settings, whatever their source (flags, a checkpoint, an HF config.json), with
// Megatron's TransformerConfig rules; flags are named as the user would fix them.
void finalize_moe(TransformerConfig& c) {
  MoEConfig& m = c.moe;
  check_size("--num-experts", m.num_experts, 0, limits::kExperts);
  if (!m.enabled()) return;
  check_size("--moe-ffn-hidden-size", m.moe_ffn_hidden_size, 0, limits::kFfnHidden);  // 0: ffn_hidden_size
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = c.ffn_hidden_size;
  check_size("--moe-shared-expert-intermediate-size", m.shared_expert_intermediate_size, 0, limits::kFfnHidden);
  check_size("--moe-router-topk", m.topk, 1, m.num_experts);
  if (!m.layer_pattern.empty() && static_cast<int64_t>(m.layer_pattern.size()) != c.num_layers)
    fail("--moe-layer-freq: the pattern has {} entries but the model has {} layers (--num-layers)",
         m.layer_pattern.size(), c.num_layers);
  // One spelling of "every layer" (what checkpoints record and configs are compared by).
  if (std::find(m.layer_pattern.begin(), m.layer_pattern.end(), false) == m.layer_pattern.end())
    m.layer_pattern.clear();
  check_choice("--moe-router-score-function", m.score_function, {"softmax", "sigmoid"});
  if (m.router_dtype != "fp32")
    fail("--moe-router-dtype {}: routing always runs in fp32 in megatron.cpp; use fp32", m.router_dtype.substr(0, 40));
  check_choice("--moe-router-load-balancing-type", m.load_balancing_type,
               {"aux_loss", "seq_aux_loss", "sinkhorn", "none"});
  check_choice("--moe-token-dispatcher-type", m.token_dispatcher, {"allgather", "alltoall"});
  check_choice("--moe-token-drop-policy", m.drop_policy, {"probs", "position"});
  check_non_negative("--moe-aux-loss-coeff", m.aux_loss_coeff);
  check_non_negative("--moe-z-loss-coeff", m.z_loss_coeff);
  check_non_negative("--moe-router-topk-scaling-factor", m.topk_scaling_factor);
  check_non_negative("--moe-router-bias-update-rate", m.bias_update_rate);
  if (!std::isfinite(m.capacity_factor))
    fail("--moe-expert-capacity-factor must be finite (got {})", m.capacity_factor);
  // Group-limited routing: top group_topk groups by the sum of their best topk/group_topk scores.
  check_size("--moe-router-num-groups", m.num_groups, 0, m.num_experts);
  check_size("--moe-router-group-topk", m.group_topk, 0, limits::kExperts);
  if ((m.num_groups > 0) != (m.group_topk > 0))
    fail("--moe-router-num-groups and --moe-router-group-topk go together (group-limited routing); give both or "
         "neither");
  if (m.num_groups > 0) {
    if (m.group_topk > m.num_groups)
      fail("--moe-router-group-topk ({}) must be at most --moe-router-num-groups ({})", m.group_topk, m.num_groups);
    if (m.num_experts % m.num_groups != 0)
      fail("--num-experts ({}) must be divisible by --moe-router-num-groups ({})", m.num_experts, m.num_groups);
    if (m.topk % m.group_topk != 0)
      fail("--moe-router-topk ({}) must be divisible by --moe-router-group-topk ({}): each selected group gives "
           "topk/group_topk experts",
           m.topk, m.group_topk);
    if (m.topk / m.group_topk > m.num_experts / m.num_groups)
      fail("--moe-router-topk {} over --moe-router-group-topk {} groups takes {} experts per group, but each of the "
           "--moe-router-num-groups {} groups has only {}",
           m.topk, m.group_topk, m.topk / m.group_topk, m.num_groups, m.num_experts / m.num_groups);
  }
  if (m.enable_expert_bias && m.score_function != "sigmoid")
    fail("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (aux-loss-free balancing as "
         "DeepSeek-V3)");
  if (m.load_balancing_type == "sinkhorn" && m.aux_loss_coeff != 0)
    fail("--moe-router-load-balancing-type sinkhorn does not use an aux loss; drop --moe-aux-loss-coeff");
  if (m.capacity_factor > 0 && !m.uses_aux_loss() && m.load_balancing_type != "none")
    fail("--moe-expert-capacity-factor works only with --moe-router-load-balancing-type aux_loss, seq_aux_loss or none "
         "(got {})",
         m.load_balancing_type);
  if (m.pad_to_capacity && !(m.capacity_factor > 0))
    fail("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  if (m.shared_expert_gate && m.shared_expert_intermediate_size == 0)
    fail("--moe-shared-expert-gate needs a shared expert (--moe-shared-expert-intermediate-size)");
}

}  // namespace

void TransformerConfig::finalize() {
  if (bf16 && fp16) fail("--fp16 and --bf16 cannot be used together; pick one");
  // Ranges first: every default below is derived from these, and must not overflow.
  check_size("--num-layers", num_layers, 1, limits::kLayers);
  check_size("--hidden-size", hidden_size, 1, limits::kHidden);
  check_size("--num-attention-heads", num_attention_heads, 1, limits::kHeads);
  check_size("--num-query-groups", num_query_groups, 0, num_attention_heads);  // 0: = heads
  check_size("--kv-channels", kv_channels, 0, limits::kHeadDim);               // 0: hidden / heads
  check_size("--ffn-hidden-size", ffn_hidden_size, 0, limits::kFfnHidden);     // 0: Megatron's default
  check_size("--seq-length", seq_length, 1, limits::kSeqLength);
  check_size("--max-position-embeddings", max_position_embeddings, 0, limits::kSeqLength);  // 0: seq
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  if (num_attention_heads % num_query_groups != 0)
    fail("--num-attention-heads ({}) must be divisible by --num-query-groups ({})", num_attention_heads,
         num_query_groups);
  if (kv_channels == 0) {
    if (hidden_size % num_attention_heads != 0)
      fail("--hidden-size ({}) must be divisible by --num-attention-heads ({}), or set --kv-channels", hidden_size,
           num_attention_heads);
    kv_channels = hidden_size / num_attention_heads;
  }
  if (ffn_hidden_size == 0) {
    // Megatron: 4h, and for SwiGLU int((4h * 2/3) / 64) * 64 so the parameter count stays close.
    ffn_hidden_size = swiglu ? (4 * hidden_size * 2 / 3) / 64 * 64 : 4 * hidden_size;
    if (ffn_hidden_size == 0) ffn_hidden_size = 4 * hidden_size;
  }
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  if (position_embedding_type == "learned_absolute" && seq_length > max_position_embeddings)
    fail("--seq-length ({}) exceeds --max-position-embeddings ({})", seq_length, max_position_embeddings);
  if (position_embedding_type != "learned_absolute" && position_embedding_type != "rope" &&
      position_embedding_type != "none")
    fail("--position-embedding-type must be learned_absolute, rope or none (got '{}')", position_embedding_type);
  if (normalization != "LayerNorm" && normalization != "RMSNorm")
    fail("--normalization must be LayerNorm or RMSNorm (got '{}')", normalization);
  if (!(rotary_percent > 0.f && rotary_percent <= 1.f)) fail("--rotary-percent must be in (0, 1] (got {})", rotary_percent);
  check_positive("--rotary-base", rotary_base);
  if (rope_scaling && !rope()) fail("--use-rope-scaling needs --position-embedding-type rope");
  if (rope_scaling && !(std::isfinite(rope_scaling_factor) && rope_scaling_factor > 0 && rope_low_freq_factor > 0 &&
                        std::isfinite(rope_high_freq_factor) && rope_high_freq_factor > rope_low_freq_factor &&
                        rope_original_max_position > 0))
    fail("RoPE scaling needs a positive --rope-scaling-factor, 0 < low_freq_factor < high_freq_factor and a positive "
         "original_max_position_embeddings (got {}, {}, {}, {})",
         rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position);
  if (rope() && rotary_dim() < 2) fail("--rotary-percent {} leaves no rotary channels for head dim {}", rotary_percent, kv_channels);
  check_probability("--attention-dropout", attention_dropout);
  check_probability("--hidden-dropout", hidden_dropout);
  check_positive("--norm-epsilon", norm_epsilon);
  check_positive("--init-method-std", init_method_std);
  if (vocab_size <= 0) fail("vocabulary size is unknown: set --vocab-size or a tokenizer");
  check_size("vocabulary size (after padding)", vocab_size, 1, limits::kVocab);
  // Each projection is one GEMM whose dimensions BLAS takes as int32 (the bounds above keep
  // these products within int64).
  const std::string shape = fmt::format("--num-attention-heads {} x --kv-channels {}", num_attention_heads, kv_channels);
  if (qkv_out() > limits::kBlasDim || num_attention_heads * kv_channels > limits::kBlasDim)
    fail("{}: the attention projections would be {} wide, more than one GEMM can take ({}); use fewer heads or a "
         "smaller head dimension",
         shape, qkv_out(), limits::kBlasDim);
  finalize_moe(*this);
  (void)num_parameters();  // throws, naming the shape, when the count does not fit
}

namespace {

// Overflow-checked: the error names the shape flags.
int64_t count_parameters(const TransformerConfig& c, bool active_only) {
  const MoEConfig& moe = c.moe;
  std::string what =
      fmt::format("parameter count of --num-layers {}, --hidden-size {}, --ffn-hidden-size {}, --num-attention-heads "
                  "{}, --kv-channels {}, vocabulary {}",
                  c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.kv_channels, c.vocab_size);
  if (moe.enabled())
    what += fmt::format(", --num-experts {}, --moe-ffn-hidden-size {}, --moe-shared-expert-intermediate-size {}",
                        moe.num_experts, moe.moe_ffn_hidden_size, moe.shared_expert_intermediate_size);
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, what); };
  auto sum = [&](std::initializer_list<int64_t> xs) {
    int64_t r = 0;
    for (int64_t x : xs) r = checked_add(r, x, what);
    return r;
  };
  const int64_t h = c.hidden_size, norm = c.rmsnorm() ? h : 2 * h;
  // One MLP of hidden size f (the dense MLP, an expert, the shared expert): fc1 ([gate; up] for
  // SwiGLU) and fc2, with their biases.
  auto mlp_of = [&](int64_t f) {
    const int64_t fc1 = mul(c.swiglu ? 2 : 1, f);
    return sum({mul(fc1, h), c.add_bias_linear ? fc1 : 0, mul(f, h), c.add_bias_linear ? h : 0});
  };
  const int64_t qkv = mul(c.num_query_groups, mul(c.q_per_group() + 2, c.kv_channels));
  const int64_t attn = sum({mul(qkv, h), c.add_qkv_bias ? qkv : 0, mul(mul(c.num_attention_heads, c.kv_channels), h),
                            c.add_bias_linear ? h : 0});
  const int64_t attn_and_norms =
      sum({attn, mul(2, norm), c.qk_layernorm ? mul(2, c.rmsnorm() ? c.kv_channels : 2 * c.kv_channels) : 0});
  const int64_t dense_layer = sum({attn_and_norms, mlp_of(c.ffn_hidden_size)});
  int64_t layers = mul(c.num_layers, dense_layer);
  if (moe.enabled()) {
    // Router [E, h] (+ the expert bias), the experts (all, or the top-k one token uses), the
    // shared expert and its gate [1, h].
    const int64_t experts = active_only ? moe.topk : moe.num_experts;
    const int64_t shared = moe.shared_expert_intermediate_size;
    const int64_t moe_layer =
        sum({attn_and_norms, mul(moe.num_experts, h), moe.enable_expert_bias ? moe.num_experts : 0,
             mul(experts, mlp_of(moe.moe_ffn_hidden_size)), shared > 0 ? mlp_of(shared) : 0,
             moe.shared_expert_gate ? h : 0});
    const int64_t n_moe = moe.num_moe_layers(c.num_layers);
    layers = sum({mul(c.num_layers - n_moe, dense_layer), mul(n_moe, moe_layer)});
  }
  const int64_t emb = sum(
      {mul(c.vocab_size, h), c.position_embedding_type == "learned_absolute" ? mul(c.max_position_embeddings, h) : 0});
  const int64_t out = c.untie_embeddings_and_output_weights ? mul(c.vocab_size, h) : 0;
  return sum({emb, layers, norm, out});
}

}  // namespace

int64_t TransformerConfig::num_parameters() const { return count_parameters(*this, false); }

int64_t TransformerConfig::num_active_parameters() const { return count_parameters(*this, true); }

}  // namespace mt::model
