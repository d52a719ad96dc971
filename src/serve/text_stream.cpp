#include "serve/text_stream.h"

#include <algorithm>

#include "training/generation_model.h"

namespace mt::serve {

size_t incomplete_utf8_tail(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte; a lead byte announcing more
  // bytes than follow it starts an incomplete character.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;  // only continuation bytes: invalid, nothing to wait for
}

size_t stop_prefix_tail(const std::string& s, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops)
    for (size_t k = std::min(stop.size() - 1, s.size()); k > best; --k)
      if (s.compare(s.size() - k, k, stop, 0, k) == 0) {
        best = k;
        break;
      }
  return best;
}

TextStream::TextStream(const data::Tokenizer& tok, std::vector<int32_t> prompt, bool empty_prompt,
                       std::vector<std::string> stops)
    : tok_(tok), ids_(std::move(prompt)), prompt_len_(ids_.size()), empty_prompt_(empty_prompt), stops_(std::move(stops)) {}

std::string TextStream::decoded() const { return continuation(tok_, ids_, prompt_len_, empty_prompt_); }

std::string TextStream::push(int32_t id) {
  if (stopped_) return "";
  ids_.push_back(id);
  generated_.push_back(id);
  std::string full = decoded();
  // A tokenizer whose decoding changes earlier text as tokens arrive (rare): wait for the end.
  if (full.compare(0, emitted_.size(), emitted_) != 0) return "";
  // The earliest stop string that appears in the new text, or ends in it.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t from = emitted_.size() >= stop.size() ? emitted_.size() - stop.size() + 1 : 0;
    const size_t at = full.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    const std::string piece = cut > emitted_.size() ? full.substr(emitted_.size(), cut - emitted_.size()) : "";
    emitted_ += piece;
    return piece;
  }
  const size_t hold = std::max(incomplete_utf8_tail(full), stop_prefix_tail(full, stops_));
  if (full.size() - hold <= emitted_.size()) return "";
  std::string piece = full.substr(emitted_.size(), full.size() - hold - emitted_.size());
  emitted_ += piece;
  return piece;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  const std::string full = decoded();
  if (full.compare(0, emitted_.size(), emitted_) != 0) return "";  // see push()
  std::string piece = full.substr(emitted_.size());
  emitted_ += piece;
  return piece;
}

}  // namespace mt::serve
