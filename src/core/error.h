#pragma once
// One error type for everything a user can cause. The CLI catches it at the top and prints
// its message on one line (no stack dump) with a non-zero exit code.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace mt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws mt::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt

// Internal invariant (a bug in megatron.cpp, not a user mistake).
#define MT_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      throw ::mt::Error(fmt::format("internal error at {}:{}: check '{}' failed. {}",   \
                                    __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__))); \
    }                                                                                    \
  } while (0)
