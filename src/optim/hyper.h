#pragma once
// Hyper-parameters arrive as float in OptimizerConfig, but Megatron/torch hold them as
// Python floats (doubles parsed from the command line) and derive per-step constants such
// as 1 - beta1^t in double. Widening 0.9f directly gives 0.89999997..., so we go through the
// shortest decimal that round-trips the float ("0.9") to recover the double the user meant.
#include <charconv>

namespace mt::optim {

inline double as_decimal(float x) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  if (ec != std::errc()) return static_cast<double>(x);
  double d = 0.0;
  auto res = std::from_chars(buf, end, d);
  if (res.ec != std::errc()) return static_cast<double>(x);
  return d;
}

}  // namespace mt::optim
