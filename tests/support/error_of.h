#pragma once
// The message of the mt::Error a call throws: tests compare a refusal's exact wording.
#include <string>

#include "core/error.h"

namespace mt::test {

// "" when `f` throws nothing; other exceptions propagate (a test failure, not a refusal).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mt::test
