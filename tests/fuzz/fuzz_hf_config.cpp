// libFuzzer target: a HuggingFace config.json. What parse_hf_config accepts must describe a model
// megatron.cpp can build the tensor map of, and must survive the way back: the config written
// for it (both transformers styles) parses again to the same shape, experts and routing
// included. A mismatch aborts (a finding).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/hf_config.h"
#include "checkpoint/hf_weights.h"
#include "checkpoint/io_util.h"
#include "core/error.h"

namespace ck = mt::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ck::HfSpec spec;
  try {
    spec = ck::parse_hf_config(ck::parse_json_text(text, "config.json"), "config.json");
  } catch (const mt::Error&) {
    return 0;
  }
  // The tensor map has layers x (experts + 1) rules or so: only for small models.
  if (spec.cfg.num_layers * (spec.cfg.moe.num_experts + 1) <= 4096) (void)ck::hf_rules(spec);
  for (bool v5 : {false, true}) {
    if (!v5 && spec.arch == "qwen2_moe" && !spec.cfg.add_qkv_bias) continue;  // 4.x cannot say qkv_bias false
    const ck::HfSpec back = ck::parse_hf_config(ck::make_hf_config(spec, v5), "written config.json");
    const auto &a = spec.cfg, &b = back.cfg;
    if (a.num_layers != b.num_layers || a.hidden_size != b.hidden_size || a.ffn_hidden_size != b.ffn_hidden_size ||
        a.num_attention_heads != b.num_attention_heads || a.num_query_groups != b.num_query_groups ||
        a.kv_channels != b.kv_channels || back.vocab_size != spec.vocab_size || back.arch != spec.arch)
      std::abort();
    const auto &x = a.moe, &y = b.moe;
    if (x.num_experts != y.num_experts || x.topk != y.topk || x.moe_ffn_hidden_size != y.moe_ffn_hidden_size ||
        x.pre_softmax != y.pre_softmax || x.layer_pattern != y.layer_pattern ||
        x.shared_expert_intermediate_size != y.shared_expert_intermediate_size ||
        x.shared_expert_gate != y.shared_expert_gate || a.add_qkv_bias != b.add_qkv_bias)
      std::abort();
  }
  return 0;
}
