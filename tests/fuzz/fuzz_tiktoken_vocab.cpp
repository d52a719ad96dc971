// libFuzzer target: loading a TikTokenizer vocabulary (Megatron's JSON list of {rank, token_bytes,
// token_str}) with 7 special tokens and a 267-id vocabulary (the 256 bytes and 4 merges), then
// encoding and decoding a short text with whatever it accepted.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/tokenizers/tiktoken_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_temp("vocab.json", data, size);
  try {
    mt::data::TikTokenOptions o;
    o.num_special_tokens = 7;
    o.vocab_size = 267;
    for (const char* pattern : {"v1", "v2"}) {
      o.pattern = pattern;
      mt::data::TikTokenizer tok(path, o);
      const auto ids = tok.encode("Hello wörld!  It's 2024: <s>x</s><pad>\n\ttabs \xF0\x9F\x98\x80 and \xFF bytes.<sep");
      (void)tok.decode(ids);
      (void)tok.decode({0, 6, 7, 266, -1, 1 << 30});
    }
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
