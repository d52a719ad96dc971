// `megatron pretrain`: parse and validate Megatron's flags, build tokenizer, data, model and
// optimizer, then train.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "comm/env.h"
#include "comm/world.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/log.h"
#include "core/memory_timeline.h"
#include "parallel/grid.h"
#include "parallel/process_groups.h"
#include "kernels/cpu/threads.h"
#include "training/batch_schedule.h"
#include "training/commands.h"
#include "training/convert.h"
#include "training/memory_check.h"
#include "training/resolved_args.h"
#include "training/trainer.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"
#endif

namespace mt {

std::unique_ptr<data::Tokenizer> tokenizer_for(Arguments& a) {
  // Megatron's GPT-3 example names GPT-2's files without --tokenizer-type: they can only mean that.
  if (a.tokenizer.type.empty() && !a.tokenizer.vocab_file.empty() && !a.tokenizer.merge_file.empty()) {
    log_info("--vocab-file and --merge-file without --tokenizer-type: GPT2BPETokenizer");
    a.tokenizer.type = "GPT2BPETokenizer";
  }
  if (a.tokenizer.type.empty()) {
    if (!a.data.mock) fail("--tokenizer-type is required");
    if (a.tokenizer.vocab_size <= 0) fail("--mock-data without a tokenizer needs --vocab-size N (NullTokenizer)");
    a.tokenizer.type = "NullTokenizer";
  }
  return data::build_tokenizer(a.tokenizer);
}

namespace {
int train(Arguments& a, std::unique_ptr<data::Tokenizer> tok, const comm::DistEnv& env, int threads);

// A CPU run's lower bound: this rank's fp32 parameters and gradients (plus the optimizer's
// moments unless the distributed optimizer shards them, plus the half copy) and one
// micro-batch's logits.
void check_training_memory(const Arguments& a) {
  const auto& m = a.model;
  int64_t per_param = 8 + (a.use_distributed_optimizer ? 0 : a.optimizer.type == "adam" ? 8 : 4);
  if (m.bf16 || m.fp16) per_param += 2;
  const int64_t tp = a.tensor_model_parallel_size;
  const int64_t logits = checked_product({a.micro_batch_size, m.seq_length, m.vocab_size / tp, 4},
                                         "--micro-batch-size x --seq-length x vocabulary (logits bytes)");
  check_host_memory(m, per_param, checked_mul(tp, a.pipeline_model_parallel_size, "model shards"), logits,
                    "its parameters, gradients, optimizer state and one micro-batch's logits");
}
}  // namespace

namespace {
// --device auto picks the GPU when this build has the CUDA backend and a GPU is visible.
// The GPU path trains in bf16 or fp16 (with loss scaling); fp32 on the GPU is refused by name.
void resolve_device(Arguments& a) {
#ifdef MT_HAVE_CUDA
  const bool have_gpu = ops::gpu_count() > 0;
#else
  const bool have_gpu = false;
#endif
  const bool half = a.model.bf16 || a.model.fp16;
  if (a.device == "auto") a.device = have_gpu && half ? "cuda" : "cpu";
  if (a.device != "cuda") return;
  // The flags first: the same mistake reads the same on machines with and without a GPU.
  if (!half) fail("--device cuda trains in bf16 or fp16: add --bf16 (or --fp16)");
  if (!have_gpu)
    fail("--device cuda: {}; use --device cpu",
#ifdef MT_HAVE_CUDA
         "no CUDA device is visible (check CUDA_VISIBLE_DEVICES)"
#else
         "this build has no CUDA backend (nvcc was not found at build time)"
#endif
    );
}

#ifdef MT_HAVE_CUDA
// Several GPU ranks: each takes the GPU of its local rank (CUDA_VISIBLE_DEVICES applies) and
// talks NCCL on device buffers. The run holds the context `gpu` until everything on it is gone.
// The attention flags set the CUDA backend's attention policy (process-wide) for the run.
comm::DeviceComm pick_gpu(const comm::DistEnv& env, const Arguments& a, std::optional<ops::GpuContext>& gpu) {
  const int n = ops::gpu_count();
  if (env.local_world_size > n)
    fail("--device cuda: {} ranks on this node but {} GPU(s) visible; start one rank per GPU (--nproc-per-node {}) "
         "or check CUDA_VISIBLE_DEVICES",
         env.local_world_size, n, n);
  gpu.emplace(env.local_rank);
  cuda::set_attention_backend(cuda::attention_backend_from_name(a.attention_backend));
  cuda::set_attention_deterministic(!a.nondeterministic_attention);
  return comm::DeviceComm{env.world_size > 1, gpu->compute_stream(), env.local_rank};
}
#endif

std::string gpu_name() {
#ifdef MT_HAVE_CUDA
  return ops::gpu_context().name();
#else
  return "none";
#endif
}
}  // namespace

int pretrain_main(const std::vector<std::string>& argv) {
  Arguments a;
  try {
    a = parse_pretrain_args(argv);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("help:", 0) == 0) {
      std::fputs(what.c_str() + 5, stdout);
      return 0;
    }
    throw;
  }
  // --use-checkpoint-args: the checkpoint's model and tokenizer flags first, so the command line wins.
  if (a.use_checkpoint_args) {
    if (a.load.empty()) fail("--use-checkpoint-args needs --load DIR (the checkpoint to read)");
    std::vector<std::string> words = checkpoint_arg_words(a);
    log_info("--use-checkpoint-args: {} flags from {}", words.size(), a.load);
    words.insert(words.end(), argv.begin(), argv.end());
    a = parse_pretrain_args(words);
  }
  // --load HF_DIR: the model's shape comes from its config.json (a conflicting flag is an error).
  std::optional<checkpoint::HfSpec> hf;
  if (!a.load.empty() && std::filesystem::exists(a.load) &&
      checkpoint::detect_checkpoint(a.load) == checkpoint::CheckpointKind::HuggingFace) {
    hf = checkpoint::read_hf_config(a.load);
    apply_hf_config(a, *hf, (std::filesystem::path(a.load) / "config.json").string());
    if (hf->cfg.moe.enabled() && !a.was_given("--moe-aux-loss-coeff"))
      log_info("--moe-aux-loss-coeff {} from router_aux_loss_coef in {}/config.json (give the flag to choose another)",
               a.model.moe.aux_loss_coeff, a.load);
  }
  resolve_device(a);
  const comm::DistEnv env = comm::detect_dist_env();
  set_log_rank(env.rank);  // only rank 0 prints the log (warnings and errors from every rank)
  a.world_size = env.world_size;
  // Ranks sharing a machine share its cores unless told otherwise.
  if (a.num_threads == 0 && env.local_world_size > 1 && !std::getenv("OMP_NUM_THREADS"))
    a.num_threads = std::max<int64_t>(1, std::thread::hardware_concurrency() / env.local_world_size);
  int threads = cpu::set_num_threads(static_cast<int>(a.num_threads));
  auto tok = tokenizer_for(a);
  validate_args(a, tok->vocab_size());
  if (hf) apply_hf_vocab(a, *hf, tok->vocab_size(), (std::filesystem::path(a.load) / "config.json").string());
  if (a.print_config) {  // --print-config / --dry-run: the arguments as the run would use them
    std::printf("%s\n", resolved_arguments(a).dump(2).c_str());
    return 0;
  }
  if (a.device == "cpu") check_training_memory(a);
  if (env.world_size == 1) return train(a, std::move(tok), env, threads);
  // Several ranks: a failure on one must end this process promptly (peers may be waiting on it,
  // and unwinding through live communicators could wait too): report and leave at once.
  try {
    return train(a, std::move(tok), env, threads);
  } catch (...) {
    print_error_line("megatron pretrain", fmt::format("[rank {}] {}", env.rank, describe_exception(std::current_exception())));
    std::_Exit(2);
  }
}

namespace {
int train(Arguments& a, std::unique_ptr<data::Tokenizer> tok, const comm::DistEnv& env, int threads) {
  comm::DeviceComm dev;
#ifdef MT_HAVE_CUDA
  std::optional<ops::GpuContext> gpu;  // outlives the world and the trainer below
  if (a.device == "cuda") dev = pick_gpu(env, a, gpu);
#endif
  comm::World world(env, std::chrono::minutes(a.distributed_timeout_minutes), dev);
  parallel::RankGrid grid(env.world_size, static_cast<int>(a.tensor_model_parallel_size),
                          static_cast<int>(a.pipeline_model_parallel_size), static_cast<int>(a.context_parallel_size),
                          static_cast<int>(a.expert_model_parallel_size),
                          static_cast<int>(a.expert_tensor_parallel_size));
  parallel::ProcessGroups groups =
      env.world_size > 1 ? parallel::build_process_groups(world, grid, static_cast<int>(a.cp_a2a_size)) : parallel::local_process_groups();
  if (env.world_size > 1)
    log_info("distributed: {} ranks ({}), tensor-parallel {} x data-parallel {} x pipeline-parallel {}{}{}{}{}{}",
             env.world_size, env.source, grid.tp(), grid.dp(), grid.pp(),
             grid.cp() > 1 ? fmt::format(" x context-parallel {} ({})", grid.cp(), a.cp_comm_type) : std::string(),
             a.virtual_pipeline_model_parallel_size > 1
                 ? fmt::format(" ({} virtual stages per rank, interleaved 1F1B)",
                               a.virtual_pipeline_model_parallel_size)
                 : std::string(grid.pp() > 1 ? " (1F1B)" : ""),
             a.sequence_parallel ? ", sequence parallel" : "",
             a.use_distributed_optimizer ? ", distributed optimizer" : "",
             a.model.moe.enabled() ? fmt::format(", experts: expert-parallel {} x expert-tensor-parallel {} x "
                                                 "expert-data-parallel {} ({} dispatcher)",
                                                 grid.expert_model_parallel(), grid.expert_tensor_parallel(),
                                                 grid.expert_data_parallel(), a.model.moe.token_dispatcher)
                                   : std::string());
  a.data.eod = tok->eod();
  a.data.mock_vocab_size = tok->vocab_size();
  log_info("megatron.cpp pretrain | device: {} | tokenizer: {} (vocab {}, eod {})",
           a.device == "cuda" ? "cuda (" + gpu_name() + ")" : fmt::format("cpu ({} threads)", threads), tok->name(),
           tok->vocab_size(), tok->eod());

  const int64_t gbs = a.global_batch_size;
  const int64_t iters = a.train_iters > 0 ? a.train_iters : BatchSchedule(a).iterations_for(a.train_samples);
  const int64_t eval_runs = a.eval_iters > 0 ? iters / a.eval_interval + 2 : 0;
  int64_t num_samples[3] = {iters * gbs, eval_runs * a.eval_iters * gbs, a.eval_iters * gbs};
  // Rank 0 builds (and caches) the dataset indexes first; the others then read its caches.
  std::optional<Activity> datasets(std::in_place, "building the datasets");
  if (world.rank() != 0) world.world()->barrier();
  auto splits = data::build_gpt_datasets(a.data, num_samples);
  if (world.rank() == 0 && env.world_size > 1) world.world()->barrier();
  if (!splits.train) fail("the train split is empty: check --split and --data-path");
  datasets.reset();
  if (a.eval_iters > 0 && !splits.valid) log_warn("the validation split is empty: no evaluation (check --split)");

  // --record-memory-history: from before the model is built (weights, grads and optimizer state
  // are in the timeline) to the end of the run, written when this scope ends, on success or error.
  // Rank 0 writes the path; every other rank the path with ".rank<N>" appended.
  struct MemoryHistory {
    std::string path;
    ~MemoryHistory() {
      if (path.empty()) return;
      try {
        memory_timeline::stop_and_write(path);
        log_info("--record-memory-history: wrote the memory timeline to {}", path);
      } catch (const std::exception& e) {
        log_warn("{}", e.what());
      }
    }
  } memory_history;
  if (a.record_memory_history) {
    memory_history.path = a.memory_snapshot_path + (env.rank == 0 ? std::string() : ".rank" + std::to_string(env.rank));
    memory_timeline::start();
  }
  std::optional<Activity> building(std::in_place, fmt::format("building the model ({} parameters)", a.model.num_parameters()));
  Trainer trainer(a, std::move(tok), groups);
  trainer.set_data(std::move(splits.train), std::move(splits.valid));
  trainer.set_test_data(std::move(splits.test));
  building.reset();
  Activity training("training");
  int rc = trainer.run();
  world.shutdown();
  return rc;
}
}  // namespace

}  // namespace mt
