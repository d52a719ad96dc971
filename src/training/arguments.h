#pragma once
// Megatron-LM's command-line arguments for pretrain/generate: the same names, defaults and
// validation rules. Flags may also come from --config FILE.yaml (same keys, with dashes or
// underscores); flags on the command line override the file.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/ddp.h"
#include "parallel/pipeline_layout.h"
#include "training/arguments_ops.h"
#include "training/flag_parser.h"
#include "training/moe_layer_freq.h"

namespace mt {

class FlagParser;

// Bounds shared by the commands' count flags (FlagParser IntRange): far above any real run, low
// enough that the ints and products made from them cannot wrap.
inline constexpr int64_t kMaxThreads = int64_t{1} << 12;         // --num-threads: an OpenMP count (int)
inline constexpr int64_t kMaxParallel = int64_t{1} << 16;        // ranks along one parallel dimension (int)
inline constexpr int64_t kMaxVocabMultiple = int64_t{1} << 20;   // --make-vocab-size-divisible-by

// Arguments come in sections, one per layer they configure. Each section has its flags
// register/validate pair (arguments_<section>.cpp) and converts into the options struct its
// layer takes. Arguments derives from all of them, so a field reads as args.train_iters
// wherever the whole set is at hand, while a layer's setup can take just its section.

// Model shape, precision and attention (arguments_model.cpp) -> model::TransformerConfig.
struct ModelArgs {
  model::TransformerConfig model;
  int64_t make_vocab_size_divisible_by = 128;
  bool group_query_attention = false;
  std::string attention_backend = "auto";   // --attention-backend auto|flash|fused (GPU attention)
  bool nondeterministic_attention = false;  // --nondeterministic-attention (cuDNN's dQ-atomics backward)
};

// Mixture of experts (arguments_moe.cpp): the flags fill ModelArgs::model.moe; these are the ones
// that need the rest of the arguments before they mean anything.
struct MoEArgs {
  MoELayerFreq moe_layer_freq;     // --moe-layer-freq, made a per-layer pattern once --num-layers is known
  bool moe_use_upcycling = false;  // --moe-use-upcycling: load a dense checkpoint into an MoE model
};

// Tokenizer and datasets (arguments_data.cpp) -> data::TokenizerOptions, data::GPTDataOptions.
struct DataArgs {
  data::TokenizerOptions tokenizer;
  data::GPTDataOptions data;
  bool eod_mask_loss = false;
};

// Batching, length of training and where it runs (arguments_training.cpp).
struct TrainingArgs {
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;  // 0 -> micro_batch_size * dp
  int64_t train_iters = 0, train_samples = 0;
  uint64_t seed = 1234;
  int64_t exit_interval = 0;
  std::string device = "auto";  // --device cpu|cuda|auto
  int64_t num_threads = 0;      // --num-threads (0: OMP/OpenBLAS default)
};

// Optimizer, learning-rate and weight-decay schedule, clipping, fp16 loss scaling
// (arguments_optimizer.cpp) -> optim::OptimizerConfig, optim::LRScheduleConfig,
// optim::GradScalerConfig.
struct OptimizerArgs {
  optim::OptimizerConfig optimizer;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  int64_t lr_decay_iters = 0, lr_decay_samples = 0;
  int64_t lr_warmup_iters = 0, lr_warmup_samples = 0;
  double lr_warmup_fraction = -1;  // unset
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";
  int64_t lr_wsd_decay_iters = 0, lr_wsd_decay_samples = 0;
  double start_weight_decay = -1, end_weight_decay = -1;
  std::string weight_decay_incr_style = "constant";
  double clip_grad = 1.0;
  double decoupled_lr = -1, decoupled_min_lr = -1;  // unset (arguments_lr_groups.cpp)
  // --fp16 loss scaling (--loss-scale: static; unset: dynamic with the other four flags).
  optim::GradScalerConfig grad_scaler;
};

// Log line and evaluation (arguments_logging.cpp).
struct LoggingArgs {
  int64_t log_interval = 100;
  // Megatron's --timing-log-level: its timers (training/timers.h), printed each log interval;
  // 1: once-per-iteration phases, 2: also per-micro-batch ones (--timing-log-option in OpsArgs).
  int64_t timing_log_level = 0;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  bool eval_at_start = false;    // --eval-at-start (megatron.cpp): evaluate before the first step
  bool log_progress_bar = true;  // a progress bar when stdout is a terminal
};

// Saving and loading (arguments_checkpoint.cpp) -> checkpoint::SaveOptions, checkpoint::LoadOptions.
struct CheckpointArgs {
  std::string save, load;
  int64_t save_interval = 0;
  bool no_save_optim = false, no_save_rng = false, no_load_optim = false, no_load_rng = false, finetune = false;
  bool async_save = false;             // --async-save: write checkpoints in the background
  int64_t save_retain_interval = 0;    // keep only checkpoints of multiples of this (and the latest)
  std::string ckpt_format = "native";  // --ckpt-format: megatron.cpp's sharded safetensors format
  bool auto_detect_ckpt_format = false;
};

// Parallelism (arguments_parallel.cpp) -> parallel::PipelineOptions, parallel::DDPOptions.
// world_size comes from the launcher's environment (set before validate_args); data_parallel_size
// is derived from it. Context parallelism's size lives here; its group in parallel::ProcessGroups.
struct ParallelArgs {
  int64_t tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, context_parallel_size = 1;
  // Pipeline split (0: not given): uneven first/last stages, and virtual stages per rank
  // (interleaved schedule) given as layers per virtual stage or as their number.
  int64_t decoder_first_pipeline_num_layers = 0, decoder_last_pipeline_num_layers = 0;
  int64_t num_layers_per_virtual_pipeline_stage = 0, num_virtual_stages_per_pipeline_rank = 0;
  int64_t virtual_pipeline_model_parallel_size = 1;     // derived
  int64_t microbatch_group_size_per_vp_stage = 0;       // interleaved: 0 -> PP (Megatron's default)
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;  // 0: = tensor_model_parallel_size (Megatron's default)
  bool sequence_parallel = false, use_distributed_optimizer = false;
  bool tp_comm_overlap = false;  // overlap SP collectives with the GEMMs (needs --sequence-parallel)
  int64_t world_size = 1;
  int64_t data_parallel_size = 1;
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;               // elements; 0: Megatron's default
  int64_t distributed_timeout_minutes = 10;  // bounds every rendezvous and collective
  std::string distributed_backend = "nccl";  // CPU tensors always use Gloo
};

// Long sequences (arguments_context.cpp): context parallelism's attention form, and packed
// documents (Megatron's get_batch masks: positions and attention restart after each EOD).
struct ContextArgs {
  std::string cp_comm_type = "p2p";                 // p2p | a2a | allgather | a2a+p2p
  std::vector<std::string> hierarchical_cp_sizes;   // a2a+p2p: "A P" (all-to-all size, ring size)
  int64_t cp_a2a_size = 1;                          // derived: the all-to-all group's size
  bool reset_position_ids = false, reset_attention_mask = false;
};


// How the run proceeds around the training loop (arguments_run.cpp): evaluation-only runs,
// missing checkpoints, the sample order, and printing the configuration.
struct RunArgs {
  bool skip_train = false;                  // --skip-train: load, evaluate validation and test, exit
  bool exit_on_missing_checkpoint = false;  // --exit-on-missing-checkpoint: no checkpoint in --load is an error
  std::string dataloader_type = "single";   // --dataloader-type single|cyclic
  bool print_config = false;                // --print-config / --dry-run: print the resolved arguments, exit
  bool use_checkpoint_args = false;         // --use-checkpoint-args: the model and tokenizer from --load's checkpoint
  std::vector<std::string> rampup_batch_size;  // --rampup-batch-size START INCREMENT SAMPLES (batch_schedule.h)
  std::string step_batch_size_schedule;        // --step-batch-size-schedule "THRESHOLD:BS ..."
};

// Profiler hooks (arguments_profile.cpp), Megatron's: cudaProfilerStart before iteration
// profile_step_start + 1 and cudaProfilerStop after iteration profile_step_end, on the listed ranks.
struct ProfileArgs {
  bool profile = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<std::string> profile_ranks = {"0"};
  bool nvtx_ranges = false;  // NVTX ranges per layer and pipeline action (also on with --profile)
  bool record_memory_history = false;                  // core/memory_timeline.h
  std::string memory_snapshot_path = "snapshot.pickle";  // Megatron's default name; JSON lines here
};

struct Arguments : ModelArgs, MoEArgs, DataArgs, TrainingArgs, OptimizerArgs, LoggingArgs, CheckpointArgs, ParallelArgs,
                   OpsArgs, RunArgs, ProfileArgs, ContextArgs {
  std::vector<std::string> given;  // flag names given by the user (for conflict checks)
  bool was_given(const char* flag) const;
};

// Parses pretrain flags (and --config). Throws mt::Error naming the flag on any problem.
Arguments parse_pretrain_args(const std::vector<std::string>& argv);
// The same for another command taking pretrain's flags (`megatron estimate`): `extra` registers
// that command's own flags in the same parser, so typos, --config and --help cover them too.
using ExtraFlags = std::function<void(FlagParser&)>;
Arguments parse_pretrain_args(const std::vector<std::string>& argv, const std::string& command,
                              const ExtraFlags& extra);
// Validates cross-flag rules and fills derived values (Megatron's validate_args).
void validate_args(Arguments& a, int64_t tokenizer_vocab_size);
// The parallel-size rules (the first part of validate_args, arguments_parallel.cpp): sizes,
// world-size divisibility, derived DP.
void validate_parallel_args(Arguments& a);
std::string pretrain_help(const std::string& command = "pretrain", const ExtraFlags& extra = {});
// Every flag pretrain registers, and those also rejected by the Megatron flag table (none, when
// the table and the sections agree): for the table's consistency test and its document.
std::vector<std::string> pretrain_flag_names();
// Every bound pretrain flag's value in `a` (FlagParser::current_values): --print-config, checkpoints.
std::vector<FlagParser::Current> pretrain_current_values(const Arguments& a);
std::vector<std::string> pretrain_rejected_registered();

// The sections' conversions into their layers' options.
parallel::PipelineOptions pipeline_options(const ParallelArgs& a);  // for parallel::PipelineLayout
parallel::DDPOptions ddp_options(const ParallelArgs& a);
// Iteration-based runs convert to samples as Megatron does.
optim::LRScheduleConfig schedule_config(const OptimizerArgs& o, const TrainingArgs& t);
checkpoint::SaveOptions save_options(const CheckpointArgs& c);

// Generic flag parsing used by other subcommands (generate, ...): a table of flags with setters.
struct FlagTable;

}  // namespace mt
