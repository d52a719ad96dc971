// Pretrain's mixture-of-experts section: Megatron's --num-experts / --moe-* flags (names and
// defaults of Megatron's TransformerConfig) into model.moe, and the rules that need the other
// sections (parallel sizes, biases, --save). The MoE shape itself is checked by
// TransformerConfig::finalize, whatever its source (flags, a checkpoint, an HF config.json).
#include <string>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "training/arguments_sections.h"

namespace mt {
namespace {
namespace limits = model::limits;

// A flag Megatron accepts and megatron.cpp takes without a setting: what it asks for is how
// megatron.cpp always works, or only a speed choice of Megatron's implementation.
void accepted(FlagParser& p, const char* name, const char* why) {
  p.custom(name, false, [](const std::string&) {}, std::string("accepted: ") + why);
}

}  // namespace

void register_moe_flags(FlagParser& p, model::MoEConfig& m, MoEArgs& a) {
  p.value("--num-experts", &m.num_experts, "number of experts in each MoE layer (default: none, a dense model)",
          {1, limits::kExperts});
  p.value("--moe-ffn-hidden-size", &m.moe_ffn_hidden_size, "hidden size of each expert (default --ffn-hidden-size)",
          {1, limits::kFfnHidden});
  p.custom("--moe-layer-freq", true,
           [&a](const std::string& v) { a.moe_layer_freq = parse_moe_layer_freq(v); },
           "which layers are MoE: N (layers 0, N, 2N, ...; default 1) or a pattern such as '([1]*3+[0]*1)*3' with "
           "one 0 (dense) or 1 (MoE) per layer");
  p.value("--moe-router-topk", &m.topk, "experts each token is routed to (default 2)", {1, limits::kExperts});
  p.value("--moe-router-score-function", &m.score_function, "router score function (default softmax)",
          {"softmax", "sigmoid"});
  p.store_true("--moe-router-pre-softmax", &m.pre_softmax,
               "softmax over all experts before the top-k (default: softmax over the top-k scores)");
  p.value("--moe-router-topk-scaling-factor", &m.topk_scaling_factor,
          "scale of the top-k routing weights (default none)");
  p.custom("--moe-router-dtype", true,
           [&m](const std::string& v) {
             if (v == "fp64")
               fail("--moe-router-dtype fp64 is not supported: megatron.cpp routes in fp32 (use fp32 or leave it out)");
             if (v != "fp32") fail("--moe-router-dtype got '{}'; expected fp32", v);
             m.router_dtype = v;
           },
           "accepted as fp32: routing and the weighted sum of the experts always run in fp32");
  p.value("--moe-router-num-groups", &m.num_groups, "expert groups for group-limited routing", {1, limits::kExperts});
  p.value("--moe-router-group-topk", &m.group_topk, "groups each token may use (group-limited routing)",
          {1, limits::kExperts});
  p.custom("--moe-router-load-balancing-type", true,
           [&m](const std::string& v) {
             if (v == "global_aux_loss" || v == "quantile_balancing")
               fail("--moe-router-load-balancing-type {} is not implemented yet; use aux_loss, seq_aux_loss, sinkhorn "
                    "or none",
                    v);
             if (v != "aux_loss" && v != "seq_aux_loss" && v != "sinkhorn" && v != "none")
               fail("--moe-router-load-balancing-type got '{}'; expected aux_loss, seq_aux_loss, sinkhorn or none", v);
             m.load_balancing_type = v;
           },
           "aux_loss (default; GShard/Switch, per micro-batch), seq_aux_loss (per sequence, DeepSeek-V2), sinkhorn "
           "or none");
  p.value("--moe-aux-loss-coeff", &m.aux_loss_coeff, "load-balancing loss coefficient (default 0; 1e-2 is a start)");
  p.value("--moe-z-loss-coeff", &m.z_loss_coeff, "router z-loss coefficient (default none; 1e-3 is a start)");
  p.store_true("--moe-router-enable-expert-bias", &m.enable_expert_bias,
               "aux-loss-free balancing: a per-expert bias added to the scores for the top-k choice (needs sigmoid)");
  p.value("--moe-router-bias-update-rate", &m.bias_update_rate, "update rate of the expert bias (default 1e-3)");
  p.value("--moe-shared-expert-intermediate-size", &m.shared_expert_intermediate_size,
          "hidden size of the shared expert every token goes through (default: none)", {1, limits::kFfnHidden});
  p.store_true("--moe-shared-expert-gate", &m.shared_expert_gate,
               "scale the shared expert's output by sigmoid(x . g) (Qwen2-MoE)");
  accepted(p, "--moe-shared-expert-overlap", "the shared expert's order with the dispatch does not change results");
  p.value("--moe-expert-capacity-factor", &m.capacity_factor,
          "tokens per expert as a multiple of the even share; more are dropped (default: none, dropless)");
  p.store_true("--moe-pad-expert-input-to-capacity", &m.pad_to_capacity,
               "pad every expert's tokens to the capacity (needs --moe-expert-capacity-factor)");
  p.value("--moe-token-drop-policy", &m.drop_policy, "which tokens over capacity are dropped (default probs)",
          {"probs", "position"});
  p.custom("--moe-token-dispatcher-type", true,
           [&m](const std::string& v) {
             if (v == "flex")
               fail("--moe-token-dispatcher-type flex (DeepEP / HybridEP) is not supported; use allgather or alltoall");
             if (v != "allgather" && v != "alltoall")
               fail("--moe-token-dispatcher-type got '{}'; expected allgather or alltoall", v);
             m.token_dispatcher = v;
           },
           "how tokens reach the experts' ranks: allgather (default) or alltoall");
  p.store_true("--moe-grouped-gemm", &m.grouped_gemm, "run each rank's experts as one grouped GEMM");
  p.store_true("--moe-permute-fusion", &m.permute_fusion, "fused token permutation");
  accepted(p, "--moe-router-fusion", "the router's top-k and aux loss are computed together");
  accepted(p, "--moe-per-layer-logging", "no effect");
  p.store_true("--moe-use-upcycling", &a.moe_use_upcycling,
               "load a dense checkpoint, turn each MLP into experts, and save the MoE model (needs --save)");
  p.unsupported("--moe-input-jitter-eps", "input jitter is not implemented yet");
  p.unsupported("--moe-router-topk-limited-devices",
                "Megatron deprecated it; use --moe-router-num-groups and --moe-router-group-topk");
  p.unsupported("--moe-layer-recompute", "recomputing MoE layers is not implemented yet");
  for (const char* f : {"--moe-enable-deepep", "--moe-flex-dispatcher-backend"})
    p.unsupported(f, "the flex dispatcher (DeepEP / HybridEP) is not implemented; use allgather or alltoall");
  for (const char* f : {"--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization"})
    p.unsupported(f, "padding expert tokens for FP8 GEMM alignment is not implemented (FP8 expert GEMMs run unpadded)");
  for (const char* f : {"--moe-extended-tp", "--overlap-moe-expert-parallel-comm", "--moe-apply-probs-on-input",
                        "--moe-router-force-load-balancing", "--moe-upcycling-granularity", "--moe-token-dropping"})
    p.unsupported(f, "not implemented yet");
}

void validate_moe_args(Arguments& a) {
  auto& m = a.model.moe;
  const int64_t ep = a.expert_model_parallel_size, tp = a.tensor_model_parallel_size;
  if (!m.enabled()) {
    // Megatron ignores --moe-* flags on a dense model; a user giving one expects experts.
    for (const auto& f : a.given)
      if (f.rfind("--moe-", 0) == 0) fail("{} needs --num-experts (it configures mixture-of-experts layers)", f);
    if (ep > 1) fail("--expert-model-parallel-size {} needs --num-experts (a model with experts)", ep);
    return;
  }
  // An HF config may have set the pattern already (apply_hf_config checks a given flag against it).
  if (a.was_given("--moe-layer-freq")) m.layer_pattern = moe_layer_pattern(a.moe_layer_freq, a.model.num_layers);
  // Megatron's rule: a top-1 softmax over one score is constant 1, so the router would get no gradient.
  if (m.topk == 1 && m.score_function == "softmax" && !m.pre_softmax && m.load_balancing_type != "sinkhorn")
    fail("--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax (a softmax over the top "
         "1 score is always 1 and the router would not learn)");
  // Megatron's default expert TP is the dense TP; any size that folds into the stage works.
  const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
  if (a.model.add_bias_linear && etp > 1)
    fail("mixture-of-experts layers with linear biases need --expert-tensor-parallel-size 1 (Megatron's rule; the "
         "experts' TP size is {}{}): add --disable-bias-linear or --expert-tensor-parallel-size 1",
         etp, a.was_given("--expert-tensor-parallel-size") ? "" : ", --tensor-model-parallel-size by default");
  // Each TP rank routes its own sequence shard; without SP they would all route the same tokens.
  if (tp > 1 && !a.sequence_parallel)
    fail("mixture-of-experts layers with --tensor-model-parallel-size {} need --sequence-parallel (Megatron's rule)",
         tp);
  if (m.num_experts % ep != 0)
    fail("--num-experts ({}) must be divisible by --expert-model-parallel-size ({})", m.num_experts, ep);
  // MoE parallel folding: the TP x CP x DP ranks of a pipeline stage hold ETP x EP x EDP experts' ranks.
  const int64_t dense = checked_product({tp, a.context_parallel_size, a.data_parallel_size},
                                        "--tensor-model-parallel-size x --context-parallel-size x data-parallel size");
  const int64_t expert = checked_mul(etp, ep, "--expert-tensor-parallel-size x --expert-model-parallel-size");
  if (dense % expert != 0)
    fail("--expert-tensor-parallel-size ({}) x --expert-model-parallel-size ({}) must divide the {} ranks of a "
         "pipeline stage (tensor x context x data parallel)",
         etp, ep, dense);
  a.expert_tensor_parallel_size = etp;
  if (a.moe_use_upcycling) {
    if (a.save.empty()) fail("--moe-use-upcycling needs --save (the upcycled model is written there)");
    // As Megatron: the dense checkpoint's optimizer state and RNG do not fit the MoE model.
    if (!a.no_load_optim || !a.no_load_rng) log_info("--moe-use-upcycling: enabling --no-load-optim and --no-load-rng");
    a.no_load_optim = a.no_load_rng = true;
  }
}

}  // namespace mt
