#pragma once
// Minimal leveled logging to stderr/stdout. Rank-aware printing comes with the comm layer:
// set_log_rank() makes non-zero ranks quiet unless MT_LOG_ALL_RANKS is set.
#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace mt {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_rank(int rank);
// Commands whose stdout is data (inspect-data's JSON lines) send the informational lines to
// stderr too. Returns the previous setting.
bool set_info_to_stderr(bool on);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::Info)) log_write(LogLevel::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::Warn)) log_write(LogLevel::Warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::Debug)) log_write(LogLevel::Debug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt
