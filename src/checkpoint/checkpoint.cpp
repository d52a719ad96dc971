#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {
namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::trunc);
  if (!f) fail("cannot write '{}'", p.string());
  f << text;
  f.flush();
  if (!f) fail("writing '{}' failed (disk full?)", p.string());
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  if (!f) fail("cannot read '{}' (missing file: incomplete or foreign checkpoint?)", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

nlohmann::json parse_json(const fs::path& p) {
  try {
    return nlohmann::json::parse(read_text(p));
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is corrupt: {}", p.string(), e.what());
  }
}

}  // namespace

std::string iteration_dir(const std::string& save, int64_t iteration) {
  return (fs::path(save) / fmt::format("iter_{:07d}", iteration)).string();
}

void save_checkpoint(const std::string& save, const TrainingState& st, const model::ParamStore& params,
                     optim::Optimizer* optimizer) {
  std::error_code ec;
  fs::create_directories(save, ec);
  if (ec) fail("--save: cannot create directory '{}': {}", save, ec.message());
  const fs::path final_dir = iteration_dir(save, st.iteration);
  const fs::path tmp = final_dir.string() + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);

  nlohmann::json files = nlohmann::json::object();
  std::vector<TensorEntry> model;
  for (const auto& p : params.params())
    model.push_back({p.name, DType::F32, p.shape, p.main.raw(), p.main.nbytes()});
  files["model.safetensors"] = write_safetensors((tmp / "model.safetensors").string(), model);

  if (optimizer) {
    std::vector<TensorEntry> opt;
    for (auto& [name, vec] : optimizer->state()) {
      // Stored per parameter so that a later layout (sharded, resharded) can find each slice.
      for (const auto& p : params.params())
        opt.push_back({name + "/" + p.name, DType::F32, p.shape, vec->data() + p.offset,
                       static_cast<size_t>(p.numel()) * 4});
    }
    files["optimizer.safetensors"] = write_safetensors((tmp / "optimizer.safetensors").string(), opt);
  }
  nlohmann::json state = {{"iteration", st.iteration},
                          {"consumed_train_samples", st.consumed_train_samples},
                          {"consumed_valid_samples", st.consumed_valid_samples},
                          {"optimizer_steps", st.optimizer_steps},
                          {"has_optimizer", optimizer != nullptr},
                          {"has_rng", st.has_rng},
                          {"rng_seed", st.rng_seed},
                          {"rng_offset", st.rng_offset},
                          {"skipped_iterations", st.skipped_iterations},
                          {"nan_iterations", st.nan_iterations},
                          {"args", st.args}};
  write_text(tmp / "state.json", state.dump(2));
  files["state.json"] = crc32_file((tmp / "state.json").string());
  nlohmann::json meta = {{"format", "megatron.cpp-native"}, {"version", 1}, {"files", files}};
  write_text(tmp / "metadata.json", meta.dump(2));
  for (const auto& e : fs::directory_iterator(tmp)) fsync_path(e.path());
  fsync_path(tmp);

  // Replace an existing directory of the same iteration only after the new one is complete.
  if (fs::exists(final_dir)) {
    fs::path old = final_dir.string() + ".old." + std::to_string(::getpid());
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_path(save);
  const fs::path tracker = fs::path(save) / "latest_checkpointed_iteration.txt";
  const fs::path tracker_tmp = tracker.string() + ".tmp";
  write_text(tracker_tmp, std::to_string(st.iteration));
  fsync_path(tracker_tmp);
  fs::rename(tracker_tmp, tracker);
  fsync_path(save);
}

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
  nlohmann::json s = parse_json(dir / "state.json");
  TrainingState st;
  try {
    st.iteration = s.at("iteration");
    st.consumed_train_samples = s.at("consumed_train_samples");
    st.consumed_valid_samples = s.at("consumed_valid_samples");
    st.optimizer_steps = s.at("optimizer_steps");
    st.has_rng = s.at("has_rng");
    st.rng_seed = s.at("rng_seed");
    st.rng_offset = s.at("rng_offset");
    st.skipped_iterations = s.value("skipped_iterations", 0);
    st.nan_iterations = s.value("nan_iterations", 0);
    st.args = s.at("args");
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is missing a field: {}", (dir / "state.json").string(), e.what());
  }
  return st;
}

TrainingState load_checkpoint(const std::string& load, int64_t it, model::ParamStore& params,
                              optim::Optimizer* optimizer, const LoadOptions& opts) {
  const fs::path dir = iteration_dir(load, it);
  TrainingState st = read_state(load, it);
  nlohmann::json meta = parse_json(dir / "metadata.json");
  for (auto& [file, crc] : meta.at("files").items()) {
    if (file == "optimizer.safetensors" && !(optimizer && opts.load_optim)) continue;
    if (!fs::exists(dir / file)) fail("checkpoint file '{}' is missing", (dir / file).string());
    if (crc32_file((dir / file).string()) != crc.get<uint32_t>())
      fail("checkpoint file '{}' is corrupt (checksum mismatch)", (dir / file).string());
  }
  SafetensorsFile model((dir / "model.safetensors").string());
  for (auto& p : params.params()) model.read_f32(p.name, p.shape, p.main.data<float>());
  if (model.names().size() != params.params().size())
    fail("'{}' holds {} tensors but the model has {} (checkpoint of another model shape?)",
         (dir / "model.safetensors").string(), model.names().size(), params.params().size());
  params.sync_model_from_main();
  if (optimizer && opts.load_optim) {
    if (!fs::exists(dir / "optimizer.safetensors"))
      fail("'{}' has no optimizer state (saved with --no-save-optim); use --no-load-optim or --finetune", dir.string());
    SafetensorsFile opt((dir / "optimizer.safetensors").string());
    for (auto& [name, vec] : optimizer->state())
      for (auto& p : params.params()) opt.read_f32(name + "/" + p.name, p.shape, vec->data() + p.offset);
    optimizer->set_step_count(st.optimizer_steps);
  }
  return st;
}

}  // namespace mt::checkpoint
