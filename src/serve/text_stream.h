#pragma once
// Generated tokens to text, incrementally: what a stream may send so far, and where a stop
// string ends the completion. Text is held back while it ends in an incomplete UTF-8 character
// or in what could be the start of a stop string, so streamed pieces always join to the final
// text and never contain (part of) a stop string.
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::serve {

class TextStream {
 public:
  // `prompt` is the token ids before the generation; `empty_prompt` when its text is empty
  // (a document started with the end-of-document token only).
  TextStream(const data::Tokenizer& tok, std::vector<int32_t> prompt, bool empty_prompt, std::vector<std::string> stops);
  // Adds a generated token; returns the text that became final (maybe empty).
  std::string push(int32_t id);
  // At the end: what was held back (nothing after a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return emitted_; }  // everything returned so far
  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  std::string decoded() const;

  const data::Tokenizer& tok_;
  std::vector<int32_t> ids_;  // prompt + generated
  std::vector<int32_t> generated_;
  size_t prompt_len_;
  bool empty_prompt_;
  std::vector<std::string> stops_;
  std::string emitted_;
  bool stopped_ = false;
};

// Bytes at the end of `s` that begin a UTF-8 character not yet complete (0 to 3).
size_t incomplete_utf8_tail(const std::string& s);
// The longest k < |stop| such that `s` ends with the first k bytes of some stop string.
size_t stop_prefix_tail(const std::string& s, const std::vector<std::string>& stops);

}  // namespace mt::serve
