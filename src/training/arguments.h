#pragma once
// Megatron-LM's command-line arguments for pretrain/generate: the same names, defaults and
// validation rules. Flags may also come from --config FILE.yaml (same keys, with dashes or
// underscores); flags on the command line override the file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/pipeline_layout.h"

namespace mt {

// Bounds shared by the commands' count flags (FlagParser IntRange): far above any real run, low
// enough that the ints and products made from them cannot wrap.
inline constexpr int64_t kMaxThreads = int64_t{1} << 12;         // --num-threads: an OpenMP count (int)
inline constexpr int64_t kMaxParallel = int64_t{1} << 16;        // ranks along one parallel dimension (int)
inline constexpr int64_t kMaxVocabMultiple = int64_t{1} << 20;   // --make-vocab-size-divisible-by

struct Arguments {
  model::TransformerConfig model;
  int64_t make_vocab_size_divisible_by = 128;
  bool group_query_attention = false;
  data::TokenizerOptions tokenizer;
  data::GPTDataOptions data;
  bool eod_mask_loss = false;

  // Batching and length of training.
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;  // 0 -> micro_batch_size * dp
  int64_t train_iters = 0, train_samples = 0;

  // Optimizer and schedule.
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
  // --fp16 loss scaling (--loss-scale: static; unset: dynamic with the other four flags).
  optim::GradScalerConfig grad_scaler;

  // Logging, evaluation, checkpoints.
  uint64_t seed = 1234;
  int64_t log_interval = 100;
  // Megatron's --timing-log-level: >= 1 times every op category on the GPU too (CUDA events;
  // a few percent of step time), printed as a breakdown at the end. The CPU always times.
  int64_t timing_log_level = 0;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  std::string save, load;
  int64_t save_interval = 0;
  bool no_save_optim = false, no_save_rng = false, no_load_optim = false, no_load_rng = false, finetune = false;
  bool async_save = false;             // --async-save: write checkpoints in the background
  int64_t save_retain_interval = 0;    // keep only checkpoints of multiples of this (and the latest)
  std::string ckpt_format = "native";  // --ckpt-format: megatron.cpp's sharded safetensors format
  bool auto_detect_ckpt_format = false;
  int64_t exit_interval = 0;
  bool eval_at_start = false;      // --eval-at-start (megatron.cpp): evaluate before the first step
  bool log_progress_bar = true;   // a progress bar when stdout is a terminal
  std::string device = "auto";    // --device cpu|cuda|auto
  std::string attention_backend = "auto";  // --attention-backend auto|flash|fused (GPU attention)
  bool nondeterministic_attention = false;  // --nondeterministic-attention (cuDNN's dQ-atomics backward)
  int64_t num_threads = 0;        // --num-threads (0: OMP/OpenBLAS default)

  // Parallelism. world_size comes from the launcher's environment (set before validate_args);
  // data_parallel_size is derived from it.
  int64_t tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, context_parallel_size = 1;
  // Pipeline split (0: not given): uneven first/last stages, and virtual stages per rank
  // (interleaved schedule) given as layers per virtual stage or as their number.
  int64_t decoder_first_pipeline_num_layers = 0, decoder_last_pipeline_num_layers = 0;
  int64_t num_layers_per_virtual_pipeline_stage = 0, num_virtual_stages_per_pipeline_rank = 0;
  int64_t virtual_pipeline_model_parallel_size = 1;     // derived
  int64_t microbatch_group_size_per_vp_stage = 0;       // interleaved: 0 -> PP (Megatron's default)
  int64_t expert_model_parallel_size = 1;
  bool sequence_parallel = false, use_distributed_optimizer = false;
  bool tp_comm_overlap = false;  // overlap SP collectives with the GEMMs (needs --sequence-parallel)
  int64_t world_size = 1;
  int64_t data_parallel_size = 1;
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;               // elements; 0: Megatron's default
  int64_t distributed_timeout_minutes = 10;  // bounds every rendezvous and collective
  std::string distributed_backend = "nccl";  // CPU tensors always use Gloo

  std::vector<std::string> given;  // flag names given by the user (for conflict checks)
};

// Parses pretrain flags (and --config). Throws mt::Error naming the flag on any problem.
Arguments parse_pretrain_args(const std::vector<std::string>& argv);
// Validates cross-flag rules and fills derived values (Megatron's validate_args).
void validate_args(Arguments& a, int64_t tokenizer_vocab_size);
// The parallel-size rules (part of validate_args): sizes, world-size divisibility, derived DP.
void validate_parallel_args(Arguments& a);
// Parts of validate_args (arguments_numeric.cpp): the float flags' ranges (NaN-safe), and the
// sizes formed from several count flags (samples, tokens per micro-batch) checked for overflow.
void validate_float_args(const Arguments& a);
void validate_size_products(const Arguments& a);
std::string pretrain_help();
// The pipeline-split flags, for parallel::PipelineLayout.
parallel::PipelineOptions pipeline_options(const Arguments& a);

// Generic flag parsing used by other subcommands (generate, ...): a table of flags with setters.
struct FlagTable;

}  // namespace mt
