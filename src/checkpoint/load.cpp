// Loading: read metadata.json, then fill every box this rank needs from the stored pieces that
// overlap it, whatever layout wrote them. Each file is checksummed once, before its first use.
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/io_util.h"
#include "checkpoint/json_fields.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/slices.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

namespace {

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
    std::error_code ec;
    if (!fs::exists(p, ec))
      fail("checkpoint file '{}' is missing (the checkpoint is incomplete: a shard was deleted or not copied)",
           p.string());
    require_regular_file(p.string(), "checkpoint file");  // a directory, FIFO or device is never a shard
    const auto bytes = fs::file_size(p, ec);
    if (ec) fail("cannot read checkpoint file '{}': {}", p.string(), ec.message());
    if (it->second.bytes >= 0 && static_cast<int64_t>(bytes) != it->second.bytes)
      fail("checkpoint file '{}' is corrupt: {} bytes, metadata.json says {} (truncated?)", p.string(), bytes,
           it->second.bytes);
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

// Version 1 (single-rank) checkpoints list whole tensors in model.safetensors and
// optimizer.safetensors; describe them as one piece each.
void index_v1(Files& files, Metadata& md) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    if (!md.files.count(f)) continue;
    const SafetensorsFile& sf = files.get(f);
    for (const auto& key : sf.names()) {
      const TensorEntry& e = sf.entry(key);
      Piece pc{f, key, Box{std::vector<int64_t>(e.shape.size(), 0), e.shape}, 0, shape_numel(e.shape)};
      md.tensors[key] = TensorIndex{e.shape, {pc}};
    }
  }
}

Metadata read_index(const fs::path& dir, std::unique_ptr<Files>& files) {
  const fs::path path = dir / "metadata.json";
  Metadata md = parse_metadata(parse_json_file(path), path.string());
  files = std::make_unique<Files>(dir, md.files);
  if (md.version == 1) index_v1(*files, md);
  return md;
}

// The vocabulary tensors (and their optimizer states), whose rows past the true vocabulary are
// padding to a multiple that depends on the TP size.
bool is_vocab_tensor(const std::string& name) {
  const std::string param = name.substr(name.rfind('/') + 1);
  return param == "embedding.word_embeddings.weight" || param == "output_layer.weight";
}

// `b` cut to its rows before global row `rows` (dimension 0 is outermost, so those are a prefix
// of the box and keep their flat indices).
Box rows_before(const Box& b, int64_t rows) {
  Box c = b;
  if (!c.extent.empty()) c.extent[0] = std::clamp<int64_t>(rows - c.offset[0], 0, c.extent[0]);
  return c;
}

// What one load needs besides its arguments.
struct Source {
  Metadata idx;
  std::unique_ptr<Files> files;
  // A Megatron-LM checkpoint's tensors, read whole into memory: pieces with an empty file name.
  std::map<std::string, megatron::HostTensor> mem;
  int64_t model_vocab = 0;  // the model's true vocabulary (0: not known)
  int64_t ckpt_vocab = 0;   // the checkpoint's, from its state.json (0: not recorded)
  bool told_repad = false;
};

// Fills elements [lo, hi) of a local shard (the concatenation of `boxes`) of tensor `name` into dst.
// A vocabulary tensor padded to another number of rows than the model's takes the checkpoint's
// true vocabulary rows and zero padding.
void fill(Source& src, const std::string& name, const Shape& shape, const std::vector<Box>& boxes, int64_t lo,
          int64_t hi, float* dst) {
  Files& files = *src.files;
  auto it = src.idx.tensors.find(name);
  if (it == src.idx.tensors.end())
    fail("tensor '{}' is missing from checkpoint '{}' (a checkpoint of another model shape? check --num-layers, "
         "--swiglu, --untie-embeddings-and-output-weights, --add-qkv-bias, --num-experts, --moe-layer-freq)",
         name, files.dir().string());
  const Shape& saved = it->second.shape;
  int64_t rows = shape.empty() ? 0 : shape[0];  // rows taken from the checkpoint
  if (saved != shape) {
    const bool only_rows = saved.size() == shape.size() && !shape.empty() &&
                           std::equal(saved.begin() + 1, saved.end(), shape.begin() + 1);
    const bool vocab = only_rows && is_vocab_tensor(name) && src.model_vocab > 0 && src.ckpt_vocab > 0;
    if (vocab && src.model_vocab != src.ckpt_vocab)
      fail("checkpoint '{}' has a vocabulary of {} tokens, the model {} (another tokenizer or --vocab-size?)",
           files.dir().string(), src.ckpt_vocab, src.model_vocab);
    if (!vocab || src.ckpt_vocab > std::min(saved[0], shape[0]))
      fail("tensor '{}' in checkpoint '{}' has shape {} but the model expects {} (checkpoint of another model shape?)",
           name, files.dir().string(), shape_to_string(saved), shape_to_string(shape));
    rows = src.ckpt_vocab;
    if (!src.told_repad)
      log_info("checkpoint '{}' pads its vocabulary of {} tokens to {} rows, this layout to {}: loading the {} true "
               "rows and zero padding",
               files.dir().string(), rows, saved[0], shape[0], rows);
    src.told_repad = true;
  }
  int64_t copied = 0, wanted = 0, s = 0;
  for (const Box& b : boxes) {
    const int64_t e = s + b.numel(), y0 = std::max(lo, s), y1 = std::min(hi, e);
    const Box want = rows_before(b, rows);
    const int64_t w1 = std::min(y1, s + want.numel());  // [y0, w1) from the checkpoint, [w1, y1) padding
    if (y0 < w1) {
      wanted += w1 - y0;
      for (const Piece& pc : it->second.pieces) {
        const Box have = rows_before(pc.box, rows);
        const int64_t have_hi = std::min(pc.flat_hi, have.numel());
        if (pc.flat_lo >= have_hi) continue;
        bool meets = true;  // skip pieces whose box misses this one without opening their file
        for (size_t d = 0; d < want.offset.size(); ++d)
          meets &= have.offset[d] < want.offset[d] + want.extent[d] && want.offset[d] < have.offset[d] + have.extent[d];
        if (!meets) continue;
        if (pc.file.empty()) {
          const megatron::HostTensor& t = src.mem.at(pc.key);
          copied += copy_overlap(have, pc.flat_lo, have_hi, t.values.data(), want, y0 - s, w1 - s, dst + (y0 - lo));
          continue;
        }
        const TensorEntry& en = files.get(pc.file).entry(pc.key);
        if (en.dtype != DType::F32 || shape_numel(en.shape) != pc.numel())
          fail("checkpoint file '{}' is corrupt: entry '{}' ({} of {} elements) does not match metadata.json ({} F32 "
               "elements)",
               (files.dir() / pc.file).string(), pc.key, safetensors_dtype(en.dtype), shape_numel(en.shape), pc.numel());
        copied += copy_overlap(have, pc.flat_lo, have_hi, static_cast<const float*>(en.data), want, y0 - s, w1 - s,
                               dst + (y0 - lo));
      }
    }
    if (std::max(y0, w1) < y1) std::fill(dst + (std::max(y0, w1) - lo), dst + (y1 - lo), 0.f);
    s = e;
  }
  if (copied != wanted)
    fail("tensor '{}' is incomplete in checkpoint '{}': found {} of the {} elements this rank needs (a shard file "
         "missing from metadata.json?)",
         name, files.dir().string(), copied, wanted);
}

}  // namespace

std::optional<int64_t> latest_iteration(const std::string& load) {
  const fs::path tracker = fs::path(load) / "latest_checkpointed_iteration.txt";
  std::error_code ec;
  if (!fs::exists(load, ec)) fail("--load: directory '{}' does not exist", load);
  if (!fs::exists(tracker, ec) && !fs::is_symlink(tracker, ec)) return std::nullopt;
  std::string t = read_text(tracker, "--load");
  // Megatron reads it with int(f.read().strip()), or the word "release".
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!t.empty() && space(t.back())) t.pop_back();
  while (!t.empty() && space(t.front())) t.erase(t.begin());
  if (t == "release") return kReleaseIteration;
  int64_t it = -1;
  const auto [end, err] = std::from_chars(t.data(), t.data() + t.size(), it);
  if (t.empty() || err != std::errc() || end != t.data() + t.size() || it < 0 || it > kMaxIteration)
    fail("'{}' should hold an iteration number (0 to {}) or 'release', found '{}'", tracker.string(), kMaxIteration,
         t.substr(0, 40));
  return it;
}

namespace {

// A Megatron-LM torch_dist or torch iteration directory (native ones have state.json; Megatron's
// torch_dist has a metadata.json too, naming its backend).
bool is_megatron(const fs::path& dir) {
  std::error_code ec;
  return !fs::exists(dir / "state.json", ec) && megatron::detect_format(dir.string()) != megatron::Format::None;
}

// A Megatron-LM checkpoint as a source: every tensor one whole piece held in memory.
TrainingState open_megatron(const fs::path& dir, int64_t it, Source& src) {
  megatron::Imported im = megatron::read_checkpoint(dir.string(), it, true);
  src.files = std::make_unique<Files>(dir, std::map<std::string, FileInfo>{});
  for (auto& [name, t] : im.tensors) {
    Piece pc{"", name, Box{std::vector<int64_t>(t.shape.size(), 0), t.shape}, 0, shape_numel(t.shape)};
    src.idx.tensors[name] = TensorIndex{t.shape, {pc}};
  }
  src.mem = std::move(im.tensors);
  return im.state;
}

std::string describe(int64_t it) {
  return it == kReleaseIteration ? "the release checkpoint" : fmt::format("iteration {}", it);
}

}  // namespace

TrainingState read_state(const std::string& load, int64_t it) {
  const fs::path dir = iteration_dir(load, it);
  std::error_code ec;
  if (!fs::exists(dir, ec))
    fail("--load: checkpoint directory '{}' is missing (the tracker points at {})", dir.string(), describe(it));
  if (!fs::is_directory(dir, ec)) fail("--load: '{}' is not a directory (the tracker points at it)", dir.string());
  if (is_megatron(dir)) return megatron::read_checkpoint(dir.string(), it, false).state;
  if (!fs::exists(dir / "metadata.json", ec))
    fail("--load: '{}' has no metadata.json: the save did not complete", dir.string());
  const fs::path path = dir / "state.json";
  return parse_state(parse_json_file(path, "--load"), path.string(), it);
}

namespace {

// The checkpoint's true vocabulary as its state.json records it (0: not recorded).
int64_t recorded_vocab(const TrainingState& st, const fs::path& dir) {
  if (!st.args.contains("orig_vocab_size")) return 0;
  return json_int(st.args["orig_vocab_size"], fmt::format("'{}': args.orig_vocab_size", (dir / "state.json").string()),
                  1, INT64_MAX);
}

}  // namespace

TrainingState load_checkpoint(const std::string& load, int64_t it, const RankInfo& ri, model::ParamStore& params,
                              OptimizerState* opt, const LoadOptions& opts) {
  const fs::path dir = iteration_dir(load, it);
  Source src;
  TrainingState st;
  if (is_megatron(dir)) {
    (void)read_state(load, it);  // the directory checks
    st = open_megatron(dir, it, src);
  } else {
    st = read_state(load, it);
    src.idx = read_index(dir, src.files);
    if (src.files->lists("state.json")) src.files->verify("state.json");
  }
  src.model_vocab = opts.orig_vocab_size;
  src.ckpt_vocab = recorded_vocab(st, dir);

  // Parameters on the GPU are filled through a host copy.
  const bool on_host = params.device() == Device::CPU;
  Tensor host = on_host ? params.main_buffer() : params.main_buffer().to_device(Device::CPU);
  for (auto& p : params.params())
    fill(src, p.name, p.full_shape, local_boxes(p), 0, p.numel(), host.data<float>() + p.offset);
  if (!on_host) params.main_buffer().copy_from(host);
  if (ri.pp == 1) {  // every model tensor is local: anything left over is another model shape
    size_t model_tensors = 0;
    std::string extra;
    for (const auto& [name, t] : src.idx.tensors) {
      if (name.find('/') != std::string::npos) continue;  // optimizer state
      // Under expert parallelism this rank holds only its share of the experts.
      if (ri.ep > 1 && name.find(".mlp.experts.local_experts.") != std::string::npos) continue;
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
    for (auto& a : opt->arrays) {
      // State on the GPU is filled through a host copy, as the parameters are.
      const bool host_state = a.value.device() == Device::CPU;
      Tensor host_value = host_state ? a.value : a.value.to_device(Device::CPU);
      for (auto& p : params.params()) {
        const int64_t x0 = std::max(a.lo, p.offset) - p.offset, x1 = std::min(a.hi, p.offset + p.numel()) - p.offset;
        if (x0 >= x1) continue;
        const std::string name = a.name + "/" + p.name;
        if (!src.idx.tensors.count(name) && src.idx.tensors.count(p.name))
          fail("checkpoint '{}' has no optimizer state '{}' for '{}' (saved with another --optimizer?); use "
               "--no-load-optim to start the optimizer afresh",
               dir.string(), a.name, p.name);
        fill(src, name, p.full_shape, local_boxes(p), x0, x1, host_value.data<float>() + (p.offset + x0 - a.lo));
      }
      if (!host_state) a.value.copy_from(host_value);
    }
    opt->steps = st.optimizer_steps;
  }

  // RNG: this rank's own streams when the layout is the one that saved; otherwise rank 0's
  // (stream offsets advance alike on every rank, the seeds come from --seed and the TP rank).
  st.has_tp_rng = false;
  const Metadata& md = src.idx;
  st.fp8 = md.fp8;
  if (opts.load_rng && !md.rng.empty()) {
    const bool same = md.tp == ri.tp && md.pp == ri.pp && md.dp == ri.dp;
    const RngEntry* pick = nullptr;
    for (const auto& r : md.rng)
      if (r.rank == (same ? ri.rank : 0)) pick = &r;
    if (pick) {
      st.has_rng = true;
      st.rng_seed = pick->seed;
      st.rng_offset = pick->offset;
      st.tp_rng_seed = pick->tp_seed;
      st.tp_rng_offset = pick->tp_offset;
      st.has_tp_rng = true;
    }
    if (!same)
      log_info("checkpoint saved with TP {} x PP {} x DP {}, loading as TP {} x PP {} x DP {}: resharded", md.tp,
               md.pp, md.dp, ri.tp, ri.pp, ri.dp);
  }
  return st;
}

TrainingState load_checkpoint(const std::string& load, int64_t it, model::ParamStore& params,
                              optim::Optimizer* optimizer, const LoadOptions& opts) {
  std::optional<OptimizerState> os;
  if (optimizer) os = optimizer_state(*optimizer, false);
  TrainingState st = load_checkpoint(load, it, RankInfo{}, params, os ? &*os : nullptr, opts);
  if (optimizer && opts.load_optim) optimizer->set_step_count(st.optimizer_steps);
  return st;
}

struct CheckpointReader::Impl : Source {};

CheckpointReader::CheckpointReader(const std::string& load, int64_t it) : impl_(std::make_unique<Impl>()) {
  state_ = read_state(load, it);
  if (is_megatron(iteration_dir(load, it))) {
    open_megatron(iteration_dir(load, it), it, *impl_);
    return;
  }
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
  fill(*impl_, name, s, {whole}, 0, whole.numel(), out.data());
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
  // Native, or Megatron-LM's torch_dist / torch (read alike).
  if (fs::exists(d / "latest_checkpointed_iteration.txt")) return CheckpointKind::Native;
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
  if (megatron::detect_format(dir) != megatron::Format::None)
    fail("--load '{}' is one iteration's directory of a Megatron-LM {} checkpoint; give its parent (the directory "
         "holding latest_checkpointed_iteration.txt)",
         dir, megatron::format_name(megatron::detect_format(dir)));
  return CheckpointKind::Empty;
}

}  // namespace mt::checkpoint
