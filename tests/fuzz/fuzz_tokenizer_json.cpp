// libFuzzer target: loading a HuggingFace tokenizer.json (HfTokenizer) and encoding and
// decoding a short text with whatever it accepted. The file sits alone in its directory, so
// no tokenizer_config.json is read.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/tokenizers/hf_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_temp("tokenizer.json", data, size);
  try {
    mt::data::HfTokenizer tok(path);
    const auto ids = tok.encode("Hello wörld!  It's 2024: <s>x</s>\n\ttabs, ünïcödé \xF0\x9F\x98\x80 and \xFF bytes.");
    (void)tok.decode(ids);
    (void)tok.decode({0, 1, 2, -1, 1 << 30});
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
