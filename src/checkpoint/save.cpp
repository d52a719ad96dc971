// Saving: each rank plans the pieces it owns, writes them (inline, or from host copies in a
// background thread with --async-save), verifies its files and describes them in rank-NNNNN.json;
// once every rank is done, rank 0 merges the descriptions into metadata.json, renames the
// directory into place and moves the tracker.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <filesystem>
#include <map>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/io_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/slices.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

namespace {

struct FilePlan {
  std::string name;
  std::vector<TensorEntry> entries;  // data points into the model / optimizer, or staged copies
};

nlohmann::json box_json(const Piece& p) {
  return {{"file", p.file}, {"key", p.key}, {"offset", p.box.offset}, {"extent", p.box.extent},
          {"flat", {p.flat_lo, p.flat_hi}}};
}

std::string rank_file(int rank) { return fmt::format("rank-{:05d}.json", rank); }

// A file the checkpoint carries (a tokenizer's): small, read whole when the save starts.
std::string read_asset(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("--save: cannot read '{}' to copy it into the checkpoint", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

struct Saver::Job {
  fs::path save_dir, tmp, final_dir;
  int64_t iteration = 0;
  SaveOptions o;
  std::vector<FilePlan> files;
  std::deque<std::vector<float>> staged;  // stable addresses as it grows
  nlohmann::json sidecar;
  std::string state_text;  // rank 0
  std::vector<std::pair<std::string, std::string>> assets;  // rank 0: name, bytes
  std::thread thread;
  std::atomic<int> status{0};  // 0 writing, 1 written, 2 failed
  std::string error;
  double t0 = 0;
};

OptimizerState optimizer_state(optim::Optimizer& opt, bool sharded) {
  OptimizerState s;
  s.sharded = sharded;
  s.steps = opt.step_count();
  s.arrays = opt.state();
  for (const auto& a : s.arrays)
    MT_CHECK(a.value.dtype() == DType::F32 && a.value.numel() == a.hi - a.lo,
             "optimizer state {} holds {} {} elements for range [{}, {})", a.name, a.value.numel(),
             dtype_name(a.value.dtype()), a.lo, a.hi);
  return s;
}

std::string iteration_dir(const std::string& save, int64_t iteration) {
  if (iteration == kReleaseIteration) return (fs::path(save) / "release").string();
  MT_CHECK(iteration >= 0, "iteration {}", iteration);
  return (fs::path(save) / fmt::format("iter_{:07d}", iteration)).string();
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Plans this rank's files: which pieces of which tensors it writes, and their descriptions.
// `main` is the flat fp32 main-param buffer on the host.
void plan(const RankInfo& ri, const model::ParamStore& params, const float* main, const OptimizerState* opt,
          Saver::Job& job) {
  const std::string mp = ri.tp * ri.pp == 1 ? "" : fmt::format("-tp{}-pp{}", ri.tp_rank, ri.pp_rank);
  nlohmann::json tensors = nlohmann::json::object();
  auto add_piece = [&](FilePlan& f, const std::string& tensor, const Shape& shape, const Piece& pc, const float* data) {
    // A whole box is stored with its real shape, so other safetensors readers see the tensor
    // (a TP shard: its shard's shape); a flat slice (the distributed optimizer's) stays 1-D.
    const bool whole_box = pc.flat_lo == 0 && pc.flat_hi == pc.box.numel();
    f.entries.push_back({pc.key, DType::F32, whole_box ? Shape(pc.box.extent) : Shape{pc.numel()}, data,
                         static_cast<size_t>(pc.numel()) * 4});
    auto& t = tensors[tensor];
    t["shape"] = shape;
    t["pieces"].push_back(box_json(pc));
  };
  // Experts (Param::expert) are saved from expert-DP rank 0 of the EP rank that holds them, into
  // files of their own (the same file for a single rank).
  const std::string ex = ri.world == 1 ? mp : fmt::format("-ep{}-tp{}-pp{}", ri.ep_rank, ri.etp_rank, ri.pp_rank);
  auto file = [&](const std::string& name) -> FilePlan& {
    for (auto& f : job.files)
      if (f.name == name) return f;
    return job.files.emplace_back(FilePlan{name, {}});
  };
  // A TP-replicated parameter is written by TP rank 0 only (an expert: expert-TP rank 0); a tied
  // embedding's copy on the last pipeline stage not at all (the first stage writes it).
  auto writes = [&](const model::Param& p) {
    return !p.replica && (p.tp.sharded() || (p.expert ? ri.etp_rank : ri.tp_rank) == 0);
  };
  // Whole local shards of the dense (or the expert) parameters: model weights, and optimizer
  // state without the distributed optimizer.
  auto whole = [&](FilePlan& f, bool experts, const std::string& prefix, auto&& data_of) {
    for (const auto& p : params.params()) {
      if (p.expert != experts || !writes(p)) continue;
      auto boxes = local_boxes(p);
      int64_t s = 0;
      for (size_t k = 0; k < boxes.size(); ++k) {
        Piece pc{f.name, prefix + p.name + (boxes.size() == 1 ? "" : fmt::format("#{}", k)), boxes[k], 0,
                 boxes[k].numel()};
        add_piece(f, prefix + p.name, p.full_shape, pc, data_of(p) + s);
        s += boxes[k].numel();
      }
    }
  };
  const auto weights = [main](const model::Param& p) { return main + p.offset; };
  for (const bool experts : {false, true}) {
    if ((experts ? ri.edp_rank : ri.dp_rank) != 0) continue;
    const std::string suffix = (experts ? ex : mp) + ".safetensors";
    whole(file("model" + suffix), experts, "", weights);
    if (opt && !opt->sharded)
      for (const auto& a : opt->arrays)
        whole(file("optimizer" + suffix), experts, a.name + "/",
              [&a](const model::Param& p) { return a.value.data<float>() + (p.offset - a.lo); });
  }
  if (opt && opt->sharded) {
    // The distributed optimizer: this rank's flat slices of each local shard.
    // (Expert slices too: they are sharded over expert DP, each owned by one rank.)
    FilePlan f{fmt::format("optimizer-tp{}-pp{}-dp{}.safetensors", ri.tp_rank, ri.pp_rank, ri.dp_rank), {}};
    for (const auto& a : opt->arrays)
      for (const auto& p : params.params()) {
        if (!writes(p)) continue;
        const int64_t x0 = std::max(a.lo, p.offset) - p.offset, x1 = std::min(a.hi, p.offset + p.numel()) - p.offset;
        if (x0 >= x1) continue;
        auto boxes = local_boxes(p);
        int64_t s = 0;
        for (size_t k = 0; k < boxes.size(); ++k) {
          const int64_t e = s + boxes[k].numel(), y0 = std::max(x0, s), y1 = std::min(x1, e);
          if (y0 < y1) {
            Piece pc{f.name, fmt::format("{}/{}#{}@{}", a.name, p.name, k, y0 - s), boxes[k], y0 - s, y1 - s};
            add_piece(f, a.name + "/" + p.name, p.full_shape, pc, a.value.data<float>() + (p.offset + y0 - a.lo));
          }
          s = e;
        }
      }
    job.files.push_back(std::move(f));
  }
  std::erase_if(job.files, [](const FilePlan& f) { return f.entries.empty(); });
  job.sidecar = {{"rank", ri.rank},       {"tp_rank", ri.tp_rank}, {"pp_rank", ri.pp_rank},
                 {"dp_rank", ri.dp_rank}, {"tensors", tensors},    {"files", nlohmann::json::object()}};
}

// Host copies of everything this rank writes, so training can go on while the files are written.
void stage(Saver::Job& job) {
  for (auto& f : job.files)
    for (auto& e : f.entries) {
      const float* src = static_cast<const float*>(e.data);
      job.staged.emplace_back(src, src + e.nbytes / 4);
      e.data = job.staged.back().data();
    }
}

void write_files(Saver::Job& job, int rank) {
  for (auto& f : job.files) {
    const fs::path path = job.tmp / f.name;
    const uint32_t crc = write_safetensors(path.string(), f.entries);  // fsynced
    if (job.o.write_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(job.o.write_delay_ms));
    // Read back: the tracker only moves past files that hold what was meant to be written.
    if (crc32_file(path.string()) != crc) fail("checkpoint file '{}' did not read back as written", path.string());
    job.sidecar["files"][f.name] = {{"crc32", crc}, {"bytes", fs::file_size(path)}};
  }
  if (rank == 0) {
    for (const auto& [name, bytes] : job.assets) {
      const fs::path ap = job.tmp / name;
      fs::create_directories(ap.parent_path());
      write_text_durable(ap, bytes);
      job.sidecar["files"][name] = {{"crc32", crc32_file(ap.string())}, {"bytes", fs::file_size(ap)}};
    }
    const fs::path sp = job.tmp / "state.json";
    write_text_durable(sp, job.state_text);
    job.sidecar["files"]["state.json"] = {{"crc32", crc32_file(sp.string())}, {"bytes", fs::file_size(sp)}};
  }
  write_text_durable(job.tmp / rank_file(rank), job.sidecar.dump());
}

nlohmann::json state_json(const TrainingState& st, bool has_optimizer) {
  nlohmann::json j = {{"iteration", st.iteration},
          {"consumed_train_samples", st.consumed_train_samples},
          {"consumed_valid_samples", st.consumed_valid_samples},
          {"optimizer_steps", st.optimizer_steps},
          {"scheduler_samples", st.scheduler_samples},
          {"has_optimizer", has_optimizer},
          {"has_rng", st.has_rng},
          {"rng_seed", st.rng_seed},
          {"rng_offset", st.rng_offset},
          {"skipped_iterations", st.skipped_iterations},
          {"nan_iterations", st.nan_iterations},
          {"args", st.args}};
  if (st.grad_scaler)
    j["grad_scaler"] = {{"scale", st.grad_scaler->scale},  // a float: prints back to the same bits
                        {"growth_tracker", st.grad_scaler->growth_tracker},
                        {"hysteresis_tracker", st.grad_scaler->hysteresis_tracker}};
  return j;
}

// Rank 0: every rank's description -> metadata.json; then the directory and the tracker move.
void merge_and_commit(const RankInfo& ri, Saver::Job& job, const nlohmann::json& layout) {
  nlohmann::json files = nlohmann::json::object(), tensors = nlohmann::json::object(), rng = nlohmann::json::array();
  nlohmann::json fp8 = nlohmann::json::object();
  for (int r = 0; r < ri.world; ++r) {
    const fs::path p = job.tmp / rank_file(r);
    if (!fs::exists(p)) fail("rank {} did not finish its part of checkpoint '{}'", r, job.tmp.string());
    nlohmann::json s = parse_json_file(p);
    for (auto& [name, f] : s.at("files").items()) files[name] = f;
    for (auto& [name, t] : s.at("tensors").items()) {
      auto& dst = tensors[name];
      if (dst.is_null()) dst = {{"shape", t.at("shape")}, {"pieces", nlohmann::json::array()}};
      if (dst["shape"] != t.at("shape"))
        fail("ranks disagree on the shape of tensor '{}' ({} vs {})", name, dst["shape"].dump(), t.at("shape").dump());
      for (auto& pc : t.at("pieces")) {
        // The same slice written twice (a tied embedding on two pipeline stages) is kept once.
        bool dup = false;
        for (auto& q : dst["pieces"])
          dup |= q["offset"] == pc["offset"] && q["extent"] == pc["extent"] && q["flat"] == pc["flat"];
        if (!dup) dst["pieces"].push_back(pc);
      }
    }
    if (s.contains("rng")) rng.push_back(s["rng"]);
    if (s.contains("fp8"))  // the lowest rank's copy of each (TP ranks hold equal ones)
      for (auto& [name, e] : s["fp8"].items())
        if (!fp8.contains(name)) fp8[name] = e;
  }
  for (auto& [name, t] : tensors.items()) {
    int64_t have = 0, want = shape_numel(t["shape"].get<Shape>());
    for (auto& pc : t["pieces"]) have += pc["flat"][1].get<int64_t>() - pc["flat"][0].get<int64_t>();
    if (have != want) fail("checkpoint tensor '{}': the ranks wrote {} of its {} elements", name, have, want);
  }
  nlohmann::json meta = {{"format", "megatron.cpp-native"}, {"version", 2},     {"iteration", job.iteration},
                         {"layout", layout},                 {"files", files}, {"tensors", tensors}};
  if (!rng.empty()) meta["rng"] = rng;
  if (!fp8.empty()) meta["fp8"] = fp8;
  for (int r = 0; r < ri.world; ++r) fs::remove(job.tmp / rank_file(r));
  write_text_durable(job.tmp / "metadata.json", meta.dump());
  fsync_path(job.tmp);
  std::error_code ec;
  if (fs::exists(job.final_dir)) {  // a re-save of the same iteration replaces it only now
    fs::path old = job.final_dir.string() + ".old." + std::to_string(::getpid());
    fs::rename(job.final_dir, old);
    fs::rename(job.tmp, job.final_dir);
    fs::remove_all(old, ec);
  } else {
    fs::rename(job.tmp, job.final_dir, ec);
    if (ec) fail("cannot rename '{}' to '{}': {}", job.tmp.string(), job.final_dir.string(), ec.message());
  }
  fsync_path(job.save_dir);
  write_text_durable(job.save_dir / "latest_checkpointed_iteration.txt", std::to_string(job.iteration));
  fsync_path(job.save_dir);
  if (job.o.retain_interval > 0) {  // Megatron's --save-retain-interval: keep multiples, and the latest
    for (const auto& e : fs::directory_iterator(job.save_dir)) {
      const std::string n = e.path().filename().string();
      // iter_ and exactly seven digits (checked by hand: std::regex doubled this file's build time)
      if (n.size() != 12 || n.compare(0, 5, "iter_") != 0 ||
          !std::all_of(n.begin() + 5, n.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        continue;
      const int64_t it = std::stoll(n.substr(5));
      if (it != job.iteration && it % job.o.retain_interval != 0) fs::remove_all(e.path(), ec);
    }
  }
}

// Collective: true when every rank reports `mine` (max over ranks of the flags).
void all_max(const RankInfo& ri, double* v, size_t n) {
  if (ri.comm && ri.world > 1) ri.comm->all_reduce(v, n, comm::ReduceOp::Max);
}

}  // namespace

Saver::Saver(RankInfo ri) : ri_(ri) {}

Saver::~Saver() {
  if (job_ && job_->thread.joinable()) job_->thread.join();  // never leave a writer running
}

void Saver::save(const std::string& dir, const TrainingState& st, model::ParamStore& params, const OptimizerState* opt,
                 const SaveOptions& o) {
  if (job_) wait();
  auto job = std::make_unique<Job>();
  job->t0 = now_s();
  job->save_dir = dir;
  job->iteration = st.iteration;
  job->final_dir = iteration_dir(dir, st.iteration);
  job->tmp = job->final_dir.string() + ".tmp";
  job->o = o;
  double failed = 0;
  std::string err;
  if (ri_.rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) fail("--save: cannot create directory '{}': {}", dir, ec.message());
      fs::remove_all(job->tmp, ec);  // left by a save that was killed (a link there: the link goes)
      // Created here and now, never an existing directory or a link planted at its name.
      if (!fs::create_directory(job->tmp, ec) || ec)
        fail("--save: cannot create '{}': {}", job->tmp.string(),
             ec ? ec.message() : "something else created it meanwhile");
    } catch (const Error& e) {
      failed = 1;
      err = e.what();
    }
  }
  all_max(ri_, &failed, 1);
  if (failed) fail("{}", err.empty() ? "--save: rank 0 could not create the checkpoint directory" : err);
  const float* main = params.main_buffer().data<float>();
  if (params.device() != Device::CPU) {  // parameters on the GPU: write from a host copy
    job->staged.push_back(params.main_buffer().to_device(Device::CPU).to_vector());
    main = job->staged.back().data();
  }
  // Optimizer state on the GPU: written from host copies too (they live until the files are
  // written, or until an async save's stage() has copied them).
  std::optional<OptimizerState> host_opt;
  if (opt && std::any_of(opt->arrays.begin(), opt->arrays.end(),
                         [](const optim::StateTensor& a) { return a.value.device() != Device::CPU; })) {
    host_opt = *opt;
    for (auto& a : host_opt->arrays) a.value = a.value.to_device(Device::CPU);
    opt = &*host_opt;
  }
  plan(ri_, params, main, opt, *job);
  if (st.has_rng)
    job->sidecar["rng"] = {{"rank", ri_.rank},       {"tp_rank", ri_.tp_rank},      {"pp_rank", ri_.pp_rank},
                           {"dp_rank", ri_.dp_rank}, {"seed", st.rng_seed},         {"offset", st.rng_offset},
                           {"tp_seed", st.tp_rng_seed}, {"tp_offset", st.tp_rng_offset}};
  if (!st.fp8.is_null()) job->sidecar["fp8"] = st.fp8;
  if (ri_.rank == 0) {
    job->state_text = state_json(st, opt != nullptr).dump(2);
    for (const Asset& a : o.assets) job->assets.emplace_back(a.name, read_asset(a.source));
  }
  if (o.async) {
    stage(*job);
    Job* j = job.get();
    const int rank = ri_.rank;
    job->thread = std::thread([j, rank] {
      try {
        write_files(*j, rank);
        j->status = 1;
      } catch (const std::exception& e) {
        j->error = e.what();
        j->status = 2;
      }
    });
    job_ = std::move(job);
    return;
  }
  try {
    write_files(*job, ri_.rank);
    job->status = 1;
  } catch (const std::exception& e) {
    job->error = e.what();
    job->status = 2;
  }
  job_ = std::move(job);
  finalize();
}

std::optional<int64_t> Saver::poll() {
  if (!job_) return std::nullopt;
  double v[2] = {job_->status == 0 ? 1.0 : 0.0, job_->status == 2 ? 1.0 : 0.0};
  all_max(ri_, v, 2);
  if (v[0] > 0 && v[1] == 0) return std::nullopt;  // still writing somewhere
  if (v[0] > 0) {  // a rank failed while others still write: wait for them, then report
    if (job_->thread.joinable()) job_->thread.join();
  }
  return finalize();
}

std::optional<int64_t> Saver::wait() {
  if (!job_) return std::nullopt;
  if (job_->thread.joinable()) job_->thread.join();
  return finalize();
}

int64_t Saver::finalize() {
  if (job_->thread.joinable()) job_->thread.join();
  std::unique_ptr<Job> job = std::move(job_);
  double failed = job->status == 2 ? 1.0 : 0.0;
  all_max(ri_, &failed, 1);
  if (failed) {
    if (job->status == 2) fail("saving checkpoint iteration {} failed: {}", job->iteration, job->error);
    fail("saving checkpoint iteration {} failed on another rank (see its error); the previous checkpoint stays the "
         "latest",
         job->iteration);
  }
  std::string err;
  if (ri_.rank == 0) {
    try {
      nlohmann::json layout = {{"world", ri_.world}, {"tp", ri_.tp}, {"pp", ri_.pp}, {"dp", ri_.dp}};
      merge_and_commit(ri_, *job, layout);
    } catch (const std::exception& e) {
      err = e.what();
      failed = 1;
    }
  }
  all_max(ri_, &failed, 1);
  if (failed) fail("saving checkpoint iteration {} failed{}", job->iteration, err.empty() ? " on rank 0" : ": " + err);
  log_info("saved checkpoint at iteration {:7d} to {} in {:.2f} s{}", job->iteration, job->save_dir.string(),
           now_s() - job->t0, job->o.async ? " (async: written while training went on)" : "");
  return job->iteration;
}

void save_checkpoint(const std::string& save, const TrainingState& state, model::ParamStore& params,
                     optim::Optimizer* optimizer, const SaveOptions& o) {
  Saver s(RankInfo{});
  std::optional<OptimizerState> os;
  if (optimizer) os = optimizer_state(*optimizer, false);
  s.save(save, state, params, os ? &*os : nullptr, o);
}

}  // namespace mt::checkpoint
