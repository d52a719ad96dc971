// Maps Megatron's --tokenizer-type to an implementation and checks the flags each type needs.
#include <filesystem>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizers/gpt2_bpe_tokenizer.h"
#include "data/tokenizers/hf_tokenizer.h"
#include "data/tokenizers/null_tokenizer.h"
#include "data/tokenizers/sentencepiece_tokenizer.h"
#include "data/tokenizers/tiktoken_tokenizer.h"

namespace mt::data {

namespace {

constexpr const char* kValidTypes =
    "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
    "Llama2Tokenizer, TikTokenizer, NullTokenizer";

}  // namespace

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& opts) {
  if (opts.type == "NullTokenizer") {
    if (opts.vocab_size <= 0) {
      fail("--tokenizer-type NullTokenizer needs --vocab-size N (ids are 0..N-1, EOD is N)");
    }
    return std::make_unique<NullTokenizer>(opts.vocab_size);
  }
  if (opts.type == "GPT2BPETokenizer") {
    if (opts.vocab_file.empty() || opts.merge_file.empty()) {
      fail("--tokenizer-type GPT2BPETokenizer needs --vocab-file (encoder.json / gpt2-vocab.json) "
           "and --merge-file (vocab.bpe / gpt2-merges.txt)");
    }
    return std::make_unique<Gpt2BpeTokenizer>(opts.vocab_file, opts.merge_file);
  }
  if (opts.type == "HuggingFaceTokenizer") return std::make_unique<HfTokenizer>(opts.tokenizer_model);
  if (opts.type == "SentencePieceTokenizer") {
    return std::make_unique<SentencePieceTokenizer>(opts.tokenizer_model,
                                                    SentencePieceTokenizer::Flavor::Megatron);
  }
  if (opts.type == "GPTSentencePieceTokenizer") {
    return std::make_unique<SentencePieceTokenizer>(opts.tokenizer_model,
                                                    SentencePieceTokenizer::Flavor::Gpt);
  }
  if (opts.type == "Llama2Tokenizer") {
    return std::make_unique<SentencePieceTokenizer>(opts.tokenizer_model,
                                                    SentencePieceTokenizer::Flavor::Llama2);
  }
  if (opts.type == "TikTokenizer") {
    if (opts.tokenizer_model.empty())
      fail("--tokenizer-type TikTokenizer needs --tokenizer-model (Megatron's JSON vocabulary: a list of {{rank, "
           "token_bytes, token_str}})");
    TikTokenOptions t;
    if (!opts.tiktoken_pattern.empty()) t.pattern = opts.tiktoken_pattern;
    t.num_special_tokens = opts.tiktoken_num_special_tokens;
    t.special_tokens = opts.special_tokens;
    if (opts.vocab_size > 0) t.vocab_size = opts.vocab_size;
    return std::make_unique<TikTokenizer>(opts.tokenizer_model, t);
  }
  if (opts.type.empty()) fail("--tokenizer-type is required; valid types: {}", kValidTypes);
  fail("--tokenizer-type {} is not supported; valid types: {}", opts.type, kValidTypes);
}

}  // namespace mt::data
