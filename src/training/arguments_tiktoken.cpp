// Pretrain's TikTokenizer flags (data/tokenizers/tiktoken_tokenizer.h). Megatron reads them only
// for --tokenizer-type TikTokenizer and ignores them with the other tokenizers; so does this.
#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_tiktoken_flags(FlagParser& p, data::TokenizerOptions& t) {
  p.value("--tiktoken-pattern", &t.tiktoken_pattern, "TikTokenizer's pre-tokenization pattern (default v2)",
          {"v1", "v2"});
  p.value("--tiktoken-num-special-tokens", &t.tiktoken_num_special_tokens,
          "TikTokenizer: ids below this are special tokens; the vocabulary's ranks start here (default 1000)",
          {1, int64_t{1} << 30});
  p.list("--tokenizer-special-tokens", &t.special_tokens,
         "TikTokenizer's special tokens, first ids (default <unk> <s> </s> <mask> <pad> <cls> <sep>)");
}

void validate_tiktoken_args(const Arguments& a) {
  // Megatron hands --tokenizer-special-tokens to other tokenizers too (HF's additional special
  // tokens); here only TikTokenizer reads it, so elsewhere it is refused rather than ignored.
  if (a.was_given("--tokenizer-special-tokens") && a.tokenizer.type != "TikTokenizer")
    fail("--tokenizer-special-tokens is read only by --tokenizer-type TikTokenizer here (got {}); drop it",
         a.tokenizer.type.empty() ? "none" : a.tokenizer.type);
}

}  // namespace mt
