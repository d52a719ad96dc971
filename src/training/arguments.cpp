#include "training/arguments.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "model/gpt_model.h"
#include "parallel/schedule.h"
#include "training/flag_parser.h"

namespace mt {
namespace {

namespace limits = model::limits;

// Bounds of the count flags that are not model sizes (those are model::limits): beyond anything
// a run uses, and low enough that the products formed from them (samples = iterations x global
// batch, tokens = micro-batch x sequence) are checked, not wrapped, in validate_args.
constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 32;
constexpr int64_t kMaxSteps = int64_t{1} << 48;          // iterations or samples
constexpr int64_t kMaxBucketElements = int64_t{1} << 40;
constexpr int64_t kMaxTimeoutMinutes = 366 * 24 * 60;    // a year; chrono converts it to ns

struct Registered {
  FlagParser parser{"pretrain"};
  bool disable_bias_linear = false, add_qkv_bias = false, use_rotary = false;
  bool recompute_activations = false;
};

void register_flags(FlagParser& p, Arguments& a, Registered& r) {
  auto& m = a.model;
  // Model shape.
  p.value("--num-layers", &m.num_layers, "number of transformer layers", {1, limits::kLayers});
  p.value("--hidden-size", &m.hidden_size, "transformer hidden size", {1, limits::kHidden});
  p.value("--ffn-hidden-size", &m.ffn_hidden_size, "MLP hidden size (default 4*h; SwiGLU: 8h/3 rounded to 64)", {1, limits::kFfnHidden});
  p.value("--num-attention-heads", &m.num_attention_heads, "number of attention heads", {1, limits::kHeads});
  p.store_true("--group-query-attention", &a.group_query_attention, "use grouped-query attention");
  p.value("--num-query-groups", &m.num_query_groups, "number of query groups (with --group-query-attention)", {1, limits::kHeads});
  p.value("--kv-channels", &m.kv_channels, "head dimension (default hidden/heads)", {1, limits::kHeadDim});
  p.value("--seq-length", &m.seq_length, "sequence length", {1, limits::kSeqLength});
  p.value("--max-position-embeddings", &m.max_position_embeddings, "positions of the learned position embedding", {1, limits::kSeqLength});
  p.value("--normalization", &m.normalization, "normalization layer", {"LayerNorm", "RMSNorm"});
  p.value("--norm-epsilon", &m.norm_epsilon, "epsilon of the normalization layers (default 1e-5)");
  p.store_true("--swiglu", &m.swiglu, "SwiGLU MLP activation");
  p.store_true("--openai-gelu", &m.openai_gelu, "tanh-approximate GELU");
  p.value("--position-embedding-type", &m.position_embedding_type, "position embedding",
          {"learned_absolute", "rope", "none"});
  p.store_true("--use-rotary-position-embeddings", &r.use_rotary, "same as --position-embedding-type rope");
  p.value("--rotary-base", &m.rotary_base, "RoPE base (default 10000)");
  p.value("--rotary-percent", &m.rotary_percent, "fraction of the head dimension rotated (default 1.0)");
  p.store_true("--disable-bias-linear", &r.disable_bias_linear, "no biases in linear layers");
  p.store_true("--add-qkv-bias", &r.add_qkv_bias, "bias in the QKV projection even with --disable-bias-linear");
  p.store_true("--use-rope-scaling", &m.rope_scaling, "Llama 3.1 RoPE frequency scaling");
  p.value("--rope-scaling-factor", &m.rope_scaling_factor, "RoPE scaling factor (default 8.0)");
  p.store_true("--qk-layernorm", &m.qk_layernorm, "normalize each head's queries and keys (Qwen3)");
  p.store_true("--untie-embeddings-and-output-weights", &m.untie_embeddings_and_output_weights,
               "separate output layer weights");
  p.value("--init-method-std", &m.init_method_std, "std of the normal init (default 0.02)");
  p.value("--attention-dropout", &m.attention_dropout, "attention dropout (default 0.1)");
  p.value("--hidden-dropout", &m.hidden_dropout, "hidden dropout (default 0.1)");
  p.value("--make-vocab-size-divisible-by", &a.make_vocab_size_divisible_by, "vocab padding multiple (default 128)", {1, kMaxVocabMultiple});
  p.store_true("--bf16", &m.bf16, "bf16 params and activations, fp32 main params and grads");
  p.store_true("--fp16", &m.fp16, "fp16 params and activations with loss scaling, fp32 main params and grads");
  p.value("--loss-scale", &a.grad_scaler.loss_scale,
          "static loss scale (--fp16; powers of 2 work best); unset: dynamic loss scaling");
  p.value("--initial-loss-scale", &a.grad_scaler.initial_loss_scale, "initial dynamic loss scale (default 2^32)");
  p.value("--min-loss-scale", &a.grad_scaler.min_loss_scale, "minimum dynamic loss scale (default 1.0)");
  p.value("--loss-scale-window", &a.grad_scaler.loss_scale_window,
          "clean iterations before the dynamic loss scale doubles (default 1000)", {1, kMaxSteps});
  p.value("--hysteresis", &a.grad_scaler.hysteresis,
          "overflowing iterations tolerated before the dynamic loss scale halves (default 2)", {0, kMaxSteps});
  p.custom("--attention-softmax-in-fp32", false, [](const std::string&) {},
           "softmax in fp32 (always the case in megatron.cpp)");
  p.custom("--use-flash-attn", false, [](const std::string&) {}, "accepted: attention is always flash-style");
  p.custom("--attention-backend", true,
           [&a](const std::string& v) {
             if (v == "unfused" || v == "local")
               fail("--attention-backend {}: megatron.cpp has no '{}' attention; the backends here are auto (cuDNN "
                    "fused attention where it applies, else flash), flash (megatron.cpp's own flash-attention "
                    "kernels) and fused (cuDNN)",
                    v, v);
             if (v != "auto" && v != "flash" && v != "fused")
               fail("--attention-backend got '{}'; expected auto, flash or fused", v);
             a.attention_backend = v;
           },
           "GPU attention: auto (default: cuDNN fused attention where supported, else flash), flash (own "
           "kernels), fused (cuDNN; an error where it does not apply)");
  p.custom("--deterministic-mode", false, [](const std::string&) {},
           "accepted: megatron.cpp's kernels are deterministic unless --nondeterministic-attention is given");
  p.store_true("--nondeterministic-attention", &a.nondeterministic_attention,
               "let cuDNN's attention backward accumulate dQ with atomics (faster; the same seed no longer gives "
               "bit-identical runs). Default: deterministic kernels");
  p.custom("--transformer-impl", true,
           [](const std::string& v) {
             if (v != "local" && v != "transformer_engine")
               fail("--transformer-impl got '{}'; expected local or transformer_engine", v);
           },
           "accepted for compatibility; megatron.cpp has one implementation");
  p.custom("--no-masked-softmax-fusion", false, [](const std::string&) {}, "accepted (no effect)");
  p.custom("--no-bias-gelu-fusion", false, [](const std::string&) {}, "accepted (no effect)");
  p.custom("--no-bias-swiglu-fusion", false, [](const std::string&) {}, "accepted (no effect)");
  p.custom("--no-bias-dropout-fusion", false, [](const std::string&) {}, "accepted (no effect)");
  p.custom("--no-rope-fusion", false, [](const std::string&) {}, "accepted (no effect)");

  // Tokenizer and data.
  p.value("--tokenizer-type", &a.tokenizer.type, "tokenizer",
          {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "NullTokenizer"});
  p.value("--vocab-file", &a.tokenizer.vocab_file, "GPT-2 encoder.json");
  p.value("--merge-file", &a.tokenizer.merge_file, "GPT-2 vocab.bpe");
  p.value("--tokenizer-model", &a.tokenizer.tokenizer_model, "tokenizer.json / directory / SentencePiece .model");
  p.value("--vocab-size", &a.tokenizer.vocab_size, "vocabulary size (NullTokenizer)", {1, limits::kVocab});
  p.list("--data-path", &a.data.data_path, "PREFIX or W1 PREFIX1 W2 PREFIX2 ...");
  p.list("--train-data-path", &a.data.train_data_path, "data for the train split only");
  p.list("--valid-data-path", &a.data.valid_data_path, "data for the validation split only");
  p.list("--test-data-path", &a.data.test_data_path, "data for the test split only");
  p.value("--split", &a.data.split, "train,valid,test proportions (default 969, 30, 1)");
  p.value("--data-cache-path", &a.data.data_cache_path, "where dataset index caches are written");
  p.store_true("--mock-data", &a.data.mock, "synthetic data (Megatron's mock GPT dataset)");
  p.store_true("--eod-mask-loss", &a.eod_mask_loss, "no loss on end-of-document tokens");
  p.custom("--num-workers", true, [](const std::string&) {}, "accepted (data loading is synchronous and deterministic)");

  // Batch and length of training.
  p.value("--micro-batch-size", &a.micro_batch_size, "samples per micro-batch", {1, kMaxMicroBatch});
  p.value("--global-batch-size", &a.global_batch_size, "samples per iteration (gradient accumulation)", {1, kMaxGlobalBatch});
  p.value("--train-iters", &a.train_iters, "iterations to train", {1, kMaxSteps});
  p.value("--train-samples", &a.train_samples, "samples to train (instead of --train-iters)", {1, kMaxSteps});

  // Optimizer and learning-rate schedule.
  p.value("--optimizer", &a.optimizer.type, "optimizer", {"adam", "sgd"});
  p.value("--lr", &a.optimizer.lr, "peak learning rate");
  p.value("--min-lr", &a.min_lr, "minimum learning rate");
  p.value("--lr-decay-style", &a.lr_decay_style, "decay style",
          {"constant", "linear", "cosine", "inverse-square-root", "WSD"});
  p.value("--lr-decay-iters", &a.lr_decay_iters, "iterations of decay (default --train-iters)", {1, kMaxSteps});
  p.value("--lr-decay-samples", &a.lr_decay_samples, "samples of decay (default --train-samples)", {1, kMaxSteps});
  p.value("--lr-warmup-iters", &a.lr_warmup_iters, "iterations of linear warm-up", {0, kMaxSteps});
  p.value("--lr-warmup-samples", &a.lr_warmup_samples, "samples of linear warm-up", {0, kMaxSteps});
  p.value("--lr-warmup-fraction", &a.lr_warmup_fraction, "warm-up as a fraction of the decay length");
  p.value("--lr-warmup-init", &a.lr_warmup_init, "learning rate at the start of warm-up");
  p.value("--lr-wsd-decay-style", &a.lr_wsd_decay_style, "WSD decay style",
          {"exponential", "linear", "cosine", "minus_sqrt"});
  p.value("--lr-wsd-decay-iters", &a.lr_wsd_decay_iters, "iterations of the WSD decay phase", {1, kMaxSteps});
  p.value("--lr-wsd-decay-samples", &a.lr_wsd_decay_samples, "samples of the WSD decay phase", {1, kMaxSteps});
  p.value("--weight-decay", &a.optimizer.weight_decay, "weight decay (default 0.01)");
  p.value("--start-weight-decay", &a.start_weight_decay, "weight decay at the start (with an incr style)");
  p.value("--end-weight-decay", &a.end_weight_decay, "weight decay at the end");
  p.value("--weight-decay-incr-style", &a.weight_decay_incr_style, "weight decay schedule",
          {"constant", "linear", "cosine"});
  p.value("--clip-grad", &a.clip_grad, "global gradient-norm clipping (default 1.0; 0 disables)");
  p.value("--adam-beta1", &a.optimizer.adam_beta1, "Adam beta1 (default 0.9)");
  p.value("--adam-beta2", &a.optimizer.adam_beta2, "Adam beta2 (default 0.999)");
  p.value("--adam-eps", &a.optimizer.adam_eps, "Adam epsilon (default 1e-8)");
  p.value("--sgd-momentum", &a.optimizer.sgd_momentum, "SGD momentum (default 0.9)");

  // Run control, logging, evaluation, checkpoints.
  p.value("--seed", &a.seed, "random seed (default 1234)");
  p.value("--log-interval", &a.log_interval, "iterations between log lines (default 100)", {1, INT64_MAX});
  p.value("--timing-log-level", &a.timing_log_level,
          "0: no per-op timing on the GPU (default); 1 or 2: time op categories with CUDA events and print the "
          "breakdown at the end");
  p.value("--eval-interval", &a.eval_interval, "iterations between evaluations (default 1000)", {1, INT64_MAX});
  p.value("--eval-iters", &a.eval_iters, "iterations per evaluation (default 100; 0 disables)", {0, kMaxSteps});
  p.value("--save", &a.save, "checkpoint directory to save to");
  p.value("--load", &a.load, "checkpoint directory to load from");
  p.value("--save-interval", &a.save_interval, "iterations between checkpoints", {0, INT64_MAX});
  p.store_true("--no-save-optim", &a.no_save_optim, "do not save optimizer state");
  p.store_true("--no-save-rng", &a.no_save_rng, "do not save RNG state");
  p.store_true("--no-load-optim", &a.no_load_optim, "do not load optimizer state");
  p.store_true("--no-load-rng", &a.no_load_rng, "do not load RNG state");
  p.store_true("--finetune", &a.finetune, "load weights only; start at iteration 0");
  p.store_true("--async-save", &a.async_save, "write checkpoints in a background thread while training goes on");
  p.value("--save-retain-interval", &a.save_retain_interval,
          "keep only checkpoints of iterations divisible by this, and the latest", {0, INT64_MAX});
  p.custom("--ckpt-format", true,
           [&a](const std::string& v) {
             if (v == "native") {
               a.ckpt_format = v;
               return;
             }
             if (v == "torch" || v == "torch_dist" || v == "zarr" || v == "torch_dcp" || v == "fsdp_dtensor")
               fail("--ckpt-format {}: megatron.cpp writes and reads its own format, 'native' (sharded safetensors "
                    "that reshard on load like torch_dist, plain data rather than pickles); Megatron-LM's {} "
                    "checkpoints cannot be read: export them to HuggingFace and use --load HF_DIR or "
                    "'megatron convert --from hf'",
                    v, v);
             fail("--ckpt-format got '{}'; the supported format is 'native'", v);
           },
           "checkpoint format: native (sharded safetensors; loads under any TP/PP/DP layout)");
  p.store_true("--auto-detect-ckpt-format", &a.auto_detect_ckpt_format,
               "accepted: --load always detects native and HuggingFace directories");
  p.store_true("--eval-at-start", &a.eval_at_start, "megatron.cpp: also evaluate before the first iteration");
  p.value("--exit-interval", &a.exit_interval, "exit after the iteration divisible by this", {0, INT64_MAX});
  p.custom("--no-progress-bar", false, [&a](const std::string&) { a.log_progress_bar = false; },
           "no progress bar even on a terminal");
  p.value("--device", &a.device, "where to train", {"auto", "cpu", "cuda"});
  p.value("--num-threads", &a.num_threads, "CPU threads (default: all cores)", {0, kMaxThreads});

  // Parallelism.
  p.value("--tensor-model-parallel-size", &a.tensor_model_parallel_size, "tensor-parallel size", {1, kMaxParallel});
  p.value("--pipeline-model-parallel-size", &a.pipeline_model_parallel_size, "pipeline-parallel size", {1, kMaxParallel});
  p.value("--decoder-first-pipeline-num-layers", &a.decoder_first_pipeline_num_layers,
          "layers on the first pipeline stage (uneven split)", {1, limits::kLayers});
  p.value("--decoder-last-pipeline-num-layers", &a.decoder_last_pipeline_num_layers,
          "layers on the last pipeline stage (uneven split)", {1, limits::kLayers});
  p.value("--num-layers-per-virtual-pipeline-stage", &a.num_layers_per_virtual_pipeline_stage,
          "layers per virtual pipeline stage (interleaved 1F1B schedule)", {1, limits::kLayers});
  p.value("--num-virtual-stages-per-pipeline-rank", &a.num_virtual_stages_per_pipeline_rank,
          "virtual pipeline stages per pipeline rank (interleaved 1F1B schedule)", {1, limits::kLayers});
  p.value("--microbatch-group-size-per-virtual-pipeline-stage", &a.microbatch_group_size_per_vp_stage,
          "interleaved schedule: micro-batches a virtual stage runs in a row (default: pipeline size)", {1, kMaxGlobalBatch});
  p.custom("--no-overlap-p2p-communication", false, [](const std::string&) {},
           "accepted (no effect): pipeline point-to-point messages always overlap compute");
  p.value("--context-parallel-size", &a.context_parallel_size, "context-parallel size", {1, kMaxParallel});
  p.value("--expert-model-parallel-size", &a.expert_model_parallel_size, "expert-parallel size", {1, kMaxParallel});
  p.store_true("--sequence-parallel", &a.sequence_parallel, "sequence parallelism (with TP)");
  p.store_true("--tp-comm-overlap", &a.tp_comm_overlap,
               "overlap the sequence-parallel all-gathers and reduce-scatters of the column-parallel linears with "
               "their GEMMs");
  p.store_true("--use-distributed-optimizer", &a.use_distributed_optimizer, "ZeRO-1 distributed optimizer");
  p.store_true("--overlap-grad-reduce", &a.overlap_grad_reduce, "reduce gradient buckets while backward runs");
  p.store_true("--overlap-param-gather", &a.overlap_param_gather,
               "all-gather updated parameters while the next forward runs (distributed optimizer)");
  p.value("--ddp-bucket-size", &a.ddp_bucket_size, "elements per gradient bucket (default: Megatron's)", {1, kMaxBucketElements});
  p.value("--distributed-timeout-minutes", &a.distributed_timeout_minutes,
          "how long a rank waits for the others before failing (default 10)", {1, kMaxTimeoutMinutes});
  p.value("--distributed-backend", &a.distributed_backend, "collectives backend", {"nccl", "gloo"});
  p.custom("--use-cpu-initialization", false, [](const std::string&) {},
           "accepted: weights are always initialised from the full tensor on the host");
  p.custom("--calculate-per-token-loss", false, [](const std::string&) {},
           "accepted: the loss is always the token-weighted mean");

  // Activation recomputation (validate_recompute_args holds Megatron's rules).
  p.value("--recompute-granularity", &m.recompute_granularity,
          "activation recomputation: full (whole layers) or selective (the attention core)", {"full", "selective"});
  p.store_true("--recompute-activations", &r.recompute_activations, "same as --recompute-granularity selective");
  p.value("--recompute-method", &m.recompute_method,
          "full recomputation: uniform (groups of N layers) or block (the first N layers of each stage)",
          {"uniform", "block"});
  p.value("--recompute-num-layers", &m.recompute_num_layers, "N for --recompute-method", {0, limits::kLayers});

  // Megatron-LM flags that are known but not implemented yet: rejected by name.
  p.unsupported("--pipeline-model-parallel-layout", "give the split with --decoder-first-pipeline-num-layers / "
                "--decoder-last-pipeline-num-layers and --num-virtual-stages-per-pipeline-rank");
  for (const char* f : {"--num-experts", "--moe-router-topk", "--moe-grouped-gemm", "--moe-aux-loss-coeff"})
    p.unsupported(f, "mixture-of-experts models are not implemented yet");
  for (const char* f : {"--fp8-format", "--fp8-recipe", "--fp8-amax-history-len"})
    p.unsupported(f, "FP8 arrives with the CUDA backend");
  p.unsupported("--distribute-saved-activations", "saved activations are not split over TP ranks yet");
  p.unsupported("--recompute-modules", "selective recomputation always recomputes the attention core (core_attn)");
  for (const char* f : {"--reset-position-ids", "--reset-attention-mask", "--apply-layernorm-1p",
                        "--apply-residual-connection-post-layernorm", "--tensorboard-dir",
                        "--wandb-project", "--exit-signal-handler"})
    p.unsupported(f, "not implemented yet");
}

}  // namespace

Arguments parse_pretrain_args(const std::vector<std::string>& argv) {
  Arguments a;
  Registered r;
  register_flags(r.parser, a, r);
  r.parser.enable_config();
  r.parser.parse(argv);
  if (r.parser.help_requested()) throw Error("help:" + r.parser.help());
  a.given = r.parser.given_names();
  if (a.model.fp16 && a.model.bf16) fail("--fp16 and --bf16 cannot be used together; pick one");
  if (r.use_rotary) a.model.position_embedding_type = "rope";
  if (r.recompute_activations) {
    if (a.model.recompute_granularity == "full")
      fail("--recompute-activations means --recompute-granularity selective; it cannot be combined with "
           "--recompute-granularity full");
    a.model.recompute_granularity = "selective";
  }
  a.model.add_bias_linear = !r.disable_bias_linear;
  a.model.add_qkv_bias = a.model.add_bias_linear || r.add_qkv_bias;
  return a;
}

std::string pretrain_help() {
  Arguments a;
  Registered r;
  register_flags(r.parser, a, r);
  r.parser.enable_config();
  return r.parser.help();
}

void validate_parallel_args(Arguments& a) {
  for (auto [name, v] : {std::pair{"--tensor-model-parallel-size", a.tensor_model_parallel_size},
                         {"--pipeline-model-parallel-size", a.pipeline_model_parallel_size},
                         {"--context-parallel-size", a.context_parallel_size},
                         {"--expert-model-parallel-size", a.expert_model_parallel_size}})
    if (v < 1) fail("{} must be at least 1 (got {})", name, v);
  if (a.context_parallel_size > 1)
    fail("--context-parallel-size {} is not supported yet; use 1", a.context_parallel_size);
  if (a.expert_model_parallel_size > 1)
    fail("--expert-model-parallel-size {} needs mixture-of-experts layers (--num-experts), not implemented yet",
         a.expert_model_parallel_size);
  const int64_t mp = checked_product({a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size},
                                     "--tensor-model-parallel-size x --pipeline-model-parallel-size x --context-parallel-size");
  if (a.world_size % mp != 0)
    fail("world size {} is not divisible by --tensor-model-parallel-size ({}) x --pipeline-model-parallel-size ({}) x "
         "--context-parallel-size ({}); start a multiple of {} processes",
         a.world_size, a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size, mp);
  a.data_parallel_size = a.world_size / mp;
  if (a.sequence_parallel && a.tensor_model_parallel_size == 1) {
    // Megatron turns it off too: there is no sequence to split without TP.
    log_warn("--sequence-parallel has no effect with --tensor-model-parallel-size 1; disabling it");
    a.sequence_parallel = false;
  }
  if (a.tp_comm_overlap && !a.sequence_parallel)
    fail("--tp-comm-overlap overlaps the sequence-parallel communication with the GEMMs: it needs "
         "--sequence-parallel and --tensor-model-parallel-size > 1");
  if (a.overlap_param_gather && !a.use_distributed_optimizer)
    fail("--overlap-param-gather needs --use-distributed-optimizer (only it gathers parameters)");
  if (a.ddp_bucket_size < 0) fail("--ddp-bucket-size must be positive (got {})", a.ddp_bucket_size);
  if (a.distributed_timeout_minutes <= 0)
    fail("--distributed-timeout-minutes must be positive (got {})", a.distributed_timeout_minutes);
}

namespace {
// Megatron's activation-recomputation rules, after the pipeline split is known (N is bounded
// by the layers a pipeline stage holds).
void validate_recompute_args(Arguments& a, const std::function<bool(const char*)>& given) {
  auto& m = a.model;
  const std::string& g = m.recompute_granularity;
  if (g.empty()) {
    if (given("--recompute-method") || given("--recompute-num-layers"))
      fail("--recompute-method and --recompute-num-layers need --recompute-granularity full");
    return;
  }
  if (g == "selective") {
    if (given("--recompute-method"))
      fail("--recompute-method is not supported with --recompute-granularity selective (it recomputes the attention "
           "core of every layer); drop it, or use --recompute-granularity full");
    if (given("--recompute-num-layers"))
      fail("--recompute-num-layers is not supported with --recompute-granularity selective; drop it, or use "
           "--recompute-granularity full");
    return;
  }
  if (m.recompute_method.empty())
    fail("--recompute-granularity full needs --recompute-method uniform or block");
  if (!given("--recompute-num-layers"))
    fail("--recompute-granularity full needs --recompute-num-layers N (uniform: layers per recomputed group; "
         "block: layers recomputed on each pipeline stage)");
  const parallel::PipelineLayout layout(m.num_layers, pipeline_options(a));
  int64_t per_stage = 0;
  for (int r = 0; r < layout.pp(); ++r) {
    int64_t n = 0;
    for (auto [b, e] : layout.chunks(r)) n += e - b;
    per_stage = std::max(per_stage, n);
  }
  if (m.recompute_num_layers < 1 || m.recompute_num_layers > per_stage)
    fail("--recompute-num-layers must be between 1 and the layers per pipeline stage ({}); got {}", per_stage,
         m.recompute_num_layers);
}

// Megatron's pipeline rules: the layer split (PipelineLayout) and, for the interleaved
// schedule, the micro-batch count.
void validate_pipeline_args(Arguments& a, const std::function<bool(const char*)>& given) {
  for (auto [f, v] : {std::pair<const char*, int64_t>{"--decoder-first-pipeline-num-layers",
                                                      a.decoder_first_pipeline_num_layers},
                      {"--decoder-last-pipeline-num-layers", a.decoder_last_pipeline_num_layers},
                      {"--num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage},
                      {"--num-virtual-stages-per-pipeline-rank", a.num_virtual_stages_per_pipeline_rank},
                      {"--microbatch-group-size-per-virtual-pipeline-stage", a.microbatch_group_size_per_vp_stage}})
    if (given(f) && v <= 0) fail("{} must be positive (got {})", f, v);
  const parallel::PipelineLayout layout(a.model.num_layers, pipeline_options(a));
  a.virtual_pipeline_model_parallel_size = layout.vpp();
  const int64_t microbatches = a.global_batch_size / (a.micro_batch_size * a.data_parallel_size);
  if (layout.vpp() > 1)
    parallel::check_interleaved_microbatches(microbatches, layout.pp(), a.microbatch_group_size_per_vp_stage);
  else if (a.microbatch_group_size_per_vp_stage > 0)
    fail("--microbatch-group-size-per-virtual-pipeline-stage needs virtual pipeline stages "
         "(--num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage)");
}
}  // namespace

void validate_args(Arguments& a, int64_t tokenizer_vocab_size) {
  auto given = [&](const char* n) { return std::find(a.given.begin(), a.given.end(), n) != a.given.end(); };
  validate_parallel_args(a);

  if (given("--num-query-groups") && !a.group_query_attention)
    fail("--num-query-groups needs --group-query-attention (Megatron ignores it otherwise)");
  if (!a.group_query_attention) a.model.num_query_groups = 0;

  // cuDNN's path has no attention dropout matching ours (CPU-identical Philox mask), so fused needs it off.
  if (a.attention_backend == "fused" && a.model.attention_dropout > 0)
    fail("--attention-backend fused (cuDNN) does not apply attention dropout; set --attention-dropout 0 or use "
         "--attention-backend auto (which uses the flash kernels while dropout is on)");
  if (given("--deterministic-mode") && a.nondeterministic_attention)
    fail("--deterministic-mode and --nondeterministic-attention contradict each other; drop one");
  if (a.attention_backend == "fused" && a.device == "cpu")
    fail("--attention-backend fused runs cuDNN on the GPU; it cannot be combined with --device cpu");
  if (a.micro_batch_size <= 0) fail("--micro-batch-size must be positive (got {})", a.micro_batch_size);
  const int64_t per_step = checked_mul(a.micro_batch_size, a.data_parallel_size, "--micro-batch-size x data-parallel size");
  if (a.global_batch_size == 0) a.global_batch_size = per_step;
  if (a.global_batch_size % per_step != 0)
    fail("--global-batch-size ({}) is not divisible by --micro-batch-size ({}) times data-parallel size ({})",
         a.global_batch_size, a.micro_batch_size, a.data_parallel_size);

  if (a.train_iters > 0 && a.train_samples > 0) fail("use only one of --train-iters and --train-samples");
  if (a.train_iters <= 0 && a.train_samples <= 0) fail("set --train-iters or --train-samples");
  bool iter_based = a.train_iters > 0;
  if (iter_based) {
    if (a.lr_decay_samples || a.lr_warmup_samples || a.lr_wsd_decay_samples)
      fail("--lr-decay-samples/--lr-warmup-samples/--lr-wsd-decay-samples need --train-samples; with --train-iters use the -iters forms");
  } else {
    if (a.lr_decay_iters || a.lr_warmup_iters || a.lr_wsd_decay_iters)
      fail("--lr-decay-iters/--lr-warmup-iters/--lr-wsd-decay-iters need --train-iters; with --train-samples use the -samples forms");
  }
  if (a.lr_warmup_fraction >= 0 && (a.lr_warmup_iters || a.lr_warmup_samples))
    fail("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples cannot be used together");
  validate_float_args(a);
  if (a.log_interval <= 0) fail("--log-interval must be positive (got {})", a.log_interval);
  if (a.timing_log_level < 0 || a.timing_log_level > 2)
    fail("--timing-log-level must be 0, 1 or 2 (got {})", a.timing_log_level);
  if (a.eval_interval <= 0) fail("--eval-interval must be positive (got {})", a.eval_interval);
  if (a.eval_iters < 0) fail("--eval-iters must be >= 0 (got {})", a.eval_iters);
  if (a.save_interval < 0) fail("--save-interval must be >= 0 (got {})", a.save_interval);
  if (a.save_interval > 0 && a.save.empty()) fail("--save-interval needs --save DIR");
  if (a.save_retain_interval < 0) fail("--save-retain-interval must be >= 0 (got {})", a.save_retain_interval);
  if (a.save_retain_interval > 0 && a.save.empty()) fail("--save-retain-interval needs --save DIR");
  if (a.num_threads < 0) fail("--num-threads must be >= 0 (got {})", a.num_threads);
  // Loss scaling exists for fp16 only: Megatron ignores these flags in fp32 runs (and would
  // apply --loss-scale to bf16); here they are refused so a forgotten --fp16 shows.
  for (const char* f : {"--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"})
    if (given(f) && !a.model.fp16) fail("{} needs --fp16 (loss scaling is for fp16 training only)", f);
  if (a.model.fp16) (void)optim::GradScaler(a.grad_scaler);  // names a bad --*loss-scale* / --hysteresis value

  if (a.weight_decay_incr_style == "constant") {
    if (a.start_weight_decay >= 0 || a.end_weight_decay >= 0) {
      if (!(a.start_weight_decay >= 0 && a.end_weight_decay >= 0 && a.start_weight_decay == a.end_weight_decay))
        fail("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    }
    a.start_weight_decay = a.end_weight_decay = a.optimizer.weight_decay;
  } else if (a.start_weight_decay < 0 || a.end_weight_decay < 0) {
    fail("--weight-decay-incr-style {} needs --start-weight-decay and --end-weight-decay", a.weight_decay_incr_style);
  }

  if (a.data.data_path.empty() && a.data.train_data_path.empty() && !a.data.mock)
    fail("no training data: give --data-path PREFIX (from 'megatron preprocess') or --mock-data");
  if (!a.data.mock && a.tokenizer.type.empty())
    fail("--tokenizer-type is required with --data-path (the tokenizer that made the data)");
  if (a.model.seq_length <= 0) fail("--seq-length is required and must be positive");

  a.model.orig_vocab_size = tokenizer_vocab_size;
  a.model.vocab_size = model::padded_vocab_size(tokenizer_vocab_size, a.make_vocab_size_divisible_by,
                                                a.tensor_model_parallel_size);
  a.model.seed = a.seed;
  a.data.seq_length = a.model.seq_length;
  a.data.seed = a.seed;
  a.model.finalize();
  validate_size_products(a);
  if (a.tensor_model_parallel_size > 1)
    model::check_tensor_parallel(a.model, a.tensor_model_parallel_size, a.sequence_parallel);
  validate_pipeline_args(a, given);
  validate_recompute_args(a, given);
}

parallel::PipelineOptions pipeline_options(const Arguments& a) {
  parallel::PipelineOptions o;
  o.pp = a.pipeline_model_parallel_size;
  o.first_stage_layers = a.decoder_first_pipeline_num_layers;
  o.last_stage_layers = a.decoder_last_pipeline_num_layers;
  o.num_layers_per_virtual_stage = a.num_layers_per_virtual_pipeline_stage;
  o.virtual_stages_per_rank = a.num_virtual_stages_per_pipeline_rank;
  return o;
}

}  // namespace mt
