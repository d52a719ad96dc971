#pragma once
// Sharded checkpoints that reshard on load. Layout (Megatron's directory names):
//   SAVE/latest_checkpointed_iteration.txt   iteration as text; moves only after a save completed
//   SAVE/iter_0000100/metadata.json          written last: format, the layout that saved, CRC32 and
//                                            size of every file, every tensor's global shape and
//                                            the pieces (file, key, box, flat range) holding it,
//                                            and each rank's RNG state
//   SAVE/iter_0000100/state.json             iteration, consumed samples, scheduler, model args
//   SAVE/iter_0000100/model[-tpT-ppP].safetensors        fp32 main params, one file per TP x PP
//                                            rank (written by DP rank 0)
//   SAVE/iter_0000100/model-epE-tpT-ppP.safetensors      MoE experts (several ranks): one file per
//                                            EP x expert-TP x PP rank, written by expert-DP rank 0,
//                                            each expert under its global index
//   SAVE/iter_0000100/optimizer[-tpT-ppP[-dpD]].safetensors   Adam/SGD state per global tensor
//                                            slice: per TP x PP rank (experts: -epE-tpT-ppP as
//                                            above), or per rank with the distributed optimizer
//                                            (each its own flat slices)
// Tensors are stored under their Megatron-core names with global layer numbers, so pipeline
// stages, TP, DP and EP layouts and the distributed optimizer can all change between save and load.
// Every rank writes its files into SAVE/iter_0000100.tmp/ and a rank-NNNNN.json describing them;
// rank 0 then merges those into metadata.json, renames the directory into place, and moves the
// tracker. A save that fails or is killed leaves the previous checkpoint as the latest.
// With one rank the names are model.safetensors and optimizer.safetensors.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/tokenizer_files.h"
#include "comm/communicator.h"
#include "model/params.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace mt::checkpoint {

struct RngStreams {
  bool has = false;
  uint64_t seed = 0, offset = 0;        // the dropout stream
  uint64_t tp_seed = 0, tp_offset = 0;  // the model-parallel stream (per TP rank)
};

struct TrainingState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t optimizer_steps = 0;
  // The LR/WD scheduler's position: samples of the iterations that updated the weights (as
  // Megatron's scheduler steps only on successful updates; skipped iterations do not move it).
  int64_t scheduler_samples = 0;
  bool has_optimizer = false;   // set on load: the checkpoint holds optimizer state
  bool has_rng = false;
  uint64_t rng_seed = 0, rng_offset = 0;  // this rank's dropout stream
  uint64_t tp_rng_seed = 0, tp_rng_offset = 0;
  bool has_tp_rng = false;
  int64_t skipped_iterations = 0, nan_iterations = 0;
  // --fp16 runs: the loss scaler (Megatron keeps it in the optimizer's state_dict as
  // 'grad_scaler'); absent in other runs and in checkpoints from before it was saved.
  std::optional<optim::GradScalerState> grad_scaler;
  // FP8 runs: the scaling state per linear (checkpoint/fp8_state.h); null when not saved. Every
  // rank saves the states it holds; a load returns the merged ones.
  nlohmann::json fp8;
  nlohmann::json args;  // model/tokenizer settings the checkpoint was made with
};

// Where this rank sits in the job: names its files and decides what it writes.
struct RankInfo {
  int rank = 0, world = 1;
  int tp = 1, tp_rank = 0, pp = 1, pp_rank = 0, dp = 1, dp_rank = 0;
  // The expert grid (parallel/grid.h): MoE experts are split over EP, their fc1/fc2 over expert
  // TP, and replicated over expert DP.
  int ep = 1, ep_rank = 0, etp_rank = 0, edp_rank = 0;
  comm::Communicator* comm = nullptr;  // every rank (null: a single process)
};

// The optimizer's state as this rank holds it: optim::Optimizer::state(), tensors over flat
// ranges [lo, hi) of the parameter buffer, on the optimizer's device (saves copy them to the host,
// loads fill them through a host copy, as for the parameters); `sharded` says the state is this
// rank's share only (the distributed optimizer).
struct OptimizerState {
  std::vector<optim::StateTensor> arrays;
  bool sharded = false;
  int64_t steps = 0;
};
OptimizerState optimizer_state(optim::Optimizer& opt, bool sharded);

struct SaveOptions {
  // Files copied into the iteration directory (the tokenizer's, checkpoint/tokenizer_files.h):
  // read when save() is called, written by rank 0, listed with their checksums in metadata.json.
  std::vector<Asset> assets;
  bool async = false;              // --async-save
  int64_t retain_interval = 0;     // --save-retain-interval: keep iterations divisible by it, and the latest
  int write_delay_ms = 0;          // tests: a slow disk, so a save can be interrupted part-way
};

// Megatron's tracker may read "release" instead of a number: the checkpoint is then the directory
// SAVE/release/, and it is loaded as weights only, starting at iteration 0 (as Megatron does).
// latest_iteration() returns this value for it, and iteration_dir() maps it to SAVE/release.
constexpr int64_t kReleaseIteration = -1;

std::string iteration_dir(const std::string& save, int64_t iteration);

// Saves (or, async, starts saving) checkpoints. Collective: every rank calls save(), poll() and
// wait() at the same points. Async saves copy what they write to host memory first, so training
// may change the parameters while the files are written by a background thread.
class Saver {
 public:
  explicit Saver(RankInfo ri);
  ~Saver();
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // `opt` null: --no-save-optim. A pending async save is completed first.
  void save(const std::string& dir, const TrainingState& st, model::ParamStore& params, const OptimizerState* opt,
            const SaveOptions& o);
  // Completes an async save whose files every rank has written (never blocks on the writers).
  // Returns the iteration it completed, if any.
  std::optional<int64_t> poll();
  // Blocks until a pending async save is written and completed.
  std::optional<int64_t> wait();
  bool pending() const { return job_ != nullptr; }

  struct Job;

 private:
  int64_t finalize();
  RankInfo ri_;
  std::unique_ptr<Job> job_;
};

// Single-process convenience (one rank, synchronous).
void save_checkpoint(const std::string& save, const TrainingState& state, model::ParamStore& params,
                     optim::Optimizer* optimizer /* null: --no-save-optim */, const SaveOptions& o = {});

// Reads SAVE/latest_checkpointed_iteration.txt: an iteration, or kReleaseIteration for
// "release"; nullopt when the directory holds no checkpoint.
std::optional<int64_t> latest_iteration(const std::string& load);

struct LoadOptions {
  bool load_optim = true;
  bool load_rng = true;
  // The model's true (unpadded) vocabulary, when known: a checkpoint of the same vocabulary padded
  // to another multiple (another TP size or --make-vocab-size-divisible-by) then loads its true
  // rows and zero padding. 0: the padded shapes must match.
  int64_t orig_vocab_size = 0;
};
// Loads iteration `it` into this rank's params (and optimizer state when given and requested),
// resharding from whatever layout saved it; verifies the checksum of every file it reads and
// every tensor's shape. Returns the saved state with this rank's RNG streams. Throws mt::Error
// naming the file, tensor or flag on problems.
TrainingState load_checkpoint(const std::string& load, int64_t it, const RankInfo& ri, model::ParamStore& params,
                              OptimizerState* opt, const LoadOptions& opts);
TrainingState load_checkpoint(const std::string& load, int64_t it, model::ParamStore& params,
                              optim::Optimizer* optimizer, const LoadOptions& opts);

// Whole tensors of a checkpoint by name, whatever layout saved it (for export and inspection).
class CheckpointReader {
 public:
  CheckpointReader(const std::string& load, int64_t it);
  ~CheckpointReader();
  bool has(const std::string& name) const;
  Shape shape(const std::string& name) const;  // throws naming the tensor when missing
  std::vector<float> read(const std::string& name);
  std::vector<std::string> names() const;
  const TrainingState& state() const { return state_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  TrainingState state_;
};

// Reads only state.json (for generate, which needs the model settings first).
TrainingState read_state(const std::string& load, int64_t it);

// What a --load directory holds. Megatron-LM's torch_dist and torch checkpoints count as Native:
// load_checkpoint, read_state and CheckpointReader read them (checkpoint/megatron/) as if they
// were native ones, with the same resharding.
enum class CheckpointKind { Native, HuggingFace, Empty };
// Throws naming --load when it is one iteration's directory rather than the checkpoint's.
CheckpointKind detect_checkpoint(const std::string& dir);

}  // namespace mt::checkpoint
