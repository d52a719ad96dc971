#include "training/memory_check.h"

#include <unistd.h>

#include <algorithm>

#include "core/checked.h"
#include "core/error.h"

namespace mt {

int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) * page;
}

void check_host_memory(const model::TransformerConfig& m, int64_t bytes_per_param, int64_t shards,
                       int64_t extra_bytes, const std::string& needs) {
  const int64_t params = m.num_parameters();
  const std::string what = "memory needed by the model";
  const int64_t bytes =
      checked_add(checked_mul(params / std::max<int64_t>(shards, 1), bytes_per_param, what), extra_bytes, what);
  const int64_t have = host_memory_bytes();
  if (have <= 0 || bytes <= have) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  fail("the model (--num-layers {}, --hidden-size {}, --ffn-hidden-size {}, --seq-length {}: {} parameters) needs at "
       "least {:.1f} GiB for {}, but this machine has {:.1f} GiB of memory; use a smaller model",
       m.num_layers, m.hidden_size, m.ffn_hidden_size, m.seq_length, params, static_cast<double>(bytes) / GiB, needs,
       static_cast<double>(have) / GiB);
}

}  // namespace mt
