#include "core/log.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace mt {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
std::atomic<int> g_rank{0};
std::mutex g_mu;
std::atomic<bool> g_info_to_stderr{false};
}  // namespace

bool set_info_to_stderr(bool on) { return g_info_to_stderr.exchange(on); }

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_rank(int rank) { g_rank = rank; }

bool log_enabled(LogLevel level) {
  if (static_cast<int>(level) < g_level.load()) return false;
  if (g_rank.load() != 0 && level < LogLevel::Warn && !std::getenv("MT_LOG_ALL_RANKS")) return false;
  return true;
}

void log_write(LogLevel level, const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* out = level >= LogLevel::Warn || g_info_to_stderr.load() ? stderr : stdout;
  const char* tag = level == LogLevel::Warn ? "warning: " : level == LogLevel::Error ? "error: " : "";
  if (g_rank.load() != 0) std::fprintf(out, "[rank %d] ", g_rank.load());
  std::fprintf(out, "%s%s\n", tag, msg.c_str());
  std::fflush(out);
}

}  // namespace mt
