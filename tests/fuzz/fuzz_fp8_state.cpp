// libFuzzer target: the "fp8" object of a checkpoint's metadata.json (checkpoint/fp8_state.h),
// loaded into a store of two linears with amax histories of 2. Whatever it accepts must fill
// every history and scale with exactly the sizes the store has.
#include <cstdint>
#include <string>

#include "checkpoint/fp8_state.h"
#include "checkpoint/io_util.h"
#include "core/error.h"

namespace ck = mt::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  try {
    j = ck::parse_json_text(text, "fuzz.json");
  } catch (const mt::Error&) {
    return 0;
  }
  mt::model::Fp8Config c;
  c.enabled = true;
  c.amax_history_len = 2;
  mt::model::Fp8Store store(c);
  store.add("decoder.layers.0.mlp.linear_fc1");
  store.add("decoder.layers.0.mlp.linear_fc2");
  try {
    ck::fp8_state_from_json(store, j, "metadata.json");
  } catch (const mt::Error&) {
    return 0;
  }
  for (auto& l : store.linears())
    for (auto* s : {&l.input, &l.weight, &l.grad})
      if (s->history.numel() != 2 || s->scale.numel() != 1) __builtin_trap();
  return 0;
}
