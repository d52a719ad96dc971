#include "core/memory_timeline.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace mt::memory_timeline {
namespace {

struct Event {
  double t_ms;
  int64_t iteration;
  Device device;
  int64_t bytes;
  size_t in_use;
};

struct State {
  std::mutex mu;
  std::atomic<bool> on{false};
  size_t max_events = 0;
  size_t dropped = 0;
  int64_t iteration = 0;
  std::chrono::steady_clock::time_point t0;
  std::vector<Event> events;
  std::unordered_map<const void*, std::pair<Device, size_t>> live;  // recorded allocations not yet freed
  size_t in_use[2] = {0, 0}, peak[2] = {0, 0};                       // [CPU, CUDA]
};

State& state() {
  // Never destroyed: tensors held by other statics are freed at exit, after any function-local
  // static made later would be gone, and their frees still come here.
  static State* s = new State;
  return *s;
}

int index(Device d) { return d == Device::CPU ? 0 : 1; }

void add(State& s, Device d, int64_t bytes) {
  const int i = index(d);
  s.in_use[i] = bytes >= 0 ? s.in_use[i] + static_cast<size_t>(bytes) : s.in_use[i] - static_cast<size_t>(-bytes);
  if (s.in_use[i] > s.peak[i]) s.peak[i] = s.in_use[i];
  if (s.events.size() >= s.max_events) {
    ++s.dropped;
    return;
  }
  const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.t0).count();
  s.events.push_back(Event{t, s.iteration, d, bytes, s.in_use[i]});
}

}  // namespace

void start(size_t max_events) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.events.clear();
  s.live.clear();
  s.max_events = max_events;
  s.dropped = 0;
  s.iteration = 0;
  s.in_use[0] = s.in_use[1] = s.peak[0] = s.peak[1] = 0;
  s.t0 = std::chrono::steady_clock::now();
  s.on.store(true, std::memory_order_release);
}

bool recording() { return state().on.load(std::memory_order_relaxed); }

void set_iteration(int64_t iteration) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.iteration = iteration;
}

void on_alloc(Device device, const void* ptr, size_t bytes) {
  State& s = state();
  if (!ptr || !s.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.on.load(std::memory_order_relaxed)) return;
  s.live[ptr] = {device, bytes};
  add(s, device, static_cast<int64_t>(bytes));
}

void on_free(Device device, const void* ptr) {
  State& s = state();
  if (!ptr || !s.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(ptr);
  if (it == s.live.end() || it->second.first != device) return;  // allocated before recording began
  const size_t bytes = it->second.second;
  s.live.erase(it);
  add(s, device, -static_cast<int64_t>(bytes));
}

size_t peak(Device device) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.peak[index(device)];
}

void stop_and_write(const std::string& path, const std::string& flag) {
  State& s = state();
  std::vector<Event> events;
  size_t dropped = 0, peaks[2] = {0, 0};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.on.store(false, std::memory_order_release);
    events.swap(s.events);
    s.live.clear();
    dropped = s.dropped;
    peaks[0] = s.peak[0];
    peaks[1] = s.peak[1];
  }
  std::string out;
  out.reserve(events.size() * 80 + 256);
  for (const Event& e : events)
    out += fmt::format("{{\"t_ms\": {:.3f}, \"iteration\": {}, \"device\": \"{}\", \"bytes\": {}, \"in_use\": {}}}\n",
                       e.t_ms, e.iteration, e.device == Device::CPU ? "cpu" : "cuda", e.bytes, e.in_use);
  out += fmt::format(
      "{{\"summary\": {{\"events\": {}, \"dropped\": {}, \"peak_in_use\": {{\"cpu\": {}, \"cuda\": {}}}}}}}\n",
      events.size(), dropped, peaks[0], peaks[1]);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("{}: cannot write the memory timeline to '{}'", flag, path);
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) fail("{}: writing the memory timeline to '{}' failed (disk full?)", flag, path);
}

}  // namespace mt::memory_timeline
