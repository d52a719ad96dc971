// Loading: read metadata.json, then fill every box this rank needs from the stored pieces that
// overlap it, whatever layout wrote them. Each file is checksummed once, before its first use.
#include <algorithm>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/io_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/slices.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

namespace {

struct FileInfo {
  uint32_t crc = 0;
  int64_t bytes = -1;  // -1: unknown (version 1)
};

// The checkpoint's files, opened and verified on first use.
class Files {
 public:
  Files(fs::path dir, std::map<std::string, FileInfo> info) : dir_(std::move(dir)), info_(std::move(info)) {}
  const SafetensorsFile& get(const std::string& name) {
    auto it = open_.find(name);
    if (it != open_.end()) return it->second;
    verify(name);
    return open_.emplace(name, SafetensorsFile((dir_ / name).string())).first->second;
  }
  void verify(const std::string& name) {
    const fs::path p = dir_ / name;
    auto it = info_.find(name);
    if (it == info_.end()) fail("checkpoint '{}' refers to file '{}' that its metadata.json does not list", dir_.string(), name);
    if (!fs::exists(p))
      fail("checkpoint file '{}' is missing (the checkpoint is incomplete: a shard was deleted or not copied)",
           p.string());
    if (it->second.bytes >= 0 && static_cast<int64_t>(fs::file_size(p)) != it->second.bytes)
      fail("checkpoint file '{}' is corrupt: {} bytes, metadata.json says {} (truncated?)", p.string(),
           fs::file_size(p), it->second.bytes);
    if (crc32_file(p.string()) != it->second.crc)
      fail("checkpoint file '{}' is corrupt (checksum mismatch)", p.string());
  }
  const fs::path& dir() const { return dir_; }
  bool lists(const std::string& name) const { return info_.count(name) != 0; }

 private:
  fs::path dir_;
  std::map<std::string, FileInfo> info_;
  std::map<std::string, SafetensorsFile> open_;
};

struct Index {
  std::map<std::string, TensorIndex> tensors;
  nlohmann::json meta;
};

Box box_from(const nlohmann::json& j) {
  return Box{j.at("offset").get<std::vector<int64_t>>(), j.at("extent").get<std::vector<int64_t>>()};
}

// Version 1 (single-rank) checkpoints list whole tensors in model.safetensors and
// optimizer.safetensors; describe them as one piece each.
void index_v1(Files& files, const nlohmann::json& meta, Index& idx) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    if (!meta.at("files").contains(f)) continue;
    const SafetensorsFile& sf = files.get(f);
    for (const auto& key : sf.names()) {
      const TensorEntry& e = sf.entry(key);
      Piece pc{f, key, Box{std::vector<int64_t>(e.shape.size(), 0), e.shape}, 0, shape_numel(e.shape)};
      idx.tensors[key] = TensorIndex{e.shape, {pc}};
    }
  }
}

Index read_index(const fs::path& dir, std::unique_ptr<Files>& files) {
  Index idx;
  idx.meta = parse_json_file(dir / "metadata.json");
  const auto& m = idx.meta;
  try {
    if (m.value("format", "") != "megatron.cpp-native")
      fail("'{}' is not a megatron.cpp checkpoint (format '{}')", (dir / "metadata.json").string(),
           m.value("format", "?"));
    const int version = m.at("version");
    std::map<std::string, FileInfo> info;
    for (auto& [name, f] : m.at("files").items()) {
      if (f.is_number()) info[name] = {f.get<uint32_t>(), -1};
      else info[name] = {f.at("crc32").get<uint32_t>(), f.at("bytes").get<int64_t>()};
    }
    files = std::make_unique<Files>(dir, std::move(info));
    if (version == 1) {
      index_v1(*files, m, idx);
      return idx;
    }
    if (version != 2)
      fail("'{}' is format version {}, newer than this megatron.cpp reads (2); update megatron.cpp",
           (dir / "metadata.json").string(), version);
    for (auto& [name, t] : m.at("tensors").items()) {
      TensorIndex ti;
      ti.shape = t.at("shape").get<Shape>();
      for (auto& pc : t.at("pieces")) {
        auto flat = pc.at("flat").get<std::vector<int64_t>>();
        if (flat.size() != 2) fail("'{}': tensor '{}' has a malformed piece", (dir / "metadata.json").string(), name);
        ti.pieces.push_back({pc.at("file"), pc.at("key"), box_from(pc), flat[0], flat[1]});
      }
      idx.tensors[name] = std::move(ti);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is corrupt: {}", (dir / "metadata.json").string(), e.what());
  }
  return idx;
}

// Fills elements [lo, hi) of a local shard (the concatenation of `boxes`) of tensor `name` into dst.
void fill(Index& idx, Files& files, const std::string& name, const Shape& shape, const std::vector<Box>& boxes,
          int64_t lo, int64_t hi, float* dst) {
  auto it = idx.tensors.find(name);
  if (it == idx.tensors.end())
    fail("tensor '{}' is missing from checkpoint '{}' (a checkpoint of another model shape? check --num-layers, "
         "--swiglu, --untie-embeddings-and-output-weights, --add-qkv-bias)",
         name, files.dir().string());
  if (it->second.shape != shape)
    fail("tensor '{}' in checkpoint '{}' has shape {} but the model expects {} (checkpoint of another model shape?)",
         name, files.dir().string(), shape_to_string(it->second.shape), shape_to_string(shape));
  int64_t copied = 0, s = 0;
  for (const Box& b : boxes) {
    const int64_t e = s + b.numel(), y0 = std::max(lo, s), y1 = std::min(hi, e);
    if (y0 < y1) {
      for (const Piece& pc : it->second.pieces) {
        bool meets = true;  // skip pieces whose box misses this one without opening their file
        for (size_t d = 0; d < b.offset.size() && d < pc.box.offset.size(); ++d)
          meets &= pc.box.offset[d] < b.offset[d] + b.extent[d] && b.offset[d] < pc.box.offset[d] + pc.box.extent[d];
        if (!meets) continue;
        const TensorEntry& en = files.get(pc.file).entry(pc.key);
        if (en.dtype != DType::F32 || shape_numel(en.shape) != pc.numel())
          fail("checkpoint file '{}' is corrupt: entry '{}' does not match metadata.json", (files.dir() / pc.file).string(),
               pc.key);
        copied += copy_overlap(pc.box, pc.flat_lo, pc.flat_hi, static_cast<const float*>(en.data), b, y0 - s, y1 - s,
                               dst + (y0 - lo));
      }
    }
    s = e;
  }
  if (copied != hi - lo)
    fail("tensor '{}' is incomplete in checkpoint '{}': found {} of the {} elements this rank needs (a shard file "
         "missing from metadata.json?)",
         name, files.dir().string(), copied, hi - lo);
}

}  // namespace

std::optional<int64_t> latest_iteration(const std::string& load) {
  const fs::path tracker = fs::path(load) / "latest_checkpointed_iteration.txt";
  if (!fs::exists(load)) fail("--load: directory '{}' does not exist", load);
  if (!fs::exists(tracker)) return std::nullopt;
  std::string t = read_text(tracker);
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (t == "release") return 0;
  try {
    size_t pos = 0;
    int64_t it = std::stoll(t, &pos);
    if (pos != t.size() || it < 0) throw std::invalid_argument(t);
    return it;
  } catch (const std::exception&) {
    fail("'{}' should hold an iteration number, found '{}'", tracker.string(), t);
  }
}

TrainingState read_state(const std::string& load, int64_t it) {
  const fs::path dir = iteration_dir(load, it);
  if (!fs::exists(dir)) fail("--load: checkpoint directory '{}' is missing (tracker points at iteration {})", dir.string(), it);
  if (!fs::exists(dir / "metadata.json"))
    fail("--load: '{}' has no metadata.json: the save did not complete", dir.string());
  nlohmann::json s = parse_json_file(dir / "state.json");
  TrainingState st;
  try {
    st.iteration = s.at("iteration");
    st.consumed_train_samples = s.at("consumed_train_samples");
    st.consumed_valid_samples = s.at("consumed_valid_samples");
    st.optimizer_steps = s.at("optimizer_steps");
    // Older checkpoints: the scheduler followed the consumed samples.
    st.scheduler_samples = s.value("scheduler_samples", st.consumed_train_samples);
    st.has_rng = s.at("has_rng");
    st.rng_seed = s.at("rng_seed");
    st.rng_offset = s.at("rng_offset");
    st.has_optimizer = s.value("has_optimizer", true);
    st.skipped_iterations = s.value("skipped_iterations", 0);
    st.nan_iterations = s.value("nan_iterations", 0);
    if (s.contains("grad_scaler")) {  // --fp16 checkpoints only
      const auto& g = s.at("grad_scaler");
      st.grad_scaler = optim::GradScalerState{g.at("scale").get<float>(), g.at("growth_tracker").get<int64_t>(),
                                              g.at("hysteresis_tracker").get<int64_t>()};
    }
    st.args = s.at("args");
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is missing a field: {}", (dir / "state.json").string(), e.what());
  }
  return st;
}

TrainingState load_checkpoint(const std::string& load, int64_t it, const RankInfo& ri, model::ParamStore& params,
                              OptimizerState* opt, const LoadOptions& opts) {
  const fs::path dir = iteration_dir(load, it);
  TrainingState st = read_state(load, it);
  std::unique_ptr<Files> files;
  Index idx = read_index(dir, files);
  if (files->lists("state.json")) files->verify("state.json");

  // Parameters on the GPU are filled through a host copy.
  const bool on_host = params.device() == Device::CPU;
  Tensor host = on_host ? params.main_buffer() : params.main_buffer().to_device(Device::CPU);
  for (auto& p : params.params())
    fill(idx, *files, p.name, p.full_shape, local_boxes(p), 0, p.numel(), host.data<float>() + p.offset);
  if (!on_host) params.main_buffer().copy_from(host);
  if (ri.pp == 1) {  // every model tensor is local: anything left over is another model shape
    size_t model_tensors = 0;
    std::string extra;
    for (const auto& [name, t] : idx.tensors) {
      if (name.find('/') != std::string::npos) continue;  // optimizer state
      ++model_tensors;
      if (!params.find(name) && extra.empty()) extra = name;
    }
    if (!extra.empty())
      fail("checkpoint '{}' holds {} tensors, among them '{}', which the model lacks (checkpoint of another model "
           "shape?)",
           dir.string(), model_tensors, extra);
  }
  params.sync_model_from_main();

  if (opt && opts.load_optim) {
    if (!st.has_optimizer)
      fail("'{}' has no optimizer state (saved with --no-save-optim); use --no-load-optim or --finetune", dir.string());
    for (const auto& a : opt->arrays)
      for (auto& p : params.params()) {
        const int64_t x0 = std::max(a.lo, p.offset) - p.offset, x1 = std::min(a.hi, p.offset + p.numel()) - p.offset;
        if (x0 >= x1) continue;
        const std::string name = a.name + "/" + p.name;
        if (!idx.tensors.count(name) && idx.tensors.count(p.name))
          fail("checkpoint '{}' has no optimizer state '{}' for '{}' (saved with another --optimizer?); use "
               "--no-load-optim to start the optimizer afresh",
               dir.string(), a.name, p.name);
        fill(idx, *files, name, p.full_shape, local_boxes(p), x0, x1, a.data + (p.offset + x0 - a.lo));
      }
    opt->steps = st.optimizer_steps;
  }

  // RNG: this rank's own streams when the layout is the one that saved; otherwise rank 0's
  // (stream offsets advance alike on every rank, the seeds come from --seed and the TP rank).
  st.has_tp_rng = false;
  if (opts.load_rng && idx.meta.contains("rng")) {
    const auto& layout = idx.meta.at("layout");
    const bool same = layout.value("tp", 1) == ri.tp && layout.value("pp", 1) == ri.pp && layout.value("dp", 1) == ri.dp;
    const nlohmann::json* pick = nullptr;
    for (const auto& r : idx.meta["rng"]) {
      if (same && r.at("rank") == ri.rank) pick = &r;
      if (!same && r.at("rank") == 0) pick = &r;
    }
    if (pick) {
      st.has_rng = true;
      st.rng_seed = pick->at("seed");
      st.rng_offset = pick->at("offset");
      st.tp_rng_seed = pick->at("tp_seed");
      st.tp_rng_offset = pick->at("tp_offset");
      st.has_tp_rng = true;
    }
    if (!same)
      log_info("checkpoint saved with TP {} x PP {} x DP {}, loading as TP {} x PP {} x DP {}: resharded",
               layout.value("tp", 1), layout.value("pp", 1), layout.value("dp", 1), ri.tp, ri.pp, ri.dp);
  }
  return st;
}

TrainingState load_checkpoint(const std::string& load, int64_t it, model::ParamStore& params,
                              optim::Optimizer* optimizer, const LoadOptions& opts) {
  std::optional<OptimizerState> os;
  if (optimizer) os = optimizer_state(*optimizer, {{0, params.numel()}}, false);
  TrainingState st = load_checkpoint(load, it, RankInfo{}, params, os ? &*os : nullptr, opts);
  if (optimizer && opts.load_optim) optimizer->set_step_count(st.optimizer_steps);
  return st;
}

struct CheckpointReader::Impl {
  std::unique_ptr<Files> files;
  Index idx;
};

CheckpointReader::CheckpointReader(const std::string& load, int64_t it) : impl_(std::make_unique<Impl>()) {
  state_ = read_state(load, it);
  impl_->idx = read_index(iteration_dir(load, it), impl_->files);
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& name) const { return impl_->idx.tensors.count(name) != 0; }

Shape CheckpointReader::shape(const std::string& name) const {
  auto it = impl_->idx.tensors.find(name);
  if (it == impl_->idx.tensors.end())
    fail("tensor '{}' is missing from checkpoint '{}'", name, impl_->files->dir().string());
  return it->second.shape;
}

std::vector<float> CheckpointReader::read(const std::string& name) {
  const Shape s = shape(name);
  std::vector<float> out(static_cast<size_t>(shape_numel(s)));
  const Box whole{std::vector<int64_t>(s.size(), 0), s};
  fill(impl_->idx, *impl_->files, name, s, {whole}, 0, whole.numel(), out.data());
  return out;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : impl_->idx.tensors) out.push_back(n);
  return out;
}

CheckpointKind detect_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::exists(d)) fail("--load: directory '{}' does not exist", dir);
  if (!fs::is_directory(d)) fail("--load: '{}' is a file; give the directory that --save wrote, or a HuggingFace model directory", dir);
  auto torch_formats = [&](const fs::path& p) {
    if (fs::exists(p / ".metadata") || fs::exists(p / "__0_0.distcp"))
      fail("--load '{}' is a Megatron-LM torch_dist checkpoint (PyTorch distributed checkpoint files), which "
           "megatron.cpp does not read; export it to HuggingFace with Megatron-LM and load that directory instead",
           dir);
    if (fs::exists(p / "mp_rank_00") || fs::exists(p / "mp_rank_00_000"))
      fail("--load '{}' is a Megatron-LM --ckpt-format torch checkpoint (Python pickles, which can run code), which "
           "megatron.cpp does not read; export it to HuggingFace with Megatron-LM and load that directory instead",
           dir);
  };
  if (fs::exists(d / "latest_checkpointed_iteration.txt")) {
    if (auto it = latest_iteration(dir)) {
      const fs::path i = iteration_dir(dir, *it);
      if (fs::exists(i) && !fs::exists(i / "metadata.json")) torch_formats(i);
    }
    return CheckpointKind::Native;
  }
  if (fs::exists(d / "config.json")) {
    if (fs::exists(d / "model.safetensors") || fs::exists(d / "model.safetensors.index.json"))
      return CheckpointKind::HuggingFace;
    if (fs::exists(d / "pytorch_model.bin") || fs::exists(d / "pytorch_model.bin.index.json"))
      fail("--load '{}' holds pytorch_model.bin (a Python pickle, which can run code); megatron.cpp reads "
           "safetensors only: re-save it with save_pretrained(..., safe_serialization=True)",
           dir);
  }
  if (fs::exists(d / "metadata.json") && fs::exists(d / "state.json"))
    fail("--load '{}' is one iteration's directory; give its parent (the directory --save wrote)", dir);
  torch_formats(d);
  return CheckpointKind::Empty;
}

}  // namespace mt::checkpoint
