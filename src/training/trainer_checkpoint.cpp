// The trainer's side of checkpoints: what it saves (weights, optimizer state as this rank holds
// it, RNG streams, data position) and how it resumes, from a native checkpoint of any parallel
// layout or from a HuggingFace model directory.
#include <filesystem>
#include <optional>

#include "checkpoint/fp8_state.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/model_args.h"
#include "checkpoint/upcycle.h"
#include "core/error.h"
#include "core/log.h"
#include "training/resolved_args.h"
#include "training/trainer.h"

#include <chrono>

namespace mt {

checkpoint::RankInfo Trainer::rank_info() const {
  checkpoint::RankInfo ri;
  ri.rank = pg_.rank;
  ri.world = pg_.grid.world();
  ri.tp = pg_.grid.tp();
  ri.tp_rank = pg_.tp_rank();
  ri.pp = pg_.grid.pp();
  ri.pp_rank = pg_.pp->rank();
  // Context-parallel ranks hold the same parameters and share the optimizer's shards with the
  // data-parallel ones (the DDP group is DP x CP), so checkpoints see DP x CP replicas: the first
  // writes the weights, each its own optimizer shard, and a load at another CP reshards as for
  // another DP.
  ri.dp = pg_.dp_cp->size();
  ri.dp_rank = pg_.dp_cp->rank();
  ri.ep = pg_.grid.expert_model_parallel();
  ri.ep_rank = pg_.ep->rank();
  ri.etp_rank = pg_.etp->rank();
  ri.edp_rank = pg_.edp->rank();
  ri.comm = pg_.world.get();
  return ri;
}

void Trainer::save() {
  const auto t0 = std::chrono::steady_clock::now();
  ddp_->gather_main_values();  // --fp8-param-gather gathered only FP8 codes of some weights
  checkpoint::TrainingState st = state_;
  st.has_rng = !args_.no_save_rng;
  st.rng_seed = step_->dropout_rng().seed;
  st.rng_offset = step_->dropout_rng().offset;
  st.tp_rng_seed = step_->tp_rng().seed;
  st.tp_rng_offset = step_->tp_rng().offset;
  st.args = checkpoint::model_args_to_json(args_.model, args_.tokenizer);
  // Self-contained: the tokenizer's files travel with the checkpoint, and every resolved argument.
  st.args["tokenizer_files"] = checkpoint::tokenizer_files_json(args_.tokenizer);
  st.args["run_args"] = resolved_arguments(args_);
  if (auto* gs = grad_scaler()) st.grad_scaler = gs->state();
  if (model::Fp8Store* f = model_->fp8()) st.fp8 = checkpoint::fp8_state_to_json(*f);
  std::optional<checkpoint::OptimizerState> os;
  if (!args_.no_save_optim) os = checkpoint::optimizer_state(step_->optimizer(), ddp_->sharded());
  checkpoint::SaveOptions o = save_options(args_);
  o.assets = checkpoint::tokenizer_assets(args_.tokenizer);
  if (args_.ckpt_format == "torch_dist") return save_torch_dist(st, os ? &*os : nullptr, o);
  saver_->save(args_.save, st, model_->params(), os ? &*os : nullptr, o);
  // What an async save costs the training loop: the copies to host memory before writing starts.
  if (o.async)
    log_info("async save of iteration {}: training paused {:.2f} s to stage the state in host memory",
             state_.iteration, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// --ckpt-format torch_dist: the native save (which gathers any layout) into SAVE/.native_staging,
// then rank 0 writes it as Megatron-LM's torch_dist into SAVE (checkpoint/megatron/dcp_writer.h)
// and drops the staging copy; the other ranks wait, so no one reads SAVE half written.
void Trainer::save_torch_dist(const checkpoint::TrainingState& st, const checkpoint::OptimizerState* os,
                              const checkpoint::SaveOptions& o) {
  const std::string staging = (std::filesystem::path(args_.save) / ".native_staging").string();
  saver_->save(staging, st, model_->params(), os, o);
  saver_->wait();
  if (pg_.rank == 0) {
    {
      checkpoint::CheckpointReader reader(staging, st.iteration);
      checkpoint::megatron::write_torch_dist(args_.save, reader);
    }
    std::error_code ec;
    std::filesystem::remove_all(staging, ec);
    log_info("saved iteration {} to {} as a Megatron-LM torch_dist checkpoint", st.iteration, args_.save);
  }
  pg_.world->barrier();
}

void Trainer::maybe_load() {
  if (args_.load.empty()) return;
  ddp_->invalidate_fp8_params();  // --fp8-param-gather: cast the loaded weights before the next pass
  if (args_.moe_use_upcycling) return upcycle();
  // Megatron's `--save X --load X` idiom: the first run finds no directory and starts from scratch.
  if (std::error_code ec; !std::filesystem::exists(args_.load, ec)) {
    if (args_.exit_on_missing_checkpoint)
      fail("--load '{}' does not exist and --exit-on-missing-checkpoint is set; point --load at a checkpoint "
           "directory or drop the flag to train from scratch",
           args_.load);
    log_warn("--load {}: the directory does not exist, training from scratch", args_.load);
    return;
  }
  if (checkpoint::detect_checkpoint(args_.load) == checkpoint::CheckpointKind::HuggingFace) {
    // Weights only: a HuggingFace model starts a run (continued pretraining or fine-tuning).
    // Under PP or EP this rank holds only part of the model: the rest of the files is others'.
    checkpoint::load_hf_weights(args_.load, model_->params(), model_->config(),
                                pg_.pp->size() == 1 && pg_.ep->size() == 1);
    log_info("loaded HuggingFace model weights from {} (starting at iteration 0 with a fresh optimizer)", args_.load);
    return;
  }
  auto it = checkpoint::latest_iteration(args_.load);
  if (!it) {
    if (args_.exit_on_missing_checkpoint)
      fail("--load '{}' holds no checkpoint (no latest_checkpointed_iteration.txt) and --exit-on-missing-checkpoint "
           "is set",
           args_.load);
    log_warn("--load {}: no latest_checkpointed_iteration.txt, training from scratch", args_.load);
    return;
  }
  check_ckpt_format(*it);
  const auto load_start = std::chrono::steady_clock::now();
  // Megatron's "release" checkpoint: weights only, training starts at iteration 0.
  const bool release = *it == checkpoint::kReleaseIteration;
  checkpoint::LoadOptions o;
  o.load_optim = !args_.no_load_optim && !args_.finetune && !release;
  o.load_rng = !args_.no_load_rng && !args_.finetune && !release;
  o.orig_vocab_size = args_.model.orig_vocab_size;
  std::optional<checkpoint::OptimizerState> os;
  if (o.load_optim) os = checkpoint::optimizer_state(step_->optimizer(), ddp_->sharded());
  auto st = checkpoint::load_checkpoint(args_.load, *it, rank_info(), model_->params(), os ? &*os : nullptr, o);
  if (o.load_optim) step_->optimizer().set_step_count(st.optimizer_steps);
  if (args_.finetune || release) {
    log_info("loaded weights from {} {} ({}: starting at iteration 0)", args_.load,
             release ? "release/" : fmt::format("iteration {}", *it),
             release ? "a release checkpoint holds weights only" : "--finetune");
    return;
  }
  if (st.iteration > total_iters_)
    fail("--load {}: the checkpoint is at iteration {}, past the {} iterations this run trains (--train-iters or "
         "--train-samples); raise them to continue, or add --finetune to start over from its weights",
         args_.load, st.iteration, total_iters_);
  if (st.iteration == total_iters_)
    log_warn("--load {}: the checkpoint is at iteration {}, which is where this run ends: nothing to train", args_.load,
             st.iteration);
  state_.iteration = st.iteration;
  state_.consumed_train_samples = st.consumed_train_samples;
  state_.scheduler_samples = st.scheduler_samples;
  state_.consumed_valid_samples = st.consumed_valid_samples;
  state_.optimizer_steps = st.optimizer_steps;
  state_.skipped_iterations = st.skipped_iterations;
  state_.nan_iterations = st.nan_iterations;
  // The loss scaler travels with the optimizer state, as in Megatron (--no-load-optim starts a
  // fresh one); a static --loss-scale ignores the saved one.
  if (auto* gs = grad_scaler(); gs && o.load_optim) {
    if (st.grad_scaler) gs->load_state(*st.grad_scaler);
    else log_warn("--load {}: the checkpoint holds no fp16 loss scaler state; starting from --initial-loss-scale",
                  args_.load);
  }
  // FP8's scales and amax histories belong to the model (Transformer Engine's extra_state).
  if (model::Fp8Store* f = model_->fp8()) {
    if (st.fp8.is_null())
      log_info("--load {}: the checkpoint holds no FP8 scaling state; FP8 scales start afresh", args_.load);
    else
      checkpoint::fp8_state_from_json(*f, st.fp8, args_.load + " (metadata.json)");
  }
  if (o.load_rng && st.has_rng) {
    // Offsets only: the seeds follow from --seed, the pipeline stage and the TP rank, which may
    // differ from the layout that saved; the offsets advance alike on every rank.
    step_->dropout_rng().offset = st.rng_offset;
    if (st.has_tp_rng) step_->tp_rng().offset = st.tp_rng_offset;
  }
  log_info("loaded checkpoint from {} at iteration {} in {:.2f} s", args_.load, *it,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
}

// Megatron's meaning of --ckpt-format for loading: a checkpoint of another format is an error
// unless --auto-detect-ckpt-format (or no --ckpt-format at all: megatron.cpp detects by default).
void Trainer::check_ckpt_format(int64_t it) const {
  if (!args_.was_given("--ckpt-format") || args_.auto_detect_ckpt_format) return;
  const auto f = checkpoint::megatron::detect_format(checkpoint::iteration_dir(args_.load, it));
  const std::string found = checkpoint::megatron::format_name(f);
  if (found != args_.ckpt_format)
    fail("--load {} holds a {} checkpoint but --ckpt-format is {}; give --ckpt-format {} or add "
         "--auto-detect-ckpt-format",
         args_.load, found, args_.ckpt_format, found);
}

// Megatron's --moe-use-upcycling: the MoE model starts from the dense checkpoint in --load
// (checkpoint/upcycle.h) at iteration 0, and that starting point is saved to --save at once, so
// the following runs resume from it without the flag.
void Trainer::upcycle() {
  if (std::filesystem::is_directory(args_.save) && checkpoint::latest_iteration(args_.save))
    fail("--moe-use-upcycling: {} already holds a checkpoint; upcycling is for the first run only (as in Megatron): "
         "drop --moe-use-upcycling to resume from it, or point --save at a new directory",
         args_.save);
  if (checkpoint::detect_checkpoint(args_.load) == checkpoint::CheckpointKind::HuggingFace)
    fail("--moe-use-upcycling reads a megatron.cpp checkpoint of the dense model; convert {} first (megatron convert "
         "--load {} --save DIR), then upcycle from DIR",
         args_.load, args_.load);
  const auto it = checkpoint::latest_iteration(args_.load);
  if (!it) fail("--moe-use-upcycling: --load {} holds no checkpoint (no latest_checkpointed_iteration.txt)", args_.load);
  checkpoint::CheckpointReader dense(args_.load, *it);
  checkpoint::upcycle_from_dense(dense, model_->params(), model_->config(), args_.load);
  log_info("upcycled the dense checkpoint {} (iteration {}) into {} experts per MoE layer; saving it to {}", args_.load,
           *it == checkpoint::kReleaseIteration ? std::string("release") : std::to_string(*it),
           args_.model.moe.num_experts, args_.save);
  save();
  saver_->wait();
}

}  // namespace mt
