#include "model/config.h"

#include "core/error.h"

namespace mt::model {

int64_t padded_vocab_size(int64_t orig, int64_t divisible_by, int64_t tp) {
  int64_t m = divisible_by * tp;
  if (m <= 0) fail("--make-vocab-size-divisible-by must be positive (got {})", divisible_by);
  return (orig + m - 1) / m * m;
}

int64_t TransformerConfig::rotary_dim() const {
  int64_t d = static_cast<int64_t>(static_cast<double>(kv_channels) * rotary_percent);
  return d - d % 2;
}

void TransformerConfig::finalize() {
  if (bf16 && fp16) fail("--fp16 and --bf16 cannot be used together; pick one");
  if (num_layers <= 0) fail("--num-layers must be positive (got {})", num_layers);
  if (hidden_size <= 0) fail("--hidden-size must be positive (got {})", hidden_size);
  if (num_attention_heads <= 0) fail("--num-attention-heads must be positive (got {})", num_attention_heads);
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  if (num_query_groups < 0) fail("--num-query-groups must be positive (got {})", num_query_groups);
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
  if (seq_length <= 0) fail("--seq-length must be positive (got {})", seq_length);
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  if (position_embedding_type == "learned_absolute" && seq_length > max_position_embeddings)
    fail("--seq-length ({}) exceeds --max-position-embeddings ({})", seq_length, max_position_embeddings);
  if (position_embedding_type != "learned_absolute" && position_embedding_type != "rope" &&
      position_embedding_type != "none")
    fail("--position-embedding-type must be learned_absolute, rope or none (got '{}')", position_embedding_type);
  if (normalization != "LayerNorm" && normalization != "RMSNorm")
    fail("--normalization must be LayerNorm or RMSNorm (got '{}')", normalization);
  if (rotary_percent <= 0.f || rotary_percent > 1.f) fail("--rotary-percent must be in (0, 1] (got {})", rotary_percent);
  if (rope_scaling && !rope()) fail("--use-rope-scaling needs --position-embedding-type rope");
  if (rope_scaling && (rope_scaling_factor <= 0 || rope_low_freq_factor <= 0 ||
                       rope_high_freq_factor <= rope_low_freq_factor || rope_original_max_position <= 0))
    fail("RoPE scaling needs a positive --rope-scaling-factor, 0 < low_freq_factor < high_freq_factor and a positive "
         "original_max_position_embeddings (got {}, {}, {}, {})",
         rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position);
  if (rope() && rotary_dim() < 2) fail("--rotary-percent {} leaves no rotary channels for head dim {}", rotary_percent, kv_channels);
  if (attention_dropout < 0.f || attention_dropout >= 1.f) fail("--attention-dropout must be in [0, 1) (got {})", attention_dropout);
  if (hidden_dropout < 0.f || hidden_dropout >= 1.f) fail("--hidden-dropout must be in [0, 1) (got {})", hidden_dropout);
  if (norm_epsilon <= 0.f) fail("--norm-epsilon must be positive (got {})", norm_epsilon);
  if (init_method_std <= 0.f) fail("--init-method-std must be positive (got {})", init_method_std);
  if (vocab_size <= 0) fail("vocabulary size is unknown: set --vocab-size or a tokenizer");
}

int64_t TransformerConfig::num_parameters() const {
  int64_t h = hidden_size, norm = rmsnorm() ? h : 2 * h;
  int64_t attn = qkv_out() * h + (add_qkv_bias ? qkv_out() : 0) + num_attention_heads * kv_channels * h +
                 (add_bias_linear ? h : 0);
  int64_t mlp = fc1_out() * h + (add_bias_linear ? fc1_out() : 0) + ffn_hidden_size * h + (add_bias_linear ? h : 0);
  int64_t layer = attn + mlp + 2 * norm + (qk_layernorm ? 2 * (rmsnorm() ? kv_channels : 2 * kv_channels) : 0);
  int64_t emb = vocab_size * h + (position_embedding_type == "learned_absolute" ? max_position_embeddings * h : 0);
  int64_t out = untie_embeddings_and_output_weights ? vocab_size * h : 0;
  return emb + num_layers * layer + norm + out;
}

}  // namespace mt::model
