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
  (void)num_parameters();  // throws, naming the shape, when the count does not fit
}

int64_t TransformerConfig::num_parameters() const {
  const std::string what =
      fmt::format("parameter count of --num-layers {}, --hidden-size {}, --ffn-hidden-size {}, --num-attention-heads "
                  "{}, --kv-channels {}, vocabulary {}",
                  num_layers, hidden_size, ffn_hidden_size, num_attention_heads, kv_channels, vocab_size);
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, what); };
  auto sum = [&](std::initializer_list<int64_t> xs) {
    int64_t r = 0;
    for (int64_t x : xs) r = checked_add(r, x, what);
    return r;
  };
  const int64_t h = hidden_size, norm = rmsnorm() ? h : 2 * h;
  const int64_t qkv = mul(num_query_groups, mul(q_per_group() + 2, kv_channels));
  const int64_t fc1 = mul(swiglu ? 2 : 1, ffn_hidden_size);
  const int64_t attn = sum({mul(qkv, h), add_qkv_bias ? qkv : 0, mul(mul(num_attention_heads, kv_channels), h),
                            add_bias_linear ? h : 0});
  const int64_t mlp = sum({mul(fc1, h), add_bias_linear ? fc1 : 0, mul(ffn_hidden_size, h), add_bias_linear ? h : 0});
  const int64_t layer =
      sum({attn, mlp, mul(2, norm), qk_layernorm ? mul(2, rmsnorm() ? kv_channels : 2 * kv_channels) : 0});
  const int64_t emb =
      sum({mul(vocab_size, h), position_embedding_type == "learned_absolute" ? mul(max_position_embeddings, h) : 0});
  const int64_t out = untie_embeddings_and_output_weights ? mul(vocab_size, h) : 0;
  return sum({emb, mul(num_layers, layer), norm, out});
}

}  // namespace mt::model
