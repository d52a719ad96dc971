#pragma once
// The {"String": ...} / {"Regex": ...} patterns of HF Split, Replace and decoders: a literal or a
// regex, both answering "where are the matches" on valid UTF-8.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizers/hf_json.h"
#include "data/tokenizers/regex.h"

namespace mt::data::hf {

class Pattern {
 public:
  Pattern(const nlohmann::json& j, const Where& w);

  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    if (regex_) {
      regex_->for_each_match(text, fn);
      return;
    }
    if (literal_.empty()) return;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      fn(pos, pos + literal_.size());
    }
  }

  std::string replace_all(std::string_view text, std::string_view with) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

}  // namespace mt::data::hf
