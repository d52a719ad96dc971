#pragma once
// The mixture-of-experts part of HuggingFace configs: Mixtral, Qwen2-MoE and Qwen3-MoE <->
// model::MoEConfig.
//   num_local_experts (Mixtral; Qwen3-MoE as transformers 5 writes it) or num_experts -> num_experts
//   num_experts_per_tok -> topk; router_aux_loss_coef -> aux_loss_coeff
//   Mixtral's intermediate_size / Qwen's moe_intermediate_size -> moe_ffn_hidden_size
//   Qwen2-MoE: shared_expert_intermediate_size, and its sigmoid gate (always there) -> shared expert
//   routing: softmax over all experts, top-k, renormalised (Mixtral; Qwen's norm_topk_prob true)
//     is Megatron's softmax over the top-k scores (pre_softmax false); not renormalised (Qwen's
//     norm_topk_prob false) is --moe-router-pre-softmax
//   Qwen's decoder_sparse_step and mlp_only_layers -> the layer pattern: layer L is MoE unless
//     listed in mlp_only_layers, when (L + 1) % decoder_sparse_step == 0 (transformers'
//     Qwen2MoeDecoderLayer); its dense layers have intermediate_size
#include <nlohmann/json.hpp>

#include "checkpoint/hf_config.h"
#include "checkpoint/json_fields.h"

namespace mt::checkpoint {

bool is_hf_moe_arch(const std::string& arch);  // mixtral | qwen2_moe | qwen3_moe
// The dense architecture whose attention an MoE one shares (mistral, qwen2, qwen3).
std::string hf_attention_arch(const std::string& arch);

// Fills spec.cfg.moe from the config of an MoE architecture (spec.cfg's other fields read).
void read_hf_moe(const JsonFields& f, HfSpec& spec);
// Writes the MoE keys of spec.arch into `j` (transformers 5.x style when v5); throws naming what
// the architecture cannot hold.
void write_hf_moe(const HfSpec& spec, bool v5, nlohmann::json& j);
// The MoE architecture a model with experts corresponds to: Qwen3-MoE with q/k norm, Qwen2-MoE
// with a shared expert, otherwise Mixtral.
std::string infer_hf_moe_arch(const model::TransformerConfig& c);

}  // namespace mt::checkpoint
