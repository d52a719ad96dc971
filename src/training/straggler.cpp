#include "training/straggler.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace mt {

std::string format_straggler(const std::vector<double>& ms, int64_t count) {
  if (ms.empty()) return std::string();
  std::vector<size_t> order(ms.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Slowest first; equal times by rank, so the report does not depend on the sort.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
  const size_t n = std::min<size_t>(order.size(), static_cast<size_t>(std::max<int64_t>(count, 1)));
  const double hi = ms[order.front()], lo = ms[order.back()];
  auto list = [&](auto first, auto last) {
    std::string s;
    for (auto it = first; it != last; ++it) s += fmt::format("{}{} ({:.2f} ms)", s.empty() ? "" : ", ", *it, ms[*it]);
    return s;
  };
  return fmt::format(" straggler | MnRtt/Rnk: {:.2f}ms/{} | MxRtt/Rnk: {:.2f}ms/{} | spread: {:.1f}% | slowest: {} | "
                     "fastest: {} |",
                     lo, order.back(), hi, order.front(), lo > 0 ? 100.0 * (hi - lo) / lo : 0.0,
                     list(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n)),
                     list(order.rbegin(), order.rbegin() + static_cast<std::ptrdiff_t>(n)));
}

}  // namespace mt
