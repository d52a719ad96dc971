#pragma once
// The sections of pretrain's arguments (arguments.h), each a register/validate pair in its own
// file: arguments_<section>.cpp. arguments.cpp calls them: registration section by section, and
// validation in the order users have always seen the errors in (validate_args).
#include <cstdint>

#include "training/arguments.h"
#include "training/flag_parser.h"

namespace mt {

// Bounds of the count flags that are not model sizes (those are model::limits): beyond anything
// a run uses, and low enough that the products formed from them (samples = iterations x global
// batch, tokens = micro-batch x sequence) are checked, not wrapped, in validate_args.
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 32;
inline constexpr int64_t kMaxSteps = int64_t{1} << 48;  // iterations or samples
inline constexpr int64_t kMaxBucketElements = int64_t{1} << 40;
inline constexpr int64_t kMaxTimeoutMinutes = 366 * 24 * 60;  // a year; chrono converts it to ns

// Model: Megatron's alternative spellings, resolved into ModelArgs::model after parsing.
struct ModelAliases {
  bool disable_bias_linear = false, add_qkv_bias = false, use_rotary = false;
  bool recompute_activations = false;
};
void register_model_flags(FlagParser& p, ModelArgs& a, ModelAliases& r);
void resolve_model_aliases(ModelArgs& a, const ModelAliases& r);
void validate_model_args(Arguments& a);  // query groups and attention backend
// After the other sections: the derived model fields (padded vocabulary, seeds, defaults).
void finish_model_args(Arguments& a, int64_t tokenizer_vocab_size);
void validate_recompute_args(Arguments& a);  // needs the pipeline split

// Mixture of experts: the flags fill model.moe; validated right after the parallel sizes (expert
// parallelism is checked here), before finalize() checks the MoE shape itself.
void register_moe_flags(FlagParser& p, model::MoEConfig& m, MoEArgs& a);
void validate_moe_args(Arguments& a);

// FP8 (arguments_fp8.cpp): the flags fill model.fp8; validated after the pipeline split is known.
void register_fp8_flags(FlagParser& p, model::Fp8Config& f);
void validate_fp8_args(Arguments& a);

void register_data_flags(FlagParser& p, DataArgs& a);
void register_tiktoken_flags(FlagParser& p, data::TokenizerOptions& t);  // arguments_tiktoken.cpp
void validate_tiktoken_args(const Arguments& a);
void validate_data_args(const Arguments& a);

void register_training_flags(FlagParser& p, TrainingArgs& a);
void validate_training_args(Arguments& a);  // batch sizes (derives the global batch) and length
void validate_size_products(const Arguments& a);

void register_optimizer_flags(FlagParser& p, OptimizerArgs& a);
void validate_optimizer_args(const Arguments& a);  // schedule lengths, then validate_float_args
void validate_float_args(const Arguments& a);
// After the logging and checkpoint sections: loss scaling, and the weight-decay schedule's ends.
void finish_optimizer_args(Arguments& a);

// --decoupled-lr / --decoupled-min-lr (arguments_lr_groups.cpp): after the optimizer's checks.
void register_lr_group_flags(FlagParser& p, OptimizerArgs& a);
void validate_lr_group_args(const Arguments& a);

void register_logging_flags(FlagParser& p, LoggingArgs& a);
void validate_logging_args(const LoggingArgs& a);

void register_checkpoint_flags(FlagParser& p, CheckpointArgs& a);
void validate_checkpoint_args(const CheckpointArgs& a);

// Operations (arguments_ops.h): metrics sinks, timers' options, stopping, NaN policy, stragglers.
void register_ops_flags(FlagParser& p, OpsArgs& a);
void validate_ops_args(const OpsArgs& a);

void register_parallel_flags(FlagParser& p, ParallelArgs& a);

// Registers its flags under the groups they belong to (training, checkpointing, data).
void register_run_flags(FlagParser& p, RunArgs& a);
void validate_run_args(const Arguments& a);

void register_profile_flags(FlagParser& p, ProfileArgs& a);
void validate_profile_args(const ProfileArgs& a);

// Context parallelism and packed documents: after the parallel sizes, before the model's rules.
void register_context_flags(FlagParser& p, ContextArgs& a);
void validate_context_args(Arguments& a);
// validate_parallel_args (arguments.h) runs first; the pipeline rules after the model is known.
void validate_pipeline_args(Arguments& a);

}  // namespace mt
