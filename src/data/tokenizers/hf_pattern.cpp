#include "data/tokenizers/hf_pattern.h"

namespace mt::data::hf {

Pattern::Pattern(const nlohmann::json& j, const Where& w) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    literal_ = j["String"].get<std::string>();
  } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(j["Regex"].get<std::string>(), w.file + ": " + w.path);
  } else {
    bad(w, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

std::string Pattern::replace_all(std::string_view text, std::string_view with) const {
  std::string out;
  size_t last = 0;
  for_each_match(text, [&](size_t b, size_t e) {
    out.append(text.substr(last, b - last));
    out.append(with);
    last = e;
  });
  out.append(text.substr(last));
  return out;
}

}  // namespace mt::data::hf
