// libFuzzer target: the value of --moe-layer-freq (a Python-like list expression parsed without
// eval). Whatever it accepts is an integer >= 1 or a pattern of at most kLayers entries, and the
// per-layer pattern built from it has the length asked for.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "training/moe_layer_freq.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mt::MoELayerFreq f;
  try {
    f = mt::parse_moe_layer_freq(text);
  } catch (const mt::Error&) {
    return 0;
  }
  if (f.pattern.empty() ? f.every < 1 : f.pattern.size() > static_cast<size_t>(mt::model::limits::kLayers))
    std::abort();
  const int64_t layers = f.pattern.empty() ? 7 : static_cast<int64_t>(f.pattern.size());
  const std::vector<bool> p = mt::moe_layer_pattern(f, layers);
  if (!p.empty() && static_cast<int64_t>(p.size()) != layers) std::abort();
  return 0;
}
