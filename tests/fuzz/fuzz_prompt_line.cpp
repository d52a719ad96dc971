// libFuzzer target: one line of `megatron generate --prompts-file` (JSONL). Whatever it accepts
// has the ranges the parser promises: non-negative token counts and top-k, finite temperature
// and top-p.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "training/generate_prompts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mt::PromptLine p;
  try {
    p = mt::parse_prompt_line(text, "fuzz:1");
  } catch (const mt::Error&) {
    return 0;
  }
  if ((p.max_new_tokens && *p.max_new_tokens < 0) || (p.top_k && *p.top_k < 0)) std::abort();
  if ((p.temperature && !std::isfinite(*p.temperature)) || (p.top_p && !std::isfinite(*p.top_p))) std::abort();
  return 0;
}
