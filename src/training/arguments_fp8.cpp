// Pretrain's FP8 section: Megatron's --fp8-* flags (names and defaults of Megatron's
// TransformerConfig fp8 fields) into model.fp8, and the rules between them. mxfp8 and nvfp4 need
// Blackwell's block-scaled tensor cores; megatron.cpp targets Hopper and refuses them by name.
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "training/arguments_sections.h"

namespace mt {

namespace {
constexpr int64_t kMaxAmaxHistory = 1 << 16;  // TE keeps it on the device: far beyond any real run
constexpr int64_t kMaxMargin = 64;            // scale / 2^margin: more than 64 only flushes to zero
}  // namespace

void register_fp8_flags(FlagParser& p, model::Fp8Config& f) {
  p.custom("--fp8-format", true,
           [&f](const std::string& v) {
             if (v == "e5m2")
               fail("--fp8-format e5m2 is not a Megatron choice: use e4m3, or hybrid (E4M3 forward, E5M2 gradients)");
             if (v != "e4m3" && v != "hybrid") fail("--fp8-format got '{}'; expected e4m3 or hybrid", v);
             f.enabled = true;
             f.hybrid = v == "hybrid";
           },
           "FP8 GEMMs in the transformer layers: e4m3 everywhere, or hybrid (E4M3 forward, E5M2 gradients)");
  p.custom("--fp8-recipe", true,
           [&f](const std::string& v) {
             if (v == "mxfp8")
               fail("--fp8-recipe mxfp8 needs Blackwell (sm_100) block-scaled tensor cores; on Hopper use delayed, "
                    "tensorwise or blockwise");
             if (v == "custom")
               fail("--fp8-recipe custom loads a Python quantizer factory, which megatron.cpp cannot run; use delayed, "
                    "tensorwise or blockwise");
             if (v == "delayed") f.recipe = model::Fp8Recipe::Delayed;
             else if (v == "tensorwise") f.recipe = model::Fp8Recipe::Tensorwise;
             else if (v == "blockwise") f.recipe = model::Fp8Recipe::Blockwise;
             else fail("--fp8-recipe got '{}'; expected delayed, tensorwise or blockwise", v);
           },
           "scaling recipe: delayed (default; amax history), tensorwise (current per-tensor amax) or blockwise "
           "(1x128 activation tiles, 128x128 weight blocks)");
  p.value("--fp8-amax-history-len", &f.amax_history_len, "delayed scaling: amaxes kept per tensor (default 1)",
          {1, kMaxAmaxHistory});
  p.custom("--fp8-amax-compute-algo", true,
           [&f](const std::string& v) {
             if (v != "max" && v != "most_recent") fail("--fp8-amax-compute-algo got '{}'; expected max or most_recent", v);
             f.amax_max = v == "max";
           },
           "delayed scaling: the amax a scale comes from, the history's max or its most_recent (default)");
  p.value("--fp8-margin", &f.margin, "delayed scaling: scale = fp8_max / amax / 2^margin (default 0)",
          {0, kMaxMargin});
  p.store_false("--no-fp8-wgrad", &f.wgrad, "run the weight-gradient GEMMs in the activation type, not FP8");
  p.store_false("--disable-fp8-wgrad", &f.wgrad, "same as --no-fp8-wgrad");
  p.store_true("--fp8-param-gather", &f.param_gather,
               "with --use-distributed-optimizer: each rank casts its updated fp32 shard of the FP8 linears' weights "
               "to FP8 and the codes are all-gathered (1 byte a parameter), then used by the FP8 GEMMs as they are");
  p.store_true("--first-last-layers-bf16", &f.first_last_layers_bf16,
               "keep the first and last transformer layers out of FP8 (not with --fp8-recipe delayed)");
  p.value("--num-layers-at-start-in-bf16", &f.num_layers_at_start_in_bf16,
          "with --first-last-layers-bf16: layers at the start kept out of FP8 (default 1)", {0, model::limits::kLayers});
  p.value("--num-layers-at-end-in-bf16", &f.num_layers_at_end_in_bf16,
          "with --first-last-layers-bf16: layers at the end kept out of FP8 (default 1)", {0, model::limits::kLayers});
  p.custom("--fp8-interval", true, [](const std::string&) {},
           "accepted and ignored, as Transformer Engine has since v1.8 (scales are updated every step)");
  for (const char* flag : {"--fp4-format", "--fp4-recipe", "--fp4-param-gather"})
    p.unsupported(flag, "NVFP4 needs Blackwell (sm_100) tensor cores; use --fp8-format on Hopper");
  for (const char* flag : {"--fp8-dot-product-attention", "--fp8-multi-head-attention"})
    p.unsupported(flag, "attention stays in bf16 (as in Transformer Engine's default recipe)");
}

void validate_fp8_args(Arguments& a) {
  const model::Fp8Config& f = a.model.fp8;
  if (!f.enabled) {
    for (const char* flag : {"--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin",
                             "--no-fp8-wgrad", "--disable-fp8-wgrad", "--fp8-param-gather", "--first-last-layers-bf16",
                             "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"})
      if (a.was_given(flag)) fail("{} needs --fp8-format (e4m3 or hybrid): it configures FP8 training", flag);
    return;
  }
  if (f.recipe != model::Fp8Recipe::Delayed)
    for (const char* flag : {"--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin"})
      if (a.was_given(flag))
        fail("{} applies to --fp8-recipe delayed only ({} scaling uses each tensor's own amax)", flag,
             model::fp8_recipe_name(f.recipe));
  // The FP8 cast runs on the distributed optimizer's fp32 shards (parallel/fp8_param_gather.h).
  if (f.param_gather && !a.use_distributed_optimizer)
    fail("--fp8-param-gather needs --use-distributed-optimizer (Megatron's rule: the optimizer's fp32 shards are "
         "cast to FP8 and gathered): add --use-distributed-optimizer, or drop --fp8-param-gather");
  // One scale per weight: blockwise's 128x128 blocks would straddle the optimizer's shards.
  if (f.param_gather && f.recipe == model::Fp8Recipe::Blockwise)
    fail("--fp8-param-gather works with the per-tensor recipes (one scale per weight, from its amax over the "
         "shards): use --fp8-recipe tensorwise or delayed, or drop --fp8-param-gather for blockwise");
  if (!f.first_last_layers_bf16) {
    for (const char* flag : {"--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"})
      if (a.was_given(flag)) fail("{} needs --first-last-layers-bf16", flag);
    return;
  }
  if (f.recipe == model::Fp8Recipe::Delayed)
    fail("--first-last-layers-bf16 does not work with --fp8-recipe delayed (Megatron's rule): use tensorwise or "
         "blockwise");
  const int64_t per_stage = a.model.num_layers / a.pipeline_model_parallel_size;
  for (auto [flag, n] : {std::pair{"--num-layers-at-start-in-bf16", f.num_layers_at_start_in_bf16},
                         std::pair{"--num-layers-at-end-in-bf16", f.num_layers_at_end_in_bf16}})
    if (n > per_stage)
      fail("{} ({}) must be at most the layers per pipeline stage ({})", flag, n, per_stage);
}

}  // namespace mt
