#include "training/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "training/tfrecord.h"
#include "training/tb_event_codec.h"

namespace mt {
namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t queue_size) : queue_size_(queue_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    fail("--tensorboard-dir {}: cannot create the directory ({})", dir, ec ? ec.message() : "not a directory");
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const auto secs = static_cast<long long>(wall_now());
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.0", secs, host, ::getpid())).string();
  std::ofstream f(path_, std::ios::binary | std::ios::trunc);
  if (!f) fail("--tensorboard-dir {}: cannot create {}", dir, path_);
  tb::Event e;
  e.wall_time = wall_now();
  e.file_version = "brain.Event:2";  // what TensorBoard's writers put first
  append(tb::encode(e));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  tb::Event e;
  e.wall_time = wall_now();
  e.step = step;
  e.scalars.push_back({tag, static_cast<float>(value)});
  append(tb::encode(e));
}

EventFile read_event_file(const std::string& path) {
  require_regular_file(path, "event file");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("event file {}: cannot read it", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  const std::string what = "event file " + path;
  EventFile out;
  for (const std::string& rec : tfrecord::read_records(bytes, what)) {
    tb::Event e = tb::decode(rec, what);
    if (!e.file_version.empty()) out.file_version = e.file_version;
    for (auto& s : e.scalars) out.scalars.push_back({e.step, e.wall_time, std::move(s.tag), s.value});
  }
  return out;
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const std::exception&) {  // a full disk at exit loses the last events, not the run
  }
}

void TensorBoardWriter::append(const std::string& event_bytes) {
  queue_.push_back(tfrecord::frame(event_bytes));
  if (static_cast<int64_t>(queue_.size()) >= queue_size_) flush();
}

void TensorBoardWriter::flush() {
  if (queue_.empty() || path_.empty()) return;
  std::ofstream f(path_, std::ios::binary | std::ios::app);
  for (const auto& r : queue_) f.write(r.data(), static_cast<std::streamsize>(r.size()));
  f.flush();
  queue_.clear();
  if (!f) fail("--tensorboard-dir: cannot write {} (disk full?)", path_);
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename().string().find("tfevents") != std::string::npos)
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mt
