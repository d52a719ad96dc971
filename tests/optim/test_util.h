#pragma once
// Shared helpers for the optim tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt::optim::testing {

// Expects fn to throw mt::Error whose message mentions `needle` (usually a flag name).
inline void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
    return;
  }
  ADD_FAILURE() << "expected an mt::Error mentioning '" << needle << "'";
}

// fp32 arithmetic against an fp64 reference: a few float ulps of the value's magnitude.
inline void expect_close(float actual, double expected, double rel = 2e-6) {
  EXPECT_NEAR(actual, expected, rel * std::max(1.0, std::abs(expected)));
}

// A CPU tensor [n] of the values (the optimizers step tensors on their device).
inline Tensor vec(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

}  // namespace mt::optim::testing
