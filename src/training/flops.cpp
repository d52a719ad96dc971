#include "training/flops.h"

namespace mt {

double flops_per_iteration(const model::TransformerConfig& c, int64_t batch, int64_t seq) {
  const double T = static_cast<double>(batch) * static_cast<double>(seq);
  const double S2 = static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(seq);
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.ffn_hidden_size);
  const double L = static_cast<double>(c.num_layers), V = static_cast<double>(c.vocab_size);
  const double n = static_cast<double>(c.num_attention_heads), d = static_cast<double>(c.kv_channels);
  const double g = static_cast<double>(c.num_query_groups), E = c.swiglu ? 3.0 : 2.0;
  return T * (6 * h * f * E * L + 6 * (h * (n * d + 2 * d * g) + n * d * h) * L + 6 * h * V) + S2 * 6 * n * d * L;
}

}  // namespace mt
