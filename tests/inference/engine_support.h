#pragma once
// What the engine tests share: tiny models of each family the trainer builds (random init with
// a large std, so logits are far from ties), the full-recompute reference (GPTModel::logits over
// the whole sequence per step), and a runner of prompts through the engine.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "inference/engine.h"
#include "inference/model_runner.h"
#include "model/gpt_model.h"
#include "support/tiny_models.h"

namespace mt::test {

// The families: Llama (GQA, RoPE, SwiGLU, RMSNorm), GPT-2 (learned positions, LayerNorm, tied
// output, biases), Qwen3 (qk-norm), MoE (routed experts with a shared expert).
inline std::vector<std::string> families() { return {"llama", "gpt2", "qwen3", "moe"}; }

inline model::TransformerConfig family_config(const std::string& f) {
  model::TransformerConfig c = tiny_llama_config(2);
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;  // head dim 8
  c.ffn_hidden_size = 48;
  c.seq_length = 40;
  c.vocab_size = 64;
  c.orig_vocab_size = 60;
  c.attention_dropout = c.hidden_dropout = 0.f;
  c.init_method_std = 0.25f;
  if (f == "gpt2") use_gpt2_blocks(c);
  if (f == "qwen3") c.qk_layernorm = true;
  if (f == "moe") {
    c.moe.num_experts = 4;
    c.moe.topk = 2;
    c.moe.moe_ffn_hidden_size = 16;
    c.moe.shared_expert_intermediate_size = 16;
  }
  return c;
}

inline std::vector<int32_t> make_prompt(int64_t n, uint32_t seed, int64_t V) {
  std::vector<int32_t> p;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(V)));
  }
  return p;
}

// One pass of a prompt's tokens ids[b, e) into `slot` at their positions, with the given logit rows
// (indices into the pass).
inline inference::StepBatch prompt_pass(const std::vector<int32_t>& ids, int32_t slot, int32_t b, int32_t e,
                                        std::vector<int32_t> logit_rows) {
  inference::StepBatch sb;
  for (int32_t i = b; i < e; ++i) {
    sb.tokens.push_back(ids[static_cast<size_t>(i)]);
    sb.slots.push_back(slot);
    sb.positions.push_back(i);
  }
  sb.logit_rows = std::move(logit_rows);
  return sb;
}

// Greedy continuation by full recomputation: argmax of the last row of m.logits(ids) per step.
inline std::vector<int32_t> reference_greedy(model::GPTModel& m, std::vector<int32_t> ids, int64_t n) {
  const int64_t V = m.config().orig_vocab_size, Vp = m.config().vocab_size;
  std::vector<int32_t> out;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t T = static_cast<int64_t>(ids.size());
    Tensor l = m.logits(ids, 1, T);
    const float* last = l.data<float>() + (T - 1) * Vp;
    const int32_t t = static_cast<int32_t>(std::max_element(last, last + V) - last);
    out.push_back(t);
    ids.push_back(t);
  }
  return out;
}

// Runs the requests through one engine (all submitted up front) and returns each one's result.
inline std::vector<inference::Completion> run_engine(model::GPTModel& m, std::vector<inference::Request> reqs,
                                                     const inference::EngineOptions& o) {
  inference::Engine e(m, o);
  std::vector<inference::Completion> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].on_done = [&out, i](inference::RequestId, const inference::Completion& c) { out[i] = c; };
    e.submit(std::move(reqs[i]));
  }
  e.run_until_idle();
  return out;
}

}  // namespace mt::test
