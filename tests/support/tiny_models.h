#pragma once
// The tiny models the model-layer tests build: the Llama and GPT-2 block choices, the 16-wide
// Llama they check gradients and recomputation on, and the random batches they feed it. Only
// model/ is needed (test_model links the model layer alone); the trainer's tiny run is in
// support/tiny_training.h. A builder fills what its callers share; each test sets its own
// differences (dropout, init, ...) right after the call.
#include <cstdint>

#include "model/config.h"
#include "model/gpt_model.h"

namespace mt::test {

// The Llama family's blocks: RMSNorm, SwiGLU, RoPE, no biases, untied output layer.
inline void use_llama_blocks(model::TransformerConfig& c) {
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.add_bias_linear = c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
}

// GPT-2's blocks in place of those: multi-head attention (no query groups), LayerNorm, GeLU MLP,
// learned absolute positions, biases, output layer tied to the embedding.
inline void use_gpt2_blocks(model::TransformerConfig& c) {
  c.num_query_groups = 0;
  c.normalization = "LayerNorm";
  c.swiglu = false;
  c.position_embedding_type = "learned_absolute";
  c.add_bias_linear = c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = false;
}

// The model tests' tiny Llama: `num_layers` layers 16 wide, 4 heads in 2 query groups, FFN 24,
// 8 tokens, a vocabulary of 30 padded to 32. Dropout and init stay at the config's defaults
// (0.1, 0.02) for the caller to set; not finalized.
inline model::TransformerConfig tiny_llama_config(int64_t num_layers) {
  model::TransformerConfig c;
  c.num_layers = num_layers;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 24;
  c.seq_length = 8;
  c.vocab_size = 32;
  c.orig_vocab_size = 30;
  use_llama_blocks(c);
  return c;
}

// B sequences of S tokens and labels below V from a linear congruential generator seeded with
// `seed`; every fifth position (i % 5 == 3) is masked out of the loss.
inline model::Batch random_batch(int64_t B, int64_t S, int64_t V, uint32_t seed) {
  model::Batch b;
  b.B = B;
  b.S = S;
  uint32_t x = seed;
  auto next = [&]() { return (x = x * 1664525u + 1013904223u) >> 8; };
  for (int64_t i = 0; i < B * S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(next() % static_cast<uint32_t>(V)));
    b.labels.push_back(static_cast<int32_t>(next() % static_cast<uint32_t>(V)));
    b.loss_mask.push_back(i % 5 == 3 ? 0.f : 1.f);
  }
  return b;
}

}  // namespace mt::test
